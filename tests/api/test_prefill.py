"""A reply that goes on from the assistant's start, as Anthropic and Ollama continue a last
assistant message (and llama-server a `prefix`): the prompt is the turns before it with the
assistant's turn opened and its text after, and the reply is only what follows, its
leading space kept."""

from __future__ import annotations

import anthropic
import ollama
import openai
import pytest

from localinfer.chat_formats.detect import detect
from localinfer.chat_formats.parser import parser

ASK = {"role": "user", "content": "What is the capital of France?"}
START = "The capital of France is"


@pytest.fixture(scope="module")
def prefilled(smollm2) -> int:
    """The tokens of the prompt with the reply's start in it, by the model's own template."""
    return len(smollm2.tokenize(smollm2.apply_chat_template([ASK], True) + START))


@pytest.fixture(scope="module")
def fresh(smollm2) -> int:
    """The tokens of the prompt with the assistant's message closed and a new turn opened."""
    return len(smollm2.prompt_tokens([ASK, {"role": "assistant", "content": START}]))


def test_anthropic_continues_a_last_assistant_message(server, prefilled, fresh):
    assert prefilled < fresh  # (the two prompts differ: the test tells them apart)
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    turns = [ASK, {"role": "assistant", "content": START}]
    reply = client.messages.create(model="smollm2:135m", max_tokens=4, messages=turns,
                                   extra_body={"temperature": 0})
    assert reply.usage.input_tokens == prefilled
    assert client.messages.count_tokens(model="smollm2:135m",
                                        messages=turns).input_tokens == prefilled
    with client.messages.stream(model="smollm2:135m", max_tokens=4, messages=turns,
                                extra_body={"temperature": 0}) as events:
        assert events.get_final_message().usage.input_tokens == prefilled


def test_ollama_continues_a_last_assistant_message(server, prefilled):
    client = ollama.Client(host=server.url)
    reply = client.chat(model="smollm2:135m", options={"temperature": 0, "num_predict": 4},
                        messages=[ASK, {"role": "assistant", "content": START}])
    assert reply.prompt_eval_count == prefilled


def test_openai_continues_only_a_prefix(server, prefilled, fresh):
    """OpenAI answers a last assistant message with a new one; Mistral's and DeepSeek's
    `prefix: true` (llama-server's prefill) goes on from it."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    turn = {"role": "assistant", "content": START}
    new = client.chat.completions.create(model="smollm2:135m", messages=[ASK, turn],
                                         max_tokens=2, temperature=0)
    assert new.usage.prompt_tokens == fresh
    going_on = client.chat.completions.create(model="smollm2:135m", max_tokens=2,
                                              messages=[ASK, {**turn, "prefix": True}],
                                              temperature=0)
    assert going_on.usage.prompt_tokens == prefilled


def test_a_continued_reply_keeps_its_leading_space(smollm2):
    """A reply's leading whitespace is dropped ("\\nHello"); a continued one's is the space
    between the prefix's last word and its next."""
    fmt = detect(smollm2.info.chat_template)
    continued = parser(fmt, None, continued=True)
    text = "".join(p.text for p in continued.feed(" Paris.") + continued.close())
    assert text == " Paris."
    fresh = parser(fmt, None)
    assert "".join(p.text for p in fresh.feed(" Paris.") + fresh.close()) == "Paris."
