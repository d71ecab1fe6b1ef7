"""Filler tokens in idle slots (engine/padding.py): which ways a step may be filled, which
one the engine takes as the steps' times come in, and that no stream's reply and no idle
slot's kept prefix changes for them — against the fake model, whose decodes check every
position, and on smollm2 with llama.cpp itself."""

from __future__ import annotations

import pytest

from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.engine.padding import RECHECK, StepPadding, micro_batches, ways
from localinfer.backends.engine.scheduler import Engine
from localinfer.backends.llamacpp import LlamaCppBackend

from .fake_native import FakeNative, reference, text

from ..greedy import eog_ban


@pytest.mark.parametrize("active, shape", [
    ([0, 1, 2, 3], (4,)),
    ([0, 1, 2, 3, 5, 6, 7], (4, 3)),  # slot 4's request ended first: two micro-batches
    ([0, 2, 4, 6], (1, 1, 1, 1)),
    ([3], (1,)),
])
def test_a_step_splits_where_its_slots_leave_a_gap(active, shape):
    assert micro_batches(active) == shape


def test_the_ways_to_fill_a_step_close_its_gaps_then_round_it_up():
    idle = {4, 8, 9, 2}
    assert ways([0, 1, 2, 3, 5, 6, 7], idle.__contains__) == [
        ((4, 3), ()), ((8,), (4,))]  # (already a multiple of 4)
    assert ways([3, 5, 6], idle.__contains__) == [
        ((2, 1), ()), ((4,), (4,))]
    assert ways([5, 6, 7], idle.__contains__) == [
        ((3,), ()), ((4,), (8,))]  # above first
    assert ways([3, 4], {1, 2, 5}.__contains__) == [
        ((2,), ()), ((4,), (5, 2))]  # above, then below
    # a gap no filler may take: as it is
    assert ways([0, 2, 3], {8}.__contains__) == [((2, 1), ())]
    # no way to a multiple of 4: its gaps filled only
    assert ways([0, 2], {1}.__contains__) == [((1, 1), ()), ((3,), (1,))]


def _timed(padding: StepPadding, options, costs: dict, steps: int) -> list[int]:
    chosen = []
    for _ in range(steps):
        i = padding.choose(options)
        chosen.append(i)
        padding.observe(options[i][0], costs[options[i][0]])
    return chosen


def test_a_filled_step_is_taken_only_once_it_has_been_timed_faster():
    options = [((4, 3), ()), ((8,), (4,))]
    padding = StepPadding(True)
    chosen = _timed(padding, options, {(4, 3): 0.038, (8,): 0.024}, 200)
    assert chosen[:4] == [0] * 4 and chosen[4:8] == [1] * 4  # each timed first
    later = chosen[8:]
    assert later.count(1) > 0.95 * len(later)
    # the way not taken is timed again now and then, not more
    assert 0 < later.count(0) <= len(later) // RECHECK + 1

    padding = StepPadding(True)  # where filling costs more, it is not taken
    chosen = _timed(padding, options, {(4, 3): 0.024, (8,): 0.026}, 200)
    assert chosen[8:].count(1) <= 200 // RECHECK + 1
    # nor where it gains less than the noise of a step
    padding = StepPadding(True)
    chosen = _timed(padding, options, {(4, 3): 0.024, (8,): 0.0235}, 100)
    assert chosen[8:].count(1) <= 100 // RECHECK + 1


def test_the_choice_follows_the_times_as_they_change():
    options = [((3,), ()), ((4,), (3,))]
    padding = StepPadding(True)
    _timed(padding, options, {(3,): 0.030, (4,): 0.020}, 50)
    assert padding.choose(options) == 1
    # attention grows with the context: the filled step is now the slower
    chosen = _timed(padding, options, {(3,): 0.030, (4,): 0.040}, 3 * RECHECK)
    assert chosen[-RECHECK:].count(0) > 0.9 * RECHECK


def _costly_gaps(shape: tuple[int, ...]) -> float:
    """A CPU's costs, in seconds: each micro-batch reads every weight (5 ms)."""
    return len(shape) * 0.005 + sum(shape) * 0.0001


def _costly_tokens(shape: tuple[int, ...]) -> float:
    """Costs where fillers do not pay: 5 ms a token."""
    return len(shape) * 0.0001 + sum(shape) * 0.005


LONG = 200  # tokens the two outer requests write


def _a_gap_between_two_streams(native: FakeNative, cost, n_slots: int = 4):
    """Three requests in slots 0-2, decodes taking `cost(shape)` seconds; the middle one
    ends first, and its slot keeps its prompt and reply while the other two go on: their
    steps have a gap at slot 1. Each reply is checked against the model's."""
    native.cost = cost
    engine = Engine(native, n_slots=n_slots, n_batch=64)
    long = SamplingParams(temperature=0, max_tokens=LONG)
    prompts = [[(7 * s + i) % 97 for i in range(12)] for s in range(3)]
    native.gate.clear()  # (all three submitted before a step is decoded)
    runs = [engine.submit(prompts[0], long),
            engine.submit(prompts[1], SamplingParams(temperature=0, max_tokens=3)),
            engine.submit(prompts[2], long)]
    native.gate.set()
    try:
        for prompt, run, n in zip(prompts, runs, (LONG, 3, LONG)):
            assert run.text() == text(reference(prompt, n))  # every position checked
    except BaseException:
        engine.close()
        raise
    return engine, prompts


def test_streams_with_a_gap_between_them_are_decoded_as_one_micro_batch():
    engine, prompts = _a_gap_between_two_streams(FakeNative(n_ctx=1024), _costly_gaps)
    native = engine.native
    try:
        # slots 0 and 2 as two micro-batches only while that way is timed (4 steps at
        # first, one every RECHECK steps; a step slowed by the machine may cost one RECHECK
        # more); else slot 1 filled: a micro-batch of 3, or of 4 with slot 3
        split = native.shapes.count((1, 1))
        assert 0 < split <= 4 + 2 * RECHECK
        assert engine.padding.padded_steps >= LONG - split - 10
        # slot 1 kept exactly its prefix: the same prompt again is read from it
        again = engine.submit(prompts[1], SamplingParams(temperature=0, max_tokens=5))
        assert again.text() == text(reference(prompts[1], 5))
        assert again.stats.cached_tokens == len(prompts[1]) - 1
    finally:
        engine.close()


def test_no_fillers_where_they_make_the_step_slower():
    engine, _ = _a_gap_between_two_streams(FakeNative(n_ctx=1024), _costly_tokens)
    native = engine.native
    try:
        two = [s for s in native.shapes if sum(s) >= 2]
        assert native.shapes.count((1, 1)) > 0.5 * len(two)
        assert engine.padding.padded_steps < 0.3 * len(two)
    finally:
        engine.close()


class _KeepsFillers(FakeNative):
    """llama.cpp refusing to cut slot 1's sequence back (as it may a state it cannot cut)."""

    def forget(self, seq: int, start: int = -1, end: int = -1) -> bool:
        if seq == 1 and start > 0:
            return False
        return super().forget(seq, start, end)


def test_a_filler_llama_cpp_will_not_remove_takes_its_slots_prefix_with_it():
    engine, prompts = _a_gap_between_two_streams(_KeepsFillers(n_ctx=1024), _costly_gaps)
    try:
        # the slot was emptied, not left holding a stray cell: the prompt is read again
        again = engine.submit(prompts[1], SamplingParams(temperature=0, max_tokens=5))
        assert again.text() == text(reference(prompts[1], 5))
        assert again.stats.cached_tokens == 0
    finally:
        engine.close()


@pytest.fixture(scope="module")
def four_slots(smollm2_path):
    backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=512, n_slots=4), name="smollm2:135m")
    yield backend
    backend.close()


def test_fillers_change_no_reply_and_no_kept_prefix_in_llama_cpp(four_slots, smollm2_reference,
                                                                  monkeypatch):
    """Every step that may be filled is (the most filled way), on the real model: the
    replies are the reference's, and the idle slot's prefix is intact afterwards (llama.cpp
    refuses a decode whose positions do not follow the sequence's, and the same prompt
    again finds it all cached)."""
    engine = four_slots.engine
    assert engine.padding.enabled
    monkeypatch.setattr(engine.padding, "choose", lambda options: len(options) - 1)
    ban = eog_ban(four_slots.native)
    prompts = [four_slots.tokenize(four_slots.apply_chat_template(
        [{"role": "user", "content": q}])) for q in
        ("Name three rivers.", "What is two plus two?", "Describe a cat.")]
    long = SamplingParams(temperature=0, max_tokens=40, logit_bias=ban)
    before = engine.padding.padded_steps
    runs = [four_slots.generate(prompts[0], long),
            four_slots.generate(prompts[1], SamplingParams(temperature=0, max_tokens=3,
                                                          logit_bias=ban)),
            four_slots.generate(prompts[2], long)]
    texts = [r.text() for r in runs]
    assert engine.padding.padded_steps - before >= 20
    for prompt, said, run in zip(prompts, texts, runs):
        assert smollm2_reference.follows(prompt, said, run.stats.finish_reason, ban=ban) >= 3
    again = four_slots.generate(prompts[1], SamplingParams(temperature=0, max_tokens=8))
    said = again.text()
    assert again.stats.cached_tokens == len(prompts[1]) - 1
    smollm2_reference.follows(prompts[1], said, again.stats.finish_reason)


@pytest.mark.parametrize("memory", ["stateful", "windowed", "unified"])
def test_no_fillers_where_a_cell_cannot_be_taken_back_exactly(memory):
    """A recurrent or hybrid state, a sliding-window cache and one shared pool would each
    keep something of a filler: none is added there, whatever the step costs."""
    native = FakeNative(n_ctx=1024)
    if memory == "unified":
        engine = Engine(native, n_slots=4, n_batch=64, unified=True)
    else:
        setattr(native, memory, True)
        engine = Engine(native, n_slots=4, n_batch=64)
    try:
        assert not engine.padding.enabled
    finally:
        engine.close()


class _OffByOne(FakeNative):
    """llama.cpp's end of slot 1's sequence one past what its cache says."""

    def next_position(self, seq: int) -> int:
        return super().next_position(seq) + (seq == 1)


def test_an_idle_slot_whose_sequence_ends_elsewhere_carries_no_filler():
    """A filler goes only where llama.cpp's sequence goes on from the slot's cache: else the
    whole step would be refused, every stream's token with it."""
    engine, _ = _a_gap_between_two_streams(_OffByOne(n_ctx=1024), _costly_gaps)
    try:
        split = engine.native.shapes.count((1, 1))
        assert split >= LONG - 10  # slot 1 never filled: slots 0 and 2 apart
    finally:
        engine.close()
