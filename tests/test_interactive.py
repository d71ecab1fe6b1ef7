"""The interactive chat driven through a pseudo-terminal, as a person uses it."""

from __future__ import annotations

import signal
import sys

import pexpect
import pytest

pytestmark = pytest.mark.slow


def _ctrl_c_reaches_it() -> None:
    """In the child before its program starts: Ctrl-C back to its default. A suite started
    in the background of a script (`cmd &`) ignores SIGINT, and an ignored signal stays
    ignored across exec: Python then installs no KeyboardInterrupt and Ctrl-C does nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def chat():
    # one thread: this tests the terminal, and on a loaded 2-core machine llama.cpp's threads
    # can wait on each other for a minute (its spin barriers, oversubscribed)
    child = pexpect.spawn(sys.executable, ["-m", "localinfer", "run", "--temperature", "0",
                                           "--max-tokens", "60", "--threads", "1"],
                          encoding="utf-8", timeout=60, dimensions=(40, 200),
                          preexec_fn=_ctrl_c_reaches_it)
    child.expect("/bye to exit")
    child.expect(">>> ")
    yield child
    child.close(force=True)


def _ask(child, text: str) -> str:
    child.sendline(text)
    child.expect(r"TTFT \d+ ms[^\n]*tok/s")
    stats = child.after
    child.expect(">>> ")
    return stats


def test_two_turns_ctrl_c_and_bye(chat):
    first = _ask(chat, "What is the capital of France?")
    assert "cached)" not in first  # a fresh process has nothing cached yet
    second = _ask(chat, "And of Italy?")
    assert "cached)" in second  # the first turn's tokens were reused

    chat.sendline("Write a very long story about a dragon who learns to sing.")
    chat.expect(r"sing\.\r\n")  # our own line echoed back
    chat.expect(r"\w+ \w+ \w+")  # the reply has started streaming
    chat.sendintr()
    chat.expect(r"\[stopped\]")
    chat.expect(r"finish: cancelled")
    chat.expect(">>> ")

    third = _ask(chat, "Thanks!")  # still chatting after the interruption
    assert "tok/s" in third

    chat.sendline("/bye")
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0


def test_a_runner_that_dies_mid_reply_is_one_line_and_the_chat_goes_on(chat):
    import signal

    import psutil

    (runner,) = psutil.Process(chat.pid).children()
    chat.sendline("Write a very long story about a dragon who learns to sing.")
    chat.expect(r"sing\.\r\n")
    chat.expect(r"\w+ \w+ \w+")  # the reply has started streaming
    runner.send_signal(signal.SIGKILL)
    chat.expect(r"Error: the runner of smollm2:135m ended \(killed by SIGKILL\) — send the "
                r"request again to reload it")
    chat.expect(">>> ")
    assert "Traceback" not in chat.before
    assert "tok/s" in _ask(chat, "Hello!")  # a new runner answers
    (again,) = psutil.Process(chat.pid).children()
    assert again.pid != runner.pid


def test_ctrl_c_at_prompt_hints_and_ctrl_d_exits(chat):
    chat.sendintr()
    chat.expect("Use Ctrl-D or /bye to exit.")
    chat.expect(">>> ")
    chat.sendeof()
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0


def test_a_chat_that_outgrows_the_context_leaves_out_its_oldest_turns():
    """A 256-token context fills within a few turns: every later turn still gets a reply,
    the system prompt stays, and the chat says what it left out."""
    child = pexpect.spawn(sys.executable, ["-m", "localinfer", "run", "--temperature", "0",
                                           "--max-tokens", "40", "--threads", "1", "--ctx",
                                           "256", "--system", "Answer in English."],
                          encoding="utf-8", timeout=60, dimensions=(40, 200),
                          preexec_fn=_ctrl_c_reaches_it)
    try:
        child.expect(">>> ")
        notices = 0
        for turn in range(6):
            child.sendline(f"Tell me a fact about the number {turn + 10}, please.")
            i = child.expect([r"left out", r"TTFT \d+ ms"])
            if i == 0:
                notices += 1
                child.expect(r"TTFT \d+ ms")
            child.expect(">>> ")
            assert "Error" not in child.before
        assert notices >= 1
    finally:
        child.close(force=True)
