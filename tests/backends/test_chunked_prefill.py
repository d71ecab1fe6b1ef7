"""Chunked prefill: a long prompt is read a chunk per step while other streams keep decoding."""

from __future__ import annotations

import math

import pytest

from localinfer.backends.base import LoadOptions, SamplingParams, TokenEvent
from localinfer.backends.llamacpp import LlamaCppBackend


@pytest.fixture(scope="module")
def chunked(smollm2_path):
    backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=1024, n_slots=2, prefill_chunk=16),
                              name="smollm2:135m")
    yield backend
    backend.close()


def test_running_stream_keeps_decoding_while_a_long_prompt_is_read(chunked):
    running = chunked.generate(chunked.tokenize("Count from one to one hundred: one, two,"),
                               SamplingParams(temperature=0, max_tokens=120))
    events = iter(running)
    assert isinstance(next(events), TokenEvent)  # it is generating
    long_prompt = chunked.tokenize("The history of the lighthouse. " * 40)
    steps_before = chunked.stats().steps
    reader = chunked.generate(long_prompt, SamplingParams(temperature=0, max_tokens=2))
    reader.text()
    for _ in events:
        pass
    chunks = math.ceil(len(long_prompt) / 16)
    assert chunked.stats().steps - steps_before >= chunks
    # every step that read a chunk of the long prompt also gave the running stream a token
    during = [t for t in running.stats.token_times
              if reader.stats.started_at <= t <= reader.stats.token_times[0]]
    assert len(during) >= chunks - 1


def test_chunking_does_not_change_greedy_output(chunked, smollm2_reference):
    """The prompt read 16 tokens a step gives the greedy reply to the whole prompt."""
    prompt = chunked.tokenize("Write two sentences about the sea. " * 8)
    generation = chunked.generate(prompt, SamplingParams(temperature=0, max_tokens=16))
    text = generation.text()
    assert len(prompt) > 3 * 16
    assert smollm2_reference.follows(prompt, text, generation.stats.finish_reason) > 8


def test_a_context_smaller_than_the_batch_reads_prompts_in_smaller_pieces(smollm2_path):
    """llama.cpp lowers n_batch to a small context; a bigger decode would abort the process."""
    with LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=64), name="smollm2:135m") as small:
        assert small.engine.n_batch <= small.native.n_batch() < 512
        prompt = small.tokenize("The history of the lighthouse. " * 20)
        assert small.native.n_batch() < len(prompt) < small.info.n_ctx
        text = small.generate(prompt, SamplingParams(temperature=0, max_tokens=4)).text()
        assert text
