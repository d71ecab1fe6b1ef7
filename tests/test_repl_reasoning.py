"""`run` with a thinking model: its reasoning dimmed apart from its answer in a terminal, left
out of a pipe unless asked for, counted apart in the stats line, and kept in the history for
the template to use. The model is a random-weight Qwen 3 / DeepSeek-R1 (tests/families.py);
a grammar makes it write the text a test needs."""

from __future__ import annotations

import io
import json

import pytest

from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.repl import stream_reply

from .families import family_model

ASK = [{"role": "user", "content": "Hi"}]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def qwen3():
    backend = LlamaCppBackend(family_model("Qwen-Qwen3-0.6B"), LoadOptions(n_ctx=512),
                              name="qwen3-tiny")
    yield backend
    backend.close()


def _saying(text: str) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=200, grammar=f"root ::= {json.dumps(text)}")


SAID = "<think>\nFirst, the plan.\n</think>\n\nThe answer."


def test_a_terminal_shows_the_reasoning_dimmed_then_the_answer(qwen3):
    out = _Terminal()
    reply = stream_reply(qwen3, ASK, _saying(SAID), out)
    assert out.getvalue() == "\x1b[2mFirst, the plan.\x1b[22m\n\nThe answer."
    assert (reply.text, reply.reasoning) == ("The answer.", "First, the plan.")
    assert 3 <= reply.reasoning_tokens < reply.stats.generated_tokens
    assert f"({reply.reasoning_tokens} reasoning)" in reply.summary()
    assert reply.message() == {"role": "assistant", "content": "The answer.",
                               "reasoning_content": "First, the plan."}


def test_a_pipe_gets_the_answer_alone_unless_thinking_is_asked_for(qwen3):
    piped = io.StringIO()
    stream_reply(qwen3, ASK, _saying(SAID), piped)
    assert piped.getvalue() == "The answer."
    asked = io.StringIO()
    stream_reply(qwen3, ASK, _saying(SAID), asked, think=True)
    assert asked.getvalue() == "First, the plan.\n\nThe answer."
    hidden = _Terminal()
    stream_reply(qwen3, ASK, _saying(SAID), hidden, think=False)
    assert hidden.getvalue() == "The answer."


def test_no_think_tells_the_template(qwen3):
    on = qwen3.apply_chat_template(ASK, True, {"enable_thinking": True})
    off = qwen3.apply_chat_template(ASK, True, {"enable_thinking": False})
    assert off.endswith("<think>\n\n</think>\n\n") and not on.endswith("</think>\n\n")


def test_a_template_that_opens_the_block_starts_the_reply_inside_it():
    backend = LlamaCppBackend(family_model("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"),
                              LoadOptions(n_ctx=512), name="r1-tiny")
    with backend:
        reply = stream_reply(backend, ASK, _saying("A plan.\n</think>\n\nDone."), io.StringIO())
    assert (reply.reasoning, reply.text) == ("A plan.", "Done.")
