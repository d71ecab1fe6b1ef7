"""One pool of KV cells for every request: admission by free cells, preemption, long requests.

Greedy text is not compared with a solo run here: with one pool, a sequence's cells sit at
places that depend on the others, and llama.cpp's attention then rounds differently (seen on
both CPU attention paths). Counting prompts are used instead: whatever the rounding, the
count goes on by one, so a KV cache rebuilt wrongly after a preemption shows as a gap, a
repeat or another request's numbers.
"""

from __future__ import annotations

import re
import threading
import time

import llama_cpp
import pytest

from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.engine.scheduler import SlotState
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.errors import EngineBusy, PromptTooLong

from ..greedy import eog_ban

N_CTX, N_SLOTS = 128, 4  # a pool of 512 cells


@pytest.fixture(scope="module")
def pooled(smollm2_path):
    options = LoadOptions(n_ctx=N_CTX, n_slots=N_SLOTS, kv_unified=True, n_threads=2)
    with LlamaCppBackend(smollm2_path, options, name="smollm2:135m") as backend:
        yield backend


@pytest.fixture
def watch(pooled):
    """After every step: the cells counted against the pool, and llama.cpp's own view."""
    engine, seen = pooled.engine, {"peak": 0, "mismatch": []}

    def on_step(*_):
        seen["peak"] = max(seen["peak"], sum(len(s.cache) for s in engine.slots))
        for slot in engine.slots:
            top = llama_cpp.llama_memory_seq_pos_max(pooled.native.memory, slot.id)
            if top != len(slot.cache) - 1:
                seen["mismatch"].append((slot.id, top, len(slot.cache)))

    engine.on_step = on_step
    yield seen
    engine.on_step = None


def _count(backend, start: int, max_tokens: int):
    shown = ", ".join(str(i) for i in range(start, start + 6))
    prompt = backend.tokenize(f"Count up by one, separated by commas: {shown},")
    params = SamplingParams(temperature=0, max_tokens=max_tokens,
                            logit_bias=eog_ban(backend.native))
    return backend.generate(prompt, params)


def _counts_on(text: str, start: int) -> bool:
    numbers = [int(n) for n in re.findall(r"\d+", text)]
    return len(numbers) > 10 and numbers == list(range(start + 6, start + 6 + len(numbers)))


def test_one_request_may_use_the_whole_pool(pooled, smollm2_path):
    assert pooled.engine.n_cells == N_CTX * N_SLOTS == pooled.info.n_ctx
    prompt = pooled.tokenize("The history of the sea. " * 60)[:300]  # more than one share
    generation = pooled.generate(prompt, SamplingParams(temperature=0, max_tokens=8))
    assert generation.text() and generation.stats.prompt_tokens == 300
    split = LoadOptions(n_ctx=N_CTX, n_slots=N_SLOTS, n_threads=2)
    with LlamaCppBackend(smollm2_path, split) as shares:
        with pytest.raises(PromptTooLong):
            shares.generate(prompt, SamplingParams(temperature=0, max_tokens=8))


def test_the_newest_streams_yield_their_cells_and_go_on_where_they_stopped(pooled, watch,
                                                                           monkeypatch):
    engine = pooled.engine
    preempted = []
    original = engine._preempt

    def record(slot):
        preempted.append((slot.task.id, slot.state, slot.task.stats.generated_tokens))
        original(slot)

    monkeypatch.setattr(engine, "_preempt", record)
    starts = (1, 101, 201, 301)
    # four streams of ~180 cells each outgrow the 512-cell pool
    generations = [_count(pooled, start, max_tokens=150) for start in starts]
    texts = [g.text() for g in generations]
    for start, generation, text in zip(starts, generations, texts):
        assert generation.stats.generated_tokens == 150, start
        assert _counts_on(text, start), (start, text)
    assert generations[0].stats.preemptions == 0  # the oldest keeps its cells
    assert sum(g.stats.preemptions for g in generations) == engine.stats().preemptions > 0
    # streams were stopped mid-reply, and their KV rebuilt from their tokens
    assert any(state is SlotState.GENERATING and n > 0 for _, state, n in preempted)
    assert watch["peak"] <= engine.n_cells
    assert not watch["mismatch"]


def test_preempted_requests_do_not_fill_the_wait_queue(pooled, monkeypatch):
    """A request queued again by preemption is not a new arrival: the wait-queue limit
    ("busy") counts only requests that came in and have not started yet."""
    engine = pooled.engine
    late: dict = {}

    def submit_while_one_is_requeued(*_):
        stats = engine.stats()
        if "generation" in late or "refused" in late or not (stats.preemptions and stats.waiting):
            return
        try:  # on the engine thread, between steps: the preempted one is surely waiting
            late["generation"] = engine.submit(pooled.tokenize("Name a colour."),
                                               SamplingParams(temperature=0, max_tokens=4))
        except EngineBusy as exc:
            late["refused"] = exc

    streams = [_count(pooled, start, max_tokens=150) for start in (1, 101, 201, 301)]
    while engine.stats().waiting:  # all four started (their cells run out much later)
        time.sleep(0.01)
    monkeypatch.setattr(engine.queue, "max_waiting", 1)
    monkeypatch.setattr(engine, "on_step", submit_while_one_is_requeued)
    texts = [g.text() for g in streams]
    assert "refused" not in late, late.get("refused")
    assert late["generation"].text() and all(texts)


def test_a_prompt_waits_for_free_cells_though_slots_are_free(pooled, watch):
    engine = pooled.engine
    first = _count(pooled, 1, max_tokens=400)
    holding = threading.Event()
    pieces = []

    def read():
        for event in first:
            pieces.append(getattr(event, "text", ""))
            if len(pieces) == 250:
                holding.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert holding.wait(60)  # the first request now holds ~280 of 512 cells
    long_prompt = pooled.tokenize("The history of the sea. " * 60)[:250]
    second = pooled.generate(long_prompt, SamplingParams(temperature=0, max_tokens=4))
    assert second.text()
    reader.join()
    assert first.stats.preemptions == 0 and first.stats.generated_tokens == 400
    assert _counts_on("".join(pieces), 1)
    # three slots stood idle, yet the second started only when the first had finished
    assert second.stats.started_at >= first.stats.token_times[-1]
    # and the first one's cached tokens were dropped to make room
    assert sum(len(s.cache) for s in engine.slots) <= len(long_prompt) + 4
    assert watch["peak"] <= engine.n_cells
    assert not watch["mismatch"]


@pytest.mark.timeout(60)
def test_a_slot_full_of_another_prompt_makes_way_for_the_next(smollm2_path):
    """The pool's only slot still holds the last request's 200 tokens when a different
    200-token prompt comes: what it drops on starting counts as free."""
    options = LoadOptions(n_ctx=256, n_slots=1, kv_unified=True, n_threads=2)
    with LlamaCppBackend(smollm2_path, options) as backend:
        sea = backend.tokenize("The history of the sea. " * 60)[:200]
        land = backend.tokenize("A walk across the mountains. " * 60)[:200]
        for prompt in (sea, land):
            generation = backend.generate(prompt, SamplingParams(temperature=0, max_tokens=4))
            assert generation.text() and generation.stats.cached_tokens < 10
        assert len(backend.engine.slots[0].cache) == 200 + 3


def test_a_request_preempted_again_while_read_back_goes_on_where_it_stopped(pooled,
                                                                             monkeypatch):
    """The newest stream yields its cells, and yields them again before its tokens are read
    back (the pool still short): it must resume from where it stopped, not start over."""
    engine = pooled.engine
    make_room = engine.cells.before_step
    target: dict = {"preempted": 0}

    def squeeze(slots, preempt):  # where the engine preempts, just before a step
        slot = next((s for s in engine.slots if s.task and s.task.id == target.get("id")), None)
        if slot is not None:
            if not target["preempted"] and slot.task.stats.generated_tokens >= 20:
                engine._preempt(slot)
                target["preempted"] = 1
            elif target["preempted"] == 1 and slot.rebuilding:
                engine._preempt(slot)
                target["preempted"] = 2
        make_room(slots, preempt)

    older = _count(pooled, 101, max_tokens=80)  # keeps running: the target is the newest
    monkeypatch.setattr(engine.cells, "before_step", squeeze)
    generation = _count(pooled, 1, max_tokens=60)
    target["id"] = generation.id
    text = generation.text()
    assert older.text()
    assert target["preempted"] == 2
    assert generation.stats.preemptions == 2
    assert generation.stats.generated_tokens == 60
    assert _counts_on(text, 1), text
