"""A request that sets no limit gets the server's reply cap (LOCALINFER_MAX_TOKENS); one that
sets a limit, or asks for none (Ollama's num_predict -1), gets what it asked for."""

from __future__ import annotations

import ollama
import openai
import pytest

from .conftest import NO_END, start_server, stop_server

CAP = 5
STORY = "Write a long story about a lighthouse keeper and the sea."
COUNTING = "1, 2, 3, 4, 5, 6,"  # raw: the model counts on, far from any end token


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("capped"), "--model", "smollm2:135m",
                          "--parallel", "1", "--ctx", "256",
                          env={"LOCALINFER_MAX_TOKENS": str(CAP)})
    yield server
    stop_server(server)


def test_openai_requests_without_max_tokens_get_the_cap(capped):
    client = openai.OpenAI(base_url=capped.url + "/v1", api_key="x")
    messages = [{"role": "user", "content": STORY}]
    reply = client.chat.completions.create(model="smollm2:135m", messages=messages,
                                           temperature=0, logit_bias=NO_END)
    assert reply.usage.completion_tokens == CAP and reply.choices[0].finish_reason == "length"
    reply = client.chat.completions.create(model="smollm2:135m", messages=messages,
                                           temperature=0, max_tokens=CAP + 4,
                                           logit_bias=NO_END)
    assert reply.usage.completion_tokens == CAP + 4


def test_ollama_requests_without_num_predict_get_the_cap(capped, smollm2, smollm2_reference):
    client = ollama.Client(host=capped.url)
    greedy = {"temperature": 0, "repeat_penalty": 1.0}  # plain greedy, as the reference decodes
    reply = client.generate(model="smollm2:135m", prompt=COUNTING, raw=True, options=greedy)
    assert reply.eval_count == CAP and reply.done_reason == "length"
    # Ollama has no logit bias: the count holds because no end token is near any step
    assert smollm2_reference.follows(smollm2.tokenize(COUNTING), reply.response, "length",
                                     sure_length=True) == CAP
    # -1: no limit; the reply runs until it ends or the context (256) is full
    reply = client.generate(model="smollm2:135m", prompt=COUNTING, raw=True,
                            options={**greedy, "num_predict": -1})
    assert reply.eval_count > CAP
