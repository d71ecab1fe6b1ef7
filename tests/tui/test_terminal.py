"""One end-to-end run in a real terminal: tmux starts `localinfer chat`, types, reads, quits."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None,
                                 reason="needs tmux (apt install tmux / brew install tmux)")]


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _screen(session: str) -> str:
    return _tmux("capture-pane", "-p", "-t", session)


def _wait_for(session: str, predicate, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        screen = _screen(session)
        if predicate(screen):
            return screen
        if time.monotonic() > deadline:
            raise AssertionError(f"the terminal never showed what was expected:\n{screen}")
        time.sleep(0.2)


def test_ask_read_the_answer_and_quit(_private_home):
    session = f"localinfer-{uuid.uuid4().hex[:8]}"
    done = _private_home / "exit-code"
    command = (f"{sys.executable} -m localinfer chat --ctx 512; echo $? > {done}")
    env = [f"LOCALINFER_HOME={_private_home}", "TERM=xterm-256color"]
    _tmux("new-session", "-d", "-s", session, "-x", "80", "-y", "24",
          *[a for e in env for a in ("-e", e)], command)
    try:
        _wait_for(session, lambda s: "smollm2:135m Q4_1 CPU" in s and "Message" in s)
        _tmux("send-keys", "-t", session, "-l", "What is the capital of France?")
        _tmux("send-keys", "-t", session, "Enter")
        # done when the numbers show under the reply as well as in the status bar
        screen = _wait_for(session, lambda s: s.count("generated") >= 2)
        assert "What is the capital of France?" in screen
        lines = screen.splitlines()
        question = next(i for i, l in enumerate(lines) if "capital of France?" in l)
        figures = next(i for i, l in enumerate(lines) if "generated" in l)
        answer = "\n".join(lines[question + 1:figures])
        assert answer.strip(" █\n"), screen  # some reply text between the two
        assert "ms" in lines[figures] and "tok/s" in lines[figures]
        _tmux("send-keys", "-t", session, "C-q")
        deadline = time.monotonic() + 20
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert done.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    db = _private_home / "chats.db"
    assert db.is_file()  # the conversation was saved
    import sqlite3
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT role, content FROM messages ORDER BY id").fetchall()
    assert rows[0] == ("user", "What is the capital of France?") and rows[1][0] == "assistant"
