"""`localinfer app`: the web chat app in a window of its own, on a server inside this process.

The server listens on a free loopback port with an API key made for this launch, so no other
page or program on the machine can drive it; the page gets the key in the URL's fragment.
A native window (pywebview, `pip install "localinfer[desktop]"`) where one can open, else
the system browser. The key never goes on a command line, which every user of the machine
can read (`ps`): the browser is given a page of its own, a file only this user can read,
that forwards to the app with the key; it is deleted a minute later and when the app ends.
The file is written to the Downloads folder: browsers confined as snaps (Ubuntu's default)
or flatpaks see neither the system's /tmp nor hidden folders, but they can read that one.

Where no browser can be opened — no display on Linux (webbrowser would run a console browser,
lynx or w3m, in this terminal), or none the system knows — or with --no-browser, the app says
how to open the page. On a terminal it prints the address with the key in its fragment: the
user needs it to open the page from another machine (through `ssh -L`), the fragment is never
sent in a request (so no access log holds it), and only the terminal sees it. Where stdout is
not a terminal (a pipe, a file, a service's journal, which others may read) it names the file
instead; the file stays until the app ends.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
import webbrowser
from pathlib import Path

import platformdirs

from localinfer.backends.base import LoadOptions
from localinfer.settings import Settings

__all__ = ["run_app"]


def run_app(settings: Settings, model: str | None, options: LoadOptions,
            open_window: bool = True, verbose: bool = False) -> None:
    from localinfer.api.server import serve_in_thread

    signal.signal(signal.SIGTERM, _interrupt)  # stopped by the system: as Ctrl-C, cleanly
    key = secrets.token_urlsafe(24)
    settings = settings.model_copy(update={"host": "127.0.0.1", "port": 0, "api_key": key,
                                           "parallel": options.n_slots})
    url, server, thread = serve_in_thread(settings, options, model, verbose)
    page = f"{url}/#key={key}"
    launch = _launch_page(page)
    forget = threading.Timer(60, launch.unlink, kwargs={"missing_ok": True})
    try:
        if not open_window or not _in_window(page):
            if open_window and _open_in_browser(launch):
                print(f"localinfer app: {url} (opening it in the browser)", flush=True)
                forget.start()  # the browser has read it by then
            else:
                why = _no_browser() if open_window else None
                print(_how_to_open(url, page, launch, why, sys.stdout.isatty()), flush=True)
            print("Ctrl-C stops the app.", file=sys.stderr, flush=True)
            while thread.is_alive():
                time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        forget.cancel()
        launch.unlink(missing_ok=True)
        server.handle_exit(0, None)  # streams end with their last chunk, as serve does
        thread.join(timeout=10)


def _launch_page(page: str) -> Path:
    """A page that forwards to `page`, in a file that only this user can read (mkstemp),
    where a confined browser can read it too (see the module's docstring)."""
    downloads = Path(platformdirs.user_downloads_dir())
    folder = downloads if downloads.is_dir() and os.access(downloads, os.W_OK) else None
    fd, name = tempfile.mkstemp(prefix="localinfer-app-", suffix=".html", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write('<!doctype html><meta charset="utf-8"><title>localinfer</title>'
                f"<script>location.replace({json.dumps(page)})</script>")
    return Path(name)


def _no_browser(environ=os.environ, platform: str = sys.platform) -> str:
    """Why no browser could be opened, in a few words."""
    if _headless(environ, platform):
        return "no display: neither DISPLAY nor WAYLAND_DISPLAY is set"
    return "the system has none to open it with"


def _headless(environ=os.environ, platform: str = sys.platform) -> bool:
    """A Linux or BSD session without a display, and no browser of the user's own (BROWSER)."""
    return (platform not in ("darwin", "win32") and not environ.get("BROWSER")
            and not (environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY")))


def _open_in_browser(launch: Path, environ=os.environ, platform: str = sys.platform,
                     open_url=webbrowser.open) -> bool:
    """Hand the launch page to the system's browser; False where none could be opened."""
    if _headless(environ, platform):
        return False  # webbrowser would run lynx or w3m in this terminal, or find nothing
    try:
        return bool(open_url(launch.as_uri()))
    except webbrowser.Error:
        return False


def _how_to_open(url: str, page: str, launch: Path, why: str | None, terminal: bool) -> str:
    """What to tell the user where no browser was opened (`why`; None: --no-browser asked
    for none): on a terminal the address with its key, else the file (module docstring)."""
    said = f"localinfer app: no browser could be opened ({why}) — " if why else \
        "localinfer app: "
    if not terminal:
        return (f"{said}open {launch.as_uri()} (it forwards to {url} with this launch's key; "
                "only you can read it)")
    port = url.rsplit(":", 1)[1]
    return (f"{said}open this address in a browser on this machine, or on another through "
            f"`ssh -L {port}:127.0.0.1:{port} <this machine>`:\n\n    {page}\n\n"
            "What follows #key= lets a page use the app until it stops: it is shown on this "
            "terminal only, not logged — keep it to yourself.")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _in_window(page: str) -> bool:
    """Show the page in a native window until it is closed; False where none can open."""
    try:
        import webview  # pywebview: optional
    except ImportError:
        return False
    try:
        if hasattr(webview, "settings"):  # pywebview 5: Export saves a file, as in a browser
            webview.settings["ALLOW_DOWNLOADS"] = True
        window = webview.create_window("localinfer", page, width=1100, height=760)
        # stopped by the system or Ctrl-C: close the window, so start() returns and the
        # server shuts down (an exception raised inside the toolkit's loop would not end it)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: window.destroy())
        webview.start()
    except Exception:  # no GUI toolkit on this machine: the browser will do
        return False
    return True
