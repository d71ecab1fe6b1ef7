"""Prompt-lookup speculative decoding: the same output as plain decoding, in fewer steps."""

from __future__ import annotations

import pytest

from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.draft import ngram_draft
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.errors import InvalidRequest

CODE = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
        "def mul(a, b):\n    return a * b\n\ndef div(a, b):\n    return a / b\n")
ASK = [{"role": "user", "content": "Rewrite this code, adding a docstring to each function:\n\n"
        + CODE}]


def test_the_draft_is_what_followed_the_latest_match():
    assert ngram_draft([1, 2, 3, 4, 5, 9, 1, 2, 3], max_draft=3) == [4, 5, 9]
    assert ngram_draft([7, 1, 2, 8, 1, 2, 9, 5, 1, 2]) == [9, 5, 1, 2]  # the latest wins
    assert ngram_draft([1, 2, 3, 4]) == []  # nothing repeats
    assert ngram_draft([5, 6, 7, 5, 6], max_draft=2) == [7, 5]


def _run(path, draft: int, params: SamplingParams, n_slots: int = 1):
    with LlamaCppBackend(path, LoadOptions(n_ctx=1024, n_slots=n_slots, draft_tokens=draft),
                         name="model") as backend:
        generation = backend.chat(ASK, params)
        text = generation.text()
        return text, generation.stats, backend.stats().steps


@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
def test_speculative_greedy_output_equals_plain_greedy_output(request, model):
    """Sampled replies follow the same distribution too, but a guess's logits come from a
    bigger batch, and the last bits of floating point can flip a random draw; greedy holds."""
    path = request.getfixturevalue(model)
    params = SamplingParams(temperature=0, max_tokens=120)
    plain, plain_stats, plain_steps = _run(path, 0, params)
    fast, stats, steps = _run(path, 8, params)
    assert fast == plain
    assert stats.generated_tokens == plain_stats.generated_tokens
    assert stats.draft_tokens > 0 and stats.accepted_tokens > 0
    assert 0 < stats.acceptance_rate <= 1
    assert steps < plain_steps  # accepted guesses saved decode steps
    assert plain_stats.draft_tokens == 0


def test_max_tokens_is_exact_with_guesses(smollm2_path):
    _, stats, _ = _run(smollm2_path, 8, SamplingParams(temperature=0, max_tokens=7))
    assert stats.generated_tokens <= 7


def test_draft_tokens_out_of_range_are_refused():
    with pytest.raises(InvalidRequest, match="draft tokens"):
        LoadOptions(draft_tokens=100)


def test_guessing_stops_when_guesses_keep_failing(smollm2_path):
    open_question = [{"role": "user", "content": "Why is the sky blue? Explain in detail."}]
    with LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=1024, draft_tokens=8),
                         name="model") as backend:
        generation = backend.chat(open_question, SamplingParams(temperature=0, max_tokens=160))
        generation.text()
    stats = generation.stats
    assert stats.acceptance_rate is None or stats.acceptance_rate < 0.5  # little to look up
    # 8 guesses a step at first, then probes of 2 every 16 tokens: far fewer than 8 a token
    assert stats.draft_tokens < 2 * stats.generated_tokens
