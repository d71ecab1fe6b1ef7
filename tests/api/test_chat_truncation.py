"""A chat past the context loses its oldest messages, as Ollama's /api/chat cuts one
(api/core._drop_oldest): on the real smollm2, its prompt read back as text."""

from __future__ import annotations

import pytest

from localinfer.api.core import _start
from localinfer.backends.base import SamplingParams
from localinfer.errors import PromptTooLong

SYSTEM = "You are terse. The password is TULIP."
FILLER = "filler words to take up room in the context " * 6


def _chat(turns: int) -> list[dict]:
    chat = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        chat.append({"role": "user", "content": f"Message {i}: {FILLER}"})
        chat.append({"role": "assistant", "content": f"Noted {i}."})
    chat.append({"role": "user", "content": "What is the password?"})
    return chat


def _prompt(backend, chat: list[dict], truncate: bool = True) -> str:
    tokens, generation, _ = _start(backend, SamplingParams(max_tokens=1), chat, None, None,
                                   None, None, None, (), truncate)
    generation.cancel()
    assert len(tokens) < backend.info.n_ctx
    return backend.detokenize(tokens)


def test_the_oldest_messages_go_and_the_system_and_last_stay(smollm2):
    n_ctx = smollm2.info.n_ctx
    chat = _chat(30)
    with pytest.raises(PromptTooLong):  # (whole, it is past the context)
        _prompt(smollm2, chat, truncate=False)
    text = _prompt(smollm2, chat)
    assert SYSTEM in text and "What is the password?" in text
    assert "Message 0:" not in text and "Message 29:" in text
    kept = [i for i in range(30) if f"Message {i}:" in text]
    assert kept == list(range(kept[0], 30))  # the newest, with none skipped
    # as many as fit: one message more would not
    one_more = [chat[0], *chat[1 + 2 * (kept[0] - 1):]]
    assert len(smollm2.prompt_tokens(one_more)) >= n_ctx


def test_a_tools_result_stays_with_the_call_that_asked_for_it(smollm2):
    """The call is too long to keep and its result short: dropping the call alone would
    fit, but leaves a result no call asked for. Both go."""
    chat = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Look it up."},
            {"role": "assistant", "content": "Looking up the call. " + FILLER * 24,
             "tool_calls": [{"type": "function", "function": {"name": "lookup",
                                                              "arguments": {"q": "x"}}}]},
            {"role": "tool", "content": "the result is 42", "name": "lookup"},
            {"role": "user", "content": "What is the password?"}]
    text = _prompt(smollm2, chat)
    assert "the result is 42" not in text and "Looking up the call" not in text
    assert SYSTEM in text and "What is the password?" in text
    # with a call that fits, both stay
    chat[2] = {**chat[2], "content": "Looking up the call."}
    text = _prompt(smollm2, chat)
    assert "the result is 42" in text and "Looking up the call" in text


def test_a_last_message_past_the_context_alone_is_refused(smollm2):
    chat = _chat(3) + [{"role": "user", "content": FILLER * 20}]
    with pytest.raises(PromptTooLong):
        _prompt(smollm2, chat)


def test_the_tries_are_few_and_none_holds_more_than_could_fit():
    """100,000 messages: a count of each cut would tokenize for minutes. Only cuts whose
    bytes could fit are tried, in halves."""
    from localinfer.chat_formats.prompt import newest_that_fit

    chat = [{"role": "system", "content": "s"}] + [
        {"role": "user" if i % 2 else "assistant", "content": "x" * 100} for i in range(100_000)]
    tried = []

    def fits(at: list[int]) -> bool:
        tried.append(len(at))
        return len(at) <= 1 + 37  # (the system message and the newest 37)

    at = newest_that_fit(chat, fits, [len(m["content"]) for m in chat], most=100 * 60)
    assert at == [0, *range(len(chat) - 37, len(chat))]
    assert len(tried) <= 8 and max(tried) <= 61
