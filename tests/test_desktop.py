"""`localinfer app` hands the browser its launch key without putting it where others read."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
import webbrowser
from pathlib import Path

import httpx
import pytest


@pytest.mark.slow
def test_the_launch_key_is_on_no_command_line_and_in_no_output(tmp_path):
    """It was in the browser's command line, which `ps` shows every user, and on stdout."""
    seen = tmp_path / "browser-argv"
    browser = tmp_path / "browser"
    browser.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {seen}\n")
    browser.chmod(0o755)
    (tmp_path / "Downloads").mkdir()  # where a snap or flatpak browser can read the file
    env = {**os.environ, "LOCALINFER_HOME": str(tmp_path / "home"), "BROWSER": str(browser),
           "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("LOCALINFER_API_KEY", None)
    app = subprocess.Popen([sys.executable, "-m", "localinfer", "app", "--ctx", "256"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = app.stdout.readline()
        deadline = time.monotonic() + 60
        while not seen.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        argv = seen.read_text().split()
        assert len(argv) == 1 and argv[0].startswith("file://") and "#key=" not in argv[0]
        assert "key=" not in first and re.search(r"http://127\.0\.0\.1:\d+", first), first
        launch = Path(argv[0].removeprefix("file://"))
        assert launch.parent == tmp_path / "Downloads" and not launch.name.startswith(".")
        assert stat.S_IMODE(launch.stat().st_mode) == 0o600  # this user's alone
        url, key = re.search(r'"(http://127\.0\.0\.1:\d+)/#key=([^"]+)"', launch.read_text()).groups()
        assert key not in argv[0] and key not in first
        assert httpx.get(f"{url}/localinfer/models", headers={"Authorization": f"Bearer {key}"},
                         timeout=30).status_code == 200
        assert httpx.get(f"{url}/localinfer/models", timeout=30).status_code == 401
    finally:
        app.terminate()
        rest = app.communicate(timeout=30)[0]
    assert app.returncode == 0, rest
    assert key not in rest and "key=" not in rest
    assert not launch.exists()  # gone with the app


@pytest.mark.parametrize("environ, platform, headless", [
    ({}, "linux", True),  # a server over ssh, a text console
    ({"DISPLAY": ":0"}, "linux", False),
    ({"WAYLAND_DISPLAY": "wayland-0"}, "linux", False),
    ({"BROWSER": "w3m"}, "linux", False),  # the user's own choice, even in a terminal
    ({}, "freebsd14", True),
    ({}, "darwin", False),
    ({}, "win32", False),
])
def test_no_display_means_no_browser(environ, platform, headless):
    from localinfer.desktop import _headless, _no_browser, _open_in_browser

    opened: list[str] = []
    launch = Path("/tmp/localinfer-app-x.html")
    assert _open_in_browser(launch, environ, platform, lambda u: opened.append(u) or True) \
        is not headless
    assert opened == ([] if headless else [launch.as_uri()])  # no console browser started
    assert _headless(environ, platform) is headless
    assert ("DISPLAY" in _no_browser(environ, platform)) is headless


def test_a_browser_that_does_not_open_is_no_browser():
    from localinfer.desktop import _open_in_browser

    def refuse(url):
        raise webbrowser.Error("could not locate runnable browser")
    launch = Path("/tmp/localinfer-app-x.html")
    assert not _open_in_browser(launch, {"DISPLAY": ":0"}, "linux", lambda u: False)
    assert not _open_in_browser(launch, {"DISPLAY": ":0"}, "linux", refuse)


def test_how_to_open_the_page_gives_the_key_to_a_terminal_only():
    from localinfer.desktop import _how_to_open

    url, key = "http://127.0.0.1:8123", "s3cret-Key_"
    launch = Path("/home/u/Downloads/localinfer-app-x.html")
    on_terminal = _how_to_open(url, f"{url}/#key={key}", launch, "no display", terminal=True)
    assert "no browser could be opened (no display)" in on_terminal
    assert f"\n    {url}/#key={key}\n" in on_terminal  # alone on its line, to copy
    assert "ssh -L 8123:127.0.0.1:8123" in on_terminal
    to_a_log = _how_to_open(url, f"{url}/#key={key}", launch, "no display", terminal=False)
    assert "no browser could be opened" in to_a_log and key not in to_a_log
    assert launch.as_uri() in to_a_log and "\n" not in to_a_log
    asked = _how_to_open(url, f"{url}/#key={key}", launch, None, terminal=False)
    assert asked.startswith(f"localinfer app: open {launch.as_uri()} ")  # --no-browser


@pytest.mark.slow
def test_with_no_display_the_terminal_is_told_how_to_open_the_page(tmp_path):
    """No DISPLAY, no BROWSER: no browser is started (not even a console one), and the
    terminal gets the address with its key, which opens the app."""
    import pty
    import select

    env = {**os.environ, "LOCALINFER_HOME": str(tmp_path / "home"), "HOME": str(tmp_path),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER", "LOCALINFER_API_KEY"):
        env.pop(name, None)
    leader, follower = pty.openpty()
    app = subprocess.Popen([sys.executable, "-m", "localinfer", "app", "--ctx", "256"], env=env,
                           stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 90
        while b"Ctrl-C" not in seen and time.monotonic() < deadline:
            if select.select([leader], [], [], 0.5)[0]:
                seen += os.read(leader, 65536)
        text = seen.decode(errors="replace")
        assert "no browser could be opened (no display" in text, text
        url, key = re.search(r"\n\s+(http://127\.0\.0\.1:\d+)/#key=(\S+)\r?\n", text).groups()
        assert httpx.get(f"{url}/localinfer/models", headers={"Authorization": f"Bearer {key}"},
                         timeout=30).status_code == 200
    finally:
        app.terminate()
        app.wait(timeout=30)
        os.close(leader)
    assert app.returncode == 0
