"""A full context either ends the reply with "length" or, when asked, drops its older half."""

from __future__ import annotations

import pytest

from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.llamacpp import LlamaCppBackend

from ..greedy import eog_ban


@pytest.fixture(scope="module")
def small(smollm2_path):
    with LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=256), name="smollm2:135m") as backend:
        yield backend


def _long_reply(backend, shift: bool, n_keep: int = 0, max_tokens: int = 500):
    prompt = backend.tokenize("List the numbers from one to one thousand: one, two, three,")
    bias = eog_ban(backend.native)  # never stop on its own
    generation = backend.generate(prompt, SamplingParams(
        temperature=0, max_tokens=max_tokens, logit_bias=bias, context_shift=shift,
        n_keep=n_keep))
    text = generation.text()
    return prompt, generation.stats, text


def test_without_shifting_a_full_context_ends_with_length(small):
    prompt, stats, _ = _long_reply(small, shift=False)
    assert stats.finish_reason == "length" and stats.context_shifts == 0
    # every cell used: the last token sampled needs none, it is never fed back
    assert len(prompt) + stats.generated_tokens - 1 == small.info.n_ctx


def test_shifting_goes_past_the_context_and_keeps_the_start(small):
    n_ctx = small.info.n_ctx
    prompt, stats, text = _long_reply(small, shift=True, n_keep=6, max_tokens=2 * n_ctx)
    assert stats.generated_tokens == 2 * n_ctx and stats.finish_reason == "length"
    assert stats.context_shifts >= 2
    assert text.strip()
    slot = small.engine.slots[0]
    assert len(slot.cache) < n_ctx
    kept = 6 + (prompt[0] == small.native.bos())  # a BOS token is kept besides the 6
    assert slot.cache[:kept] == prompt[:kept]  # the kept start survives every shift
    assert slot.cache[kept:kept + 6] != prompt[kept:kept + 6]  # what followed it did not
    # llama.cpp's KV cache agrees with the tokens the slot believes it holds
    import llama_cpp

    memory = small.native.memory
    assert llama_cpp.llama_memory_seq_pos_min(memory, slot.id) == 0
    assert llama_cpp.llama_memory_seq_pos_max(memory, slot.id) == len(slot.cache) - 1
    # and the slot serves the next request normally
    again = small.generate(small.tokenize("Say hi."), SamplingParams(temperature=0, max_tokens=4))
    assert again.text() and again.stats.finish_reason in ("stop", "length")


def test_shifting_on_a_sliding_window_model(gemma3_path):
    """gemma3 mixes sliding-window and global layers; loaded with the full cache, it shifts."""
    with LlamaCppBackend(gemma3_path, LoadOptions(n_ctx=256), name="gemma3:270m") as backend:
        _, stats, text = _long_reply(backend, shift=True, max_tokens=400)
        assert stats.finish_reason == "length" and text
        assert stats.context_shifts >= 1 and stats.generated_tokens == 400


def test_without_a_token_limit_there_is_no_shifting(small):
    """A reply with no max_tokens must end: a full context stops it even when shifting."""
    prompt = small.tokenize("List the numbers from one to one thousand: one, two, three,")
    generation = small.generate(prompt, SamplingParams(
        temperature=0, logit_bias=eog_ban(small.native), context_shift=True))
    generation.text()
    assert generation.stats.finish_reason == "length"
    assert generation.stats.context_shifts == 0
