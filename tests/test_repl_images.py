"""Pictures at the terminal: `run MODEL --image PATH` and `/image PATH` in the chat, on Gemma 3
270M with a random-weight Gemma 3 projector (every picture is 64 image tokens), installed as
a pulled model. The answers are noise; what is tested is that a picture reaches the prompt
as its tokens, stays in the conversation (cached on the next turn), and that a bad path, a
file that is not a picture, or a text model is one line, the chat going on."""

from __future__ import annotations

import re
import subprocess
import sys

import pexpect
import pytest
from PIL import Image

from .families import install, projector

pytestmark = pytest.mark.slow

IMAGE_TOKENS = 64
PROMPT = re.compile(r"prompt (\d+) tok(?: \((\d+) cached\))?")


@pytest.fixture
def vision(_private_home, gemma3_path, tmp_path):
    name = install(_private_home, gemma3_path, "gemma3-vision", projector(gemma3_path,
                                                                         IMAGE_TOKENS))
    picture = tmp_path / "red square.png"  # (a space: the chat's /image takes quotes)
    Image.new("RGB", (320, 240), (200, 30, 30)).save(picture)
    return name, picture


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localinfer", "run", "--temperature", "0",
                           "--max-tokens", "3", "--threads", "1", *args],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def _prompt_tokens(stats: str) -> tuple[int, int]:
    found = PROMPT.search(stats)
    assert found, stats
    return int(found.group(1)), int(found.group(2) or 0)


def test_run_with_an_image_puts_its_tokens_in_the_prompt(vision):
    name, picture = vision
    plain = _run(name, "-p", "What is this?")
    seen = _run(name, "--image", str(picture), "-p", "What is this?")
    assert plain.returncode == seen.returncode == 0, plain.stderr[-500:] + seen.stderr[-500:]
    # the picture's tokens, and its wrap (<start_of_image> … <end_of_image>)
    assert _prompt_tokens(seen.stderr)[0] >= _prompt_tokens(plain.stderr)[0] + IMAGE_TOKENS
    assert "clip_model_loader" not in seen.stderr  # libmtmd's log goes to ours (-v shows it)


@pytest.mark.parametrize("case", ["missing", "not a picture", "text model"])
def test_run_refuses_a_bad_image_in_one_line(vision, tmp_path, case):
    name, picture = vision
    if case == "missing":
        args, said = [name, "--image", str(tmp_path / "gone.png")], "no file at"
    elif case == "not a picture":
        text = tmp_path / "notes.png"
        text.write_text("not a picture at all")
        args, said = [name, "--image", str(text)], "not a picture"
    else:
        args, said = ["smollm2:135m", "--image", str(picture)], "takes no images"
    done = _run(*args, "-p", "What is this?")
    assert done.returncode == 1
    assert said in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_image_in_the_chat_goes_with_the_next_message_and_stays(vision, tmp_path):
    name, picture = vision
    child = pexpect.spawn(sys.executable, ["-m", "localinfer", "run", name, "--temperature",
                                           "0", "--max-tokens", "3", "--threads", "1"],
                          encoding="utf-8", timeout=90, dimensions=(40, 200))
    try:
        child.expect(">>> ")
        child.sendline(f"/image {tmp_path / 'gone.png'}")
        child.expect("no file at")
        child.expect(">>> ")
        child.sendline(f'/image "{picture}"')
        child.expect(r"Attached .*\(320×240\)")
        child.expect(">>> ")
        child.sendline("What is this?")
        child.expect(r"TTFT \d+ ms[^\n]*tok/s")
        first = _prompt_tokens(child.after)
        child.expect(">>> ")
        child.sendline("And now?")  # no picture this turn: the first one stays in the history
        child.expect(r"TTFT \d+ ms[^\n]*tok/s")
        second = _prompt_tokens(child.after)
        child.expect(">>> ")
    finally:
        child.close(force=True)
    assert first[0] >= IMAGE_TOKENS + 4
    assert second[0] > first[0] and second[1] >= IMAGE_TOKENS  # the picture read once
