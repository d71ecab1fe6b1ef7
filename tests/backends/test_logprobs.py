"""The likeliest tokens of a step, as log probabilities name them: exactly the k highest
logits, highest first, however the logits are spread (llama_native._likeliest looks only
near the best and widens the window until k are in it)."""

from __future__ import annotations

import threading

import numpy
import pytest

from localinfer.backends.native.model import _likeliest, _within


@pytest.mark.parametrize("n", [5, 100, 262_144])
@pytest.mark.parametrize("k", [1, 3, 20])
@pytest.mark.parametrize("spread", [0.01, 1.0, 30.0])
def test_the_likeliest_are_the_k_highest_logits_in_order(n, k, spread):
    k = min(k, n)
    logits = (numpy.random.default_rng(n + k).standard_normal(n) * spread).astype(numpy.float32)
    want = numpy.argsort(-logits, kind="stable")[:k]
    got = _likeliest(logits, float(logits.max()), k)
    assert list(logits[got]) == list(logits[want])


def test_ties_and_a_flat_row_give_k_tokens():
    flat = numpy.zeros(1000, dtype=numpy.float32)
    assert len(_likeliest(flat, 0.0, 20)) == 20
    few = numpy.full(10, -5.0, dtype=numpy.float32)
    assert len(_likeliest(few, -5.0, 20)) == 10  # (a vocabulary smaller than asked)


def test_a_row_of_nan_or_of_too_few_finite_logits_ends():
    """A model whose logits came out NaN (overflow) had its engine thread widen the window
    for ever, every stream of the model stalled; fewer finite logits than asked doubled it
    a thousand times. Now: the tokens that are not NaN, at once."""
    nan = numpy.full(262_144, numpy.nan, dtype=numpy.float32)
    sparse = numpy.full(262_144, -numpy.inf, dtype=numpy.float32)
    sparse[:3] = (1.0, 2.0, 3.0)
    sparse[3] = numpy.nan
    got = {}
    work = threading.Thread(target=lambda: got.update(
        nan=_likeliest(nan, float(nan.max()), 20), sparse=_within(sparse, 3.0, 20, 4.0)[0]),
        daemon=True)
    work.start()
    work.join(10)
    assert not work.is_alive()
    assert len(got["nan"]) == 0
    assert len(got["sparse"]) == 262_144 - 1 and 3 not in set(got["sparse"][:5])


def test_a_window_narrowed_to_nothing_still_widens():
    """A sampler's window is narrowed while rows hold many equal logits; from 0 it could
    never widen again (0 doubled), and the engine's thread would spin."""
    logits = numpy.arange(1000, dtype=numpy.float32)
    work = threading.Thread(target=lambda: _within(logits, 999.0, 40, 0.0), daemon=True)
    work.start()
    work.join(10)
    assert not work.is_alive()
    ids, gap = _within(logits, 999.0, 40, 0.0)
    assert len(ids) >= 40 and gap > 0
