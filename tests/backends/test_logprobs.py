"""The likeliest tokens of a step, as log probabilities name them: exactly the k highest
logits, highest first, however the logits are spread (llama_native._likeliest looks only
near the best and widens the window until k are in it)."""

from __future__ import annotations

import numpy
import pytest

from localinfer.backends.native.model import _likeliest


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
