"""Prompt-lookup speculative decoding: the same output as plain decoding, in fewer steps."""

from __future__ import annotations

import re

import pytest

from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.engine.draft import ngram_draft
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.errors import InvalidRequest, ModelLoadFailed

from ..greedy import Reference, eog_ban

CODE = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
        "def mul(a, b):\n    return a * b\n\ndef div(a, b):\n    return a / b\n")
ASK = [{"role": "user", "content": "Rewrite this code, adding a docstring to each function:\n\n"
        + CODE}]


def test_the_draft_is_what_followed_the_latest_match():
    assert ngram_draft([1, 2, 3, 4, 5, 9, 1, 2, 3], max_draft=3) == [4, 5, 9]
    assert ngram_draft([7, 1, 2, 8, 1, 2, 9, 5, 1, 2]) == [9, 5, 1, 2]  # the latest wins
    assert ngram_draft([1, 2, 3, 4]) == []  # nothing repeats
    assert ngram_draft([5, 6, 7, 5, 6], max_draft=2) == [7, 5]


def _prompt(backend, messages) -> list[int]:
    return backend.tokenize(backend.apply_chat_template(messages))


def _run(path, draft: int, params: SamplingParams, n_slots: int = 1):
    with LlamaCppBackend(path, LoadOptions(n_ctx=1024, n_slots=n_slots, draft_tokens=draft),
                         name="model") as backend:
        generation = backend.generate(_prompt(backend, ASK), params)
        text = generation.text()
        return text, generation.stats, backend.stats().steps


@pytest.mark.numerics  # (its references are looked up by name: not marked by itself)
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_speculative_greedy_output_equals_plain_greedy_output(request, model):
    """Every token is the greedy pick of logits computed on exactly the tokens before it,
    so the reply is plain decoding's (guesses are decoded in bigger batches, whose floats
    may part from plain decoding's at a near-tie: the reference judges, tests/greedy.py).
    Sampled replies follow the same distribution too, but those last bits can flip a
    random draw."""
    path = request.getfixturevalue(f"{model}_path")
    reference = request.getfixturevalue(f"{model}_reference")
    prompt = _prompt(request.getfixturevalue(model), ASK)
    params = SamplingParams(temperature=0, max_tokens=120)
    plain, plain_stats, plain_steps = _run(path, 0, params)
    fast, stats, steps = _run(path, 8, params)
    assert reference.follows(prompt, fast, stats.finish_reason) > 30
    assert reference.follows(prompt, plain, plain_stats.finish_reason) > 30
    assert stats.draft_tokens > 0 and stats.accepted_tokens > 0
    assert 0 < stats.acceptance_rate <= 1
    # accepted guesses saved decode steps
    assert steps / stats.generated_tokens < plain_steps / plain_stats.generated_tokens
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


# ---------------------------------------------------------------- a draft model guessing
OPEN = [{"role": "user", "content": "Why is the sky blue? Explain in detail."}]


def _draft_run(path, draft_model, messages, max_tokens: int = 120, draft: int = 0,
               endless: bool = False):
    options = LoadOptions(n_ctx=1024, draft_model=draft_model and str(draft_model),
                          draft_tokens=draft)
    with LlamaCppBackend(path, options, name="model") as backend:
        bias = eog_ban(backend.native) if endless else {}
        generation = backend.generate(_prompt(backend, messages), SamplingParams(
            temperature=0, max_tokens=max_tokens, logit_bias=bias))
        text = generation.text()
        return text, generation.stats, backend.stats().steps


@pytest.mark.numerics
def test_a_draft_model_gives_the_plain_greedy_reply_in_fewer_steps(quant_files, smollm2):
    """The Q8_0 model, guessed for by its Q4_1 quantisation: the same vocabulary, mostly
    the same choices, different numbers — so some guesses fail and are thrown away."""
    target, draft = quant_files["Q8_0"], quant_files["Q4_1"]
    reference = Reference(target)
    rates = {}
    for name, messages in (("open", OPEN), ("code", ASK)):
        prompt = _prompt(smollm2, messages)  # the same vocabulary and template as the Q8_0
        plain, plain_stats, plain_steps = _draft_run(target, None, messages)
        fast, stats, steps = _draft_run(target, draft, messages)
        assert reference.follows(prompt, fast, stats.finish_reason) > 30, name
        assert reference.follows(prompt, plain, plain_stats.finish_reason) > 30, name
        assert stats.draft_tokens > 0 and 0.5 < stats.acceptance_rate <= 1, name
        assert steps / stats.generated_tokens < plain_steps / plain_stats.generated_tokens
        rates[name] = stats.acceptance_rate
    reference.close()
    # an open question is where a draft model beats prompt lookup: nothing there to look up
    _, lookup, _ = _draft_run(target, None, OPEN, draft=8)
    assert rates["open"] > (lookup.acceptance_rate or 0)


def test_max_tokens_is_exact_with_a_draft_model(quant_files):
    _, stats, _ = _draft_run(quant_files["Q8_0"], quant_files["Q4_1"], OPEN, max_tokens=5,
                             endless=True)
    assert stats.generated_tokens == 5 and stats.finish_reason == "length"


def test_a_draft_model_with_another_vocabulary_is_refused(smollm2_path, gemma3_path):
    with pytest.raises(ModelLoadFailed, match="vocabulary"):
        _draft_run(smollm2_path, gemma3_path, OPEN)


def test_a_draft_model_follows_a_request_across_the_whole_pool(quant_files):
    """With one KV pool a request may outgrow a slot's share: the draft model's own context
    covers the pool, so it keeps guessing there, and the count stays unbroken."""
    options = LoadOptions(n_ctx=128, n_slots=4, kv_unified=True, n_threads=2,
                          draft_model=str(quant_files["Q4_1"]))
    with LlamaCppBackend(quant_files["Q8_0"], options) as backend:
        prompt = backend.tokenize("Count up by one, separated by commas: 1, 2, 3, 4, 5, 6,")
        generation = backend.generate(prompt, SamplingParams(
            temperature=0, max_tokens=400, logit_bias=eog_ban(backend.native)))
        numbers = [int(n) for n in re.findall(r"\d+", generation.text())]
        steps = backend.stats().steps
    stats = generation.stats
    assert len(prompt) + stats.generated_tokens > 3 * 128  # well past one slot's share
    assert numbers == list(range(7, 7 + len(numbers))) and len(numbers) > 90
    # guessing to the end: a draft context of one share would stop it halfway through
    assert stats.acceptance_rate > 0.5 and steps < stats.generated_tokens / 4
