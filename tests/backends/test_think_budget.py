"""A reasoning budget's bookkeeping, token by token (backends/engine/think_budget.py)."""

from __future__ import annotations

import pytest

from localinfer.backends.engine.think_budget import ThinkBudget, ThinkLimit

OPEN, CLOSE, NEWLINE = (90, 91), (92,), 10  # a mark of two tokens, one of one
LIMIT = ThinkLimit(budget=3, opening=OPEN, closing=CLOSE, forced=(NEWLINE, *CLOSE))


def _written(budget: ThinkBudget, sampled: list[int]) -> list[int]:
    """What the reply becomes when the model would write `sampled` (forced tokens take
    the place of what it would have drawn)."""
    out = []
    for token in sampled:
        forced = budget.forced()
        out.append(forced if forced is not None else token)
        budget.observe(out[-1])
    return out


@pytest.mark.parametrize("prompt, sampled, written", [
    # the template opened the block (with or without a line break after its mark)
    ([1, *OPEN], [5, 6, 7, 8, 9, 9], [5, 6, 7, NEWLINE, *CLOSE, 9]),
    ([1, *OPEN, NEWLINE], [5, 6, 7, 8, 9, 9], [5, 6, 7, NEWLINE, *CLOSE, 9]),
    # the model opens it itself, and counting starts after the mark
    ([1], [4, *OPEN, 5, 6, 7, 8, 9, 9], [4, *OPEN, 5, 6, 7, NEWLINE, *CLOSE, 9]),
    # it closes in time: nothing is forced, and later text is free
    ([1, *OPEN], [5, *CLOSE, 6, 7, 8, 9], [5, *CLOSE, 6, 7, 8, 9]),
    # no block at all
    ([1], [5, 6, 7, 8, 9], [5, 6, 7, 8, 9]),
])
def test_the_block_closes_after_its_budget(prompt, sampled, written):
    budget = ThinkBudget(LIMIT, prompt)
    assert _written(budget, sampled) == written


def test_a_budget_of_none_closes_at_once():
    budget = ThinkBudget(ThinkLimit(0, OPEN, CLOSE, (NEWLINE, *CLOSE)), [1, *OPEN])
    assert _written(budget, [5, 6, 7]) == [NEWLINE, *CLOSE, 7]
    assert budget.done and budget.spent == 0


def test_a_grammar_that_will_not_take_the_closing_mark_keeps_its_sampler_as_it_was(smollm2):
    """A forced token a request's grammar does not allow is refused, not fed to llama.cpp
    (it would abort the process): the budget is then dropped, the model goes on."""
    from localinfer.backends.base import SamplingParams
    from localinfer.backends.native.model import SamplerChain

    native = smollm2.native
    chain = SamplerChain(native, SamplingParams(temperature=0, grammar='root ::= "yes"'))
    try:
        no = native.tokenize("no", add_special=False)[0]
        yes = native.tokenize("yes", add_special=False)[0]
        assert not chain.accept(no)
        assert chain.accept(yes)
    finally:
        chain.close()
