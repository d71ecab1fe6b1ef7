"""A request takes another slot's KV for a shared prefix (the same system prompt)."""

from __future__ import annotations

import pytest

from localinfer.backends.base import LoadOptions, SamplingParams, TokenEvent
from localinfer.backends.llamacpp import LlamaCppBackend

SYSTEM = "You are a helpful assistant who answers questions about geography in full sentences. " * 3
QUESTIONS = ["What is the longest river?", "Name a desert.", "Where is Peru?"]
FIRST_TOKENS = SamplingParams(temperature=0, max_tokens=4)


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def four_slots(smollm2_path):
    backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=1024, n_slots=4), name="smollm2:135m")
    yield backend
    backend.close()


def test_free_slots_borrow_the_prefix_of_a_busy_one(four_slots, smollm2):
    cold = []
    for q in QUESTIONS:  # each on a slot that never saw the system prompt
        smollm2.generate(smollm2.tokenize(f"unrelated {q}"), FIRST_TOKENS).text()
        smollm2.generate(smollm2.tokenize(f"other {q}"), FIRST_TOKENS).text()
        cold.append(smollm2.chat(_messages(q), FIRST_TOKENS).text())
    busy = four_slots.chat(_messages("What is the capital of France?"),
                           SamplingParams(temperature=0, max_tokens=200,
                                          logit_bias={0: -100, 2: -100}))
    events = iter(busy)
    assert isinstance(next(events), TokenEvent)  # its prompt's KV is in place
    generations = [four_slots.chat(_messages(q), FIRST_TOKENS) for q in QUESTIONS]
    warm = [g.text() for g in generations]
    busy.cancel()
    for _ in events:
        pass
    # each prefilled little more than its question (the system prompt is most of the prompt),
    # and the copied KV gives the cold run's first tokens
    assert all(g.stats.cached_tokens > g.stats.prompt_tokens * 0.7 for g in generations)
    assert warm == cold
