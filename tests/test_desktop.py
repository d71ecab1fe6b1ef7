"""`localinfer app` hands the browser its launch key without putting it where others read."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
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
