"""`localinfer app`: the web chat app in a window of its own, on a server inside this process.

The server listens on a free loopback port with an API key made for this launch, so no other
page or program on the machine can drive it; the page gets the key in the URL's fragment.
A native window (pywebview, `pip install "localinfer[desktop]"`) where one can open, else
the system browser.
"""

from __future__ import annotations

import secrets
import signal
import sys
import time
import webbrowser

from localinfer.backends.base import LoadOptions
from localinfer.settings import ServeSettings

__all__ = ["run_app"]


def run_app(model: str | None, options: LoadOptions, open_window: bool = True,
            verbose: bool = False) -> None:
    from localinfer.api.server import serve_in_thread

    signal.signal(signal.SIGTERM, _interrupt)  # stopped by the system: as Ctrl-C, cleanly
    key = secrets.token_urlsafe(24)
    settings = ServeSettings(host="127.0.0.1", port=0, api_key=key, parallel=options.n_slots)
    url, server, thread = serve_in_thread(settings, options, model, verbose)
    page = f"{url}/#key={key}"
    print(f"localinfer app: {page}", flush=True)
    try:
        if not open_window or not _in_window(page):
            if open_window:
                webbrowser.open(page)
            print("Ctrl-C stops the app.", file=sys.stderr, flush=True)
            while thread.is_alive():
                time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.handle_exit(0, None)  # streams end with their last chunk, as serve does
        thread.join(timeout=10)


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
