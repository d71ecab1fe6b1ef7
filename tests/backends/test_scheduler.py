"""The slot scheduler against a fake model (fake_native.py), in milliseconds: which slot a
request takes, prefix reuse and borrowing, the wait queue, cancels, and the shared pool's
preemptions — each reply checked token by token against what the model gives, and every
decode checked against the KV cache the scheduler must keep. (The same behaviour on the
real models: test_prefix_sharing.py, test_unified_cache.py, test_engine_limits.py.)"""

from __future__ import annotations

import pytest

from localinfer.backends.base import SamplingParams
from localinfer.backends.engine.scheduler import Engine, Slot
from localinfer.errors import EngineBusy

from . import fake_native
from .fake_native import FakeNative, reference, text

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def _engine(native: FakeNative, n_slots: int = 2, **kw) -> Engine:
    return Engine(native, n_slots=n_slots, n_batch=64, **kw)


def _prompt(start: int, n: int = 10) -> list[int]:
    return [(start + i) % 97 for i in range(n)]


def test_every_reply_is_the_models_whatever_shares_the_batch():
    native = FakeNative(n_ctx=512)
    engine = _engine(native, n_slots=3)
    try:
        prompts = [_prompt(s, 5 + s) for s in range(7)]  # more requests than slots: a queue
        generations = [engine.submit(p, GREEDY) for p in prompts]
        for prompt, generation in zip(prompts, generations):
            assert generation.text() == text(reference(prompt, 12))
            assert generation.stats.generated_tokens == 12
        assert engine.stats().requests_finished == 7
    finally:
        engine.close()


def test_a_chat_turn_reads_only_what_is_new():
    native = FakeNative(n_ctx=512)
    engine = _engine(native)
    try:
        first = _prompt(1, 40)
        reply = engine.submit(first, GREEDY)
        said = reference(first, 12)
        assert reply.text() == text(said)
        turn = first + said + _prompt(50, 8)
        second = engine.submit(turn, GREEDY)
        assert second.text() == text(reference(turn, 12))
        # the slot kept the first turn: all of it but the token the reply ended on
        assert second.stats.cached_tokens >= len(first) + len(said) - 1
    finally:
        engine.close()


def test_a_prefix_another_busy_slot_holds_is_borrowed():
    native = FakeNative(n_ctx=1024)
    engine = _engine(native)
    try:
        system = _prompt(3, 60)  # a shared system prompt, past the 32 tokens worth copying
        native.gate.clear()
        long_one = engine.submit(system + [5, 6], SamplingParams(temperature=0, max_tokens=150))
        assert native.held.wait(5)  # slot 0 reads the system prompt, and will go on generating
        other = engine.submit(system + [7, 8, 9], GREEDY)
        native.gate.set()
        assert other.text() == text(reference(system + [7, 8, 9], 12))
        assert native.copies == 1  # borrowed from the busy slot, not read again
        assert other.stats.cached_tokens == 60
        assert long_one.text() == text(reference(system + [5, 6], 150))
    finally:
        engine.close()


def test_a_full_wait_queue_is_busy_and_a_cancel_frees_the_slot():
    native = FakeNative()
    engine = _engine(native, n_slots=1, max_waiting=2)
    native.gate.clear()  # the engine holds in its first decode
    try:
        running = engine.submit(_prompt(1), SamplingParams(temperature=0, max_tokens=100))
        assert native.held.wait(5)  # it has the slot
        waiting = [engine.submit(_prompt(s), GREEDY) for s in (2, 3)]
        with pytest.raises(EngineBusy, match="waiting"):
            engine.submit(_prompt(4), GREEDY)
        running.cancel()
        native.gate.set()
        running.text()
        assert running.stats.finish_reason == "cancelled"
        assert running.stats.generated_tokens < 100
        for s, generation in zip((2, 3), waiting):
            assert generation.text() == text(reference(_prompt(s), 12))
        assert engine.stats().waiting == 0
        assert engine.submit(_prompt(4), GREEDY).text() == text(reference(_prompt(4), 12))
    finally:
        native.gate.set()
        engine.close()


def test_the_shared_pool_preempts_the_newest_which_goes_on_where_it_stopped():
    """Three streams of ~90 cells each outgrow a pool of 192: the newest yield theirs, are
    rebuilt from their tokens, and every reply is still the model's."""
    native = FakeNative(n_ctx=192)
    engine = _engine(native, n_slots=3, unified=True)
    try:
        long = SamplingParams(temperature=0, max_tokens=80)
        prompts = [_prompt(s, 10) for s in (1, 11, 21)]
        generations = []
        for prompt in prompts:  # in order: the first is the oldest
            generations.append(engine.submit(prompt, long))
        for prompt, generation in zip(prompts, generations):
            assert generation.text() == text(reference(prompt, 80))
        assert generations[0].stats.preemptions == 0
        assert sum(g.stats.preemptions for g in generations) == engine.stats().preemptions > 0
    finally:
        engine.close()


def test_a_stream_that_is_cancelled_while_others_run_leaves_them_be():
    native = FakeNative(n_ctx=512)
    engine = _engine(native, n_slots=2)
    try:
        native.gate.clear()
        keep = engine.submit(_prompt(1), SamplingParams(temperature=0, max_tokens=60))
        drop = engine.submit(_prompt(2), SamplingParams(temperature=0, max_tokens=60))
        assert native.held.wait(5)
        drop.cancel()  # mid-step: it ends at the next one
        native.gate.set()
        drop.text()
        assert drop.stats.finish_reason == "cancelled" and drop.stats.generated_tokens < 60
        assert keep.text() == text(reference(_prompt(1), 60))
    finally:
        engine.close()


def test_the_reply_cap_is_applied_here_for_every_front_end():
    """A request that sets no limit gets the model's reply cap (LOCALINFER_MAX_TOKENS, in
    LoadOptions) in the engine, whichever front end sent it; one that asked for no limit
    (Ollama's num_predict -1, `run --max-tokens 0`) or set its own does not."""
    native = FakeNative(n_ctx=256)
    engine = _engine(native, n_slots=1, reply_cap=5)
    try:
        prompt = _prompt(1)
        capped = engine.submit(prompt, SamplingParams(temperature=0))
        assert capped.text() == text(reference(prompt, 5))
        assert capped.stats.finish_reason == "length"
        own = engine.submit(prompt, SamplingParams(temperature=0, max_tokens=9))
        assert own.text() == text(reference(prompt, 9))
        endless = engine.submit(prompt, SamplingParams(temperature=0, capped=False))
        endless.text()
        assert endless.stats.generated_tokens > 5 and endless.stats.finish_reason == "length"
    finally:
        engine.close()


def test_guesses_kept_and_rejected_leave_the_reply_and_the_cache_as_plain_decoding_would(
        monkeypatch):
    """A lone stream decodes prompt-lookup guesses with its next token. Here the model's
    text nearly repeats (a cycle of tokens, broken at every 17th position), so
    guesses hold for a while and then fail: the kept ones' KV stays, the rejected ones' is
    dropped before the next decode (the fake checks every position), and the reply is the
    model's own."""
    # a cycle of 11 tokens, broken every 17th position
    monkeypatch.setattr(fake_native, "rule",
                        lambda token, pos: (token + 1) % 11 if pos % 17 else (token + 5) % 11)
    native = FakeNative(n_ctx=512)
    engine = _engine(native, n_slots=1, draft_tokens=4)
    try:
        prompt = _prompt(1, 30)
        generation = engine.submit(prompt, SamplingParams(temperature=0, max_tokens=80))
        assert generation.text() == text(fake_native.reference(prompt, 80))
        stats = generation.stats
        assert 0 < stats.accepted_tokens < stats.draft_tokens, stats
        assert sorted(native.cells[0]) == list(range(len(prompt) + 80 - 1))
    finally:
        engine.close()


def test_a_full_slot_shifts_its_context_keeping_the_first_tokens():
    """With context_shift and a limit, a reply longer than the slot's cells goes on: the
    older half after the first n_keep tokens is dropped and the rest slides back (the fake
    refuses any decode whose positions do not follow its cells)."""
    native = FakeNative(n_ctx=64)
    engine = _engine(native, n_slots=1)
    try:
        prompt = _prompt(1, 20)
        params = SamplingParams(temperature=0, max_tokens=100, context_shift=True, n_keep=5)
        generation = engine.submit(prompt, params)
        generation.text()
        assert generation.stats.finish_reason == "length"
        assert generation.stats.generated_tokens == 100
        assert generation.stats.context_shifts >= 2
        cells = native.cells[0]
        assert sorted(cells) == list(range(len(cells))) and len(cells) <= 64
        assert [cells[p] for p in range(5)] == prompt[:5]
    finally:
        engine.close()


@pytest.mark.parametrize("reuse", [0, 8])
def test_cached_runs_after_dropped_text_are_moved_into_place(reuse):
    """An editor's window over a file moves down: the prompt drops text the slot holds and
    goes on with what followed it. Runs of at least `cache_reuse` tokens are moved back to
    their new positions (the fake's cells must then hold exactly the new prompt, or its
    next decode fails); a shorter run, and everything with reuse off, is read again. The
    slot holding the runs is the one taken, though the other was used less recently."""
    native = FakeNative(n_ctx=512)
    engine = _engine(native, n_slots=2, cache_reuse=reuse)
    try:
        other = _prompt(70, 15)
        assert engine.submit(other, GREEDY).text() == text(reference(other, 12))
        head, run1, run2, short = _prompt(1, 10), _prompt(30, 20), _prompt(60, 20), [90, 91, 92]
        first = head + [5, 5] + run1 + [6] + run2 + [7, 7, 7] + short
        assert engine.submit(first, GREEDY).text() == text(reference(first, 12))
        tail = [t for t in (0, 1, 2, 3, 4) if t != reference(first, 12)[0]][:3]
        second = run1 + run2 + short + tail  # the head went too: no prefix is cached
        generation = engine.submit(second, GREEDY)
        assert generation.text() == text(reference(second, 12))
        assert generation.stats.cached_tokens == (len(run1) + len(run2) if reuse else 0)
        assert any([cells.get(p) for p in range(len(second))] == second
                   for cells in native.cells.values())
    finally:
        engine.close()


def test_work_called_on_the_engine_runs_on_its_thread_between_steps():
    # (a pooled context's decodes: one thread of the process calls llama.cpp)
    import threading

    from localinfer.errors import EngineClosed

    native = FakeNative(n_ctx=512)
    engine = _engine(native)
    try:
        prompt = _prompt(3, 12)
        reply = engine.submit(prompt, GREEDY)
        names = [engine.call(lambda: threading.current_thread().name) for _ in range(5)]
        assert names == ["localinfer-engine"] * 5
        assert reply.text() == text(reference(prompt, 12))  # the generation went on as before
        with pytest.raises(ZeroDivisionError):  # the work's own error, raised to its caller
            engine.call(lambda: 1 / 0)
        assert engine.call(lambda: 7) == 7  # and the engine lives on
    finally:
        engine.close()
    with pytest.raises(EngineClosed):
        engine.call(lambda: 7)


def test_a_request_compares_its_prompt_with_each_slot_a_few_times_not_each_pair(monkeypatch):
    """Which slot a request takes: its prompt is compared with each slot's cache about once
    (and again where it would borrow another's prefix), not once for every idle slot it
    could take and every other slot: with 32 slots that was ~1,000 comparisons a request,
    8% of the engine's thread at a GPU's step rate, paid before its first token."""
    native = FakeNative(n_ctx=32 * 64)
    engine = _engine(native, n_slots=32)
    try:
        for i in range(32):  # every slot holds a conversation
            engine.submit(_prompt(3 * i, 20), GREEDY).text()
        calls = []
        original = Slot.common_prefix
        monkeypatch.setattr(Slot, "common_prefix",
                            lambda slot, tokens: calls.append(slot.id) or original(slot, tokens))
        prompt = _prompt(5, 20)
        assert engine.submit(prompt, GREEDY).text() == text(reference(prompt, 12))
        assert len(calls) <= 4 * 32, len(calls)
    finally:
        engine.close()
