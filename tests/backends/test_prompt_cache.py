"""Prompts saved in RAM when their slot takes another request, and put back when they come
back (engine/prompt_cache.py; llama-server's --cache-ram). One slot and several
conversations: each new one takes the slot, and a conversation's next turn finds its
sequence saved, put back, and reads only what is new. Judged by the cached count and by the
logits of the prompt's last token against a fresh decode of the whole prompt (tests/greedy.py's
reference); a recurrent or hybrid state put back, and cut back to a checkpoint it carried,
a sliding-window and a mixture-of-experts state the same way (random-weight Qwen3.5, Mamba2,
Gemma 3 and Qwen3-MoE shapes, tests/families.py)."""

from __future__ import annotations

import ctypes
import time

import psutil
import pytest

from localinfer.backends.base import SamplingParams
from localinfer.backends.engine.checkpoints import Checkpoints
from localinfer.backends.engine.draft import common_prefix
from localinfer.backends.engine.prompt_cache import PromptCache
from localinfer.backends.engine.step_budget import StepBudget
from localinfer.model_store.hardware import mapped_file_bytes

from ..families import arch_model
from ..greedy import Reference, eog_ban
from .test_recurrent import TEXT, _backend, _close, _fresh, _logits_after

NUMBERS = "A list of numbers: " + " ".join(str(n) for n in range(60))
WORDS = "Words in a row: " + " ".join(f"word{n}" for n in range(60))
COLOURS = "Colours: " + " ".join(f"red{n} blue{n}" for n in range(40))
MORE = " And then what happened?"


def _one_slot(path, **options):
    return _backend(path, n_slots=1, **options)


def _prompts(backend, n: int = 80) -> list[list[int]]:
    """Four conversations' prompts of `n` tokens each (equal, so their saved states are of
    one size), none sharing more than the start of sequence with another."""
    return [backend.tokenize(text)[:n] for text in (TEXT * 2, NUMBERS, WORDS, COLOURS)]


def _first_again(backend, more: list[int] | None = None):
    """Two conversations in one slot, then the first's again (with `more` after it): both
    prompts, that turn's logits and stats (its cached tokens), and the engine's."""
    a, b, *_ = _prompts(backend)
    _logits_after(backend, a)
    _logits_after(backend, b)
    got, stats = _logits_after(backend, a + (more or []))
    return a, b, got, stats, backend.stats()


@pytest.mark.parametrize("unified", [False, True])
def test_a_conversation_that_comes_back_is_put_back_not_read_again(
        smollm2_path, smollm2_reference, unified):
    """Without a saved copy, the first conversation's next turn found the slot holding the
    second and read its whole prompt again. The same in one pool of cells (--kv-unified)."""
    with _one_slot(smollm2_path, kv_unified=unified) as backend:
        more = backend.tokenize(MORE, add_special=False)
        a, b, got, stats, engine = _first_again(backend, more)
    assert stats.cached_tokens == len(a)
    assert (engine.prompts_saved, engine.prompts_restored, engine.restored_tokens) == (
        2, 1, len(a))  # (a when b came, b when a came back)
    assert engine.saved_bytes > 0  # b's
    _close(got, _fresh(smollm2_reference, a + more), _fresh(smollm2_reference, b + more))


def test_in_one_pool_an_idle_prefix_giving_its_cells_back_is_saved_first(
        smollm2_path, smollm2_reference):
    """--kv-unified, 2 slots of 128 tokens: a 200-token prompt takes the cells of the idle
    100-token one beside it, which is saved before it goes, and put back when it returns."""
    with _backend(smollm2_path, n_ctx=128, n_slots=2, kv_unified=True) as backend:
        a = backend.tokenize(TEXT * 2)[:100]
        b = backend.tokenize(NUMBERS + WORDS)[:200]
        assert len(b) == 200
        _logits_after(backend, a)
        _logits_after(backend, b)
        assert backend.stats().prompts_saved == 1
        got, stats = _logits_after(backend, a)
        engine = backend.stats()
    assert stats.cached_tokens == len(a) - 1 and engine.prompts_restored == 1
    _close(got, _fresh(smollm2_reference, a), _fresh(smollm2_reference, b))


def test_a_new_chat_takes_an_empty_slot_not_one_whose_chat_shares_its_first_tokens(
        smollm2_path):
    """Two slots, nothing saved to RAM: a second chat that shares only its first words with
    the first took the first's slot (its few cached tokens won), and the first chat's next
    turn read its prompt again; now it takes the empty slot, and the first stays cached."""
    with _backend(smollm2_path, n_slots=2, cache_ram=0) as backend:
        a, b = (backend.tokenize("Chat log. " + text)[:80] for text in (TEXT * 2, NUMBERS))
        assert a[:3] == b[:3]
        _logits_after(backend, a)
        _logits_after(backend, b)
        _, stats = _logits_after(backend, a)
    assert stats.cached_tokens == len(a) - 1


def test_a_prompt_sent_again_goes_back_to_its_slot_past_a_long_reply(smollm2_path):
    """The same prompt again (a regenerated reply): its slot holds it and a reply longer
    than it, which the request drops; it still goes there, not to the least recently used
    slot, where it would read its whole prompt."""
    with _backend(smollm2_path, n_slots=2, cache_ram=0) as backend:
        a, b = (backend.tokenize(text)[:20] for text in (TEXT, NUMBERS))
        _logits_after(backend, b)
        backend.generate(a, SamplingParams(temperature=0, max_tokens=40,
                                           logit_bias=eog_ban(backend.native))).text()
        _, stats = _logits_after(backend, a)
    assert stats.cached_tokens == len(a) - 1


def test_off_and_too_small_a_cap_save_nothing(smollm2_path):
    for mib in (0, 1):  # (80 tokens of smollm2's cache take 1.8 MB)
        with _one_slot(smollm2_path, cache_ram=mib) as backend:
            *_, stats, engine = _first_again(backend)
        assert stats.cached_tokens <= 1, mib  # (the start of sequence)
        assert (engine.prompts_saved, engine.prompts_restored, engine.saved_bytes) == (0, 0, 0)


def test_nothing_is_saved_that_would_leave_the_machine_short_of_memory(smollm2_path,
                                                                      monkeypatch):
    """Under the cap, but a save would leave less than RAM_FLOOR available (here the floor
    is all the machine has): nothing is copied."""
    monkeypatch.setattr(PromptCache, "RAM_FLOOR", psutil.virtual_memory().total)
    with _one_slot(smollm2_path) as backend:
        *_, stats, engine = _first_again(backend)
    assert stats.cached_tokens <= 1
    assert (engine.prompts_saved, engine.saved_bytes) == (0, 0)


@pytest.mark.skipif(not mapped_file_bytes(), reason="a system that counts mapped files as used")
def test_nothing_is_saved_into_the_memory_the_weights_are_read_from(smollm2_path, monkeypatch):
    """The model's weights are mapped from its file, and Linux counts them as available:
    with a floor that only that count clears, nothing is copied (it would push the weights
    out of RAM, to be read from the disk at every step)."""
    with _one_slot(smollm2_path) as backend:
        mapped = mapped_file_bytes()  # (the weights among them)
        if mapped < 64 << 20:  # (a CPU that copied them out of the file, to its own layout)
            pytest.skip("the weights are not mapped from their file here")
        monkeypatch.setattr(PromptCache, "RAM_FLOOR",
                            psutil.virtual_memory().available - mapped // 2)
        *_, stats, engine = _first_again(backend)
    assert stats.cached_tokens <= 1
    assert (engine.prompts_saved, engine.saved_bytes) == (0, 0)


def test_saved_prompts_are_given_back_when_memory_runs_short(smollm2_path, monkeypatch):
    """Two conversations saved; then the machine's memory runs short (here: a floor of all
    that is available). At the next save the copies are let go, oldest first, and nothing
    new is kept; the conversation put back just before still reads only what is new."""
    with _one_slot(smollm2_path) as backend:
        a, b, c, _ = _prompts(backend)
        prompts = backend.engine.prompts
        for prompt in (a, b, c):
            _logits_after(backend, prompt)
        assert len(prompts) == 2  # a's and b's
        monkeypatch.setattr(PromptCache, "RAM_FLOOR", psutil.virtual_memory().available)
        _, stats = _logits_after(backend, a)  # a put back; c's save finds memory short
        kept, engine = (len(prompts), prompts.bytes), backend.stats()
    assert stats.cached_tokens == len(a) - 1
    assert (*kept, engine.saved_bytes) == (0, 0, 0)


def test_saved_prompts_are_given_back_while_no_request_comes(smollm2_path, monkeypatch):
    """Copies kept and the server idle: while memory is to spare they stay; once it runs
    short (here: a floor of all that is available) they are let go within CHECK_S, with no
    save to wait for."""
    monkeypatch.setattr(PromptCache, "CHECK_S", 0.2)
    with _one_slot(smollm2_path) as backend:
        a, b, c, _ = _prompts(backend)
        prompts = backend.engine.prompts
        for prompt in (a, b, c):
            _logits_after(backend, prompt)
        time.sleep(0.6)
        assert len(prompts) == 2  # a's and b's, kept
        monkeypatch.setattr(PromptCache, "RAM_FLOOR", psutil.virtual_memory().available)
        deadline = time.monotonic() + 10
        while prompts.bytes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (len(prompts), backend.stats().saved_bytes) == (0, 0)


def test_the_oldest_saved_go_first_past_the_cap(smollm2_path):
    """Room for two saved sequences: after four conversations the first is gone (read again
    when it comes back), the second is put back."""
    with _one_slot(smollm2_path) as backend:
        a, b, c, d = _prompts(backend)
        prompts = backend.engine.prompts
        _logits_after(backend, a)
        _logits_after(backend, b)
        one = prompts.bytes  # a's state
        prompts.max_bytes = 2 * one + one // 2
        _logits_after(backend, c)
        _logits_after(backend, d)  # c saved: a goes
        assert (len(prompts), prompts.bytes) == (2, 2 * one)
        _, kept = _logits_after(backend, b)  # (d saved beside c)
        _, gone = _logits_after(backend, a)  # (b saved: c goes)
        assert prompts.bytes <= prompts.max_bytes
    assert gone.cached_tokens <= 1
    assert kept.cached_tokens == len(b) - 1  # (the last token is read again for its logits)


def test_a_state_llama_cpp_will_not_take_back_is_read_again(smollm2_path, smollm2_reference,
                                                            monkeypatch):
    """llama.cpp reads a saved state and finds it short (here it is given half of it): the
    sequence is then empty, and the prompt must be read whole, not answered from what the
    engine believed the slot held; the saved copy stays."""
    with _one_slot(smollm2_path) as backend:
        native = backend.native
        real = native.restore_sequence
        monkeypatch.setattr(native, "restore_sequence", lambda seq, data: real(
            seq, (ctypes.c_uint8 * (len(data) // 2)).from_buffer(data)))
        a, b, got, stats, engine = _first_again(backend)
        kept = len(backend.engine.prompts)
    assert stats.cached_tokens == 0 and engine.prompts_restored == 0
    assert kept == 2  # a's copy kept, and b's saved before the attempt
    _close(got, _fresh(smollm2_reference, a), _fresh(smollm2_reference, b))


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ["qwen35", "mamba2"])
def test_a_recurrent_state_comes_back_with_its_checkpoints(arch):
    """A recurrent state saved whole, put back for a turn that goes on from it (all of it
    cached), and for one that leaves it before its end (cut back to the checkpoint the slot
    had saved a few tokens before that end, carried with it)."""
    path = arch_model(arch)
    reference = Reference(path)
    try:
        with _one_slot(path) as backend:
            a, b, *_ = _prompts(backend)
            more = backend.tokenize(MORE, add_special=False)
            _logits_after(backend, a)
            _logits_after(backend, b)
            got, grown = _logits_after(backend, a + more)
            _close(got, _fresh(reference, a + more), _fresh(reference, b + more))
            _logits_after(backend, b)  # (a + more saved, with its checkpoints)
            cut = a + more[:-2] + backend.tokenize(" No.", add_special=False)
            got, rewritten = _logits_after(backend, cut)
            _close(got, _fresh(reference, cut), _fresh(reference, b + more))
            engine = backend.stats()
    finally:
        reference.close()
    assert grown.cached_tokens == len(a)
    assert rewritten.cached_tokens == len(a + more) - Checkpoints.TAIL
    assert engine.prompts_restored >= 2


@pytest.mark.numerics
@pytest.mark.parametrize("arch", ["gemma3", "qwen3moe"])
def test_a_sliding_window_or_mixture_of_experts_state_comes_back(arch):
    """Gemma 3's shape (its windowed layers keep only their window: llama.cpp writes and
    reads both of its caches) and a mixture of experts (Qwen3-MoE's): a conversation put
    back gives a fresh decode's logits."""
    path = arch_model(arch)
    reference = Reference(path)
    try:
        with _one_slot(path) as backend:
            assert backend.native.windowed == (arch == "gemma3")
            more = backend.tokenize(MORE, add_special=False)
            a, b, got, grown, engine = _first_again(backend, more)
            _close(got, _fresh(reference, a + more), _fresh(reference, b + more))
    finally:
        reference.close()
    assert grown.cached_tokens == len(a) and engine.prompts_restored == 1


@pytest.mark.numerics
def test_a_recurrent_state_cut_back_past_its_checkpoints_is_saved_first():
    """A new chat shares most of the slot's hybrid state (a long common start), but no
    checkpoint lies within what it shares: the state is dropped whole, so it is saved
    first, however much the prompts share, and comes back when its chat does."""
    path = arch_model("qwen35")
    with _one_slot(path) as backend:
        a = backend.tokenize(TEXT * 2)[:80]
        b = a[:60] + backend.tokenize(NUMBERS, add_special=False)[:20]
        more = backend.tokenize(MORE, add_special=False)
        _logits_after(backend, a)
        _, other = _logits_after(backend, b)
        _, back = _logits_after(backend, a + more)
        engine = backend.stats()
    assert other.cached_tokens == 0  # (a's checkpoints lie past 60)
    assert back.cached_tokens == len(a) and engine.prompts_restored == 1


def _long_then_other(backend) -> tuple[list[int], list[int]]:
    """A 200-token conversation, saved when another (returned second) takes the slot."""
    a, b = backend.tokenize(TEXT * 4)[:200], backend.tokenize(NUMBERS)
    assert len(a) == 200
    _logits_after(backend, a)
    _logits_after(backend, b)
    return a, b


def _short_prefix_of_a_long_state(backend):
    """A 200-token sequence saved, then a prompt keeping its first 40 (under a quarter of
    it): the prompt, its logits and numbers, the engine's, and the first sequence."""
    a, b = _long_then_other(backend)
    assert 4 * 40 < len(a) and PromptCache.MIN_TOKENS < 40
    prompt = a[:40] + b[1:20]
    got, stats = _logits_after(backend, prompt)
    return prompt, got, stats, backend.stats(), a


def test_a_short_prefix_brings_back_a_long_state_where_reading_it_costs_more(
        smollm2_path, smollm2_reference):
    """Copying 200 tokens' state back (4.6 MB) takes a fraction of what reading 39 prompt
    tokens does on a CPU: the quarter rule alone (llama-server's) read them again."""
    with _one_slot(smollm2_path) as backend:
        prompt, got, stats, engine, a = _short_prefix_of_a_long_state(backend)
        assert backend.engine.budget.per_token_s is not None  # measured on a's prompt
    assert stats.cached_tokens == 40 and engine.prompts_restored == 1
    _close(got, _fresh(smollm2_reference, prompt), _fresh(smollm2_reference, a))


def test_a_short_prefix_leaves_a_long_state_where_reading_it_costs_less(
        smollm2_path, monkeypatch):
    """Where prompt tokens cost next to nothing (a GPU's), the quarter rule stands: a
    saved sequence is put back only where the prompt keeps a quarter of it."""
    monkeypatch.setattr(StepBudget, "per_token_s", property(lambda self: 1e-9))
    with _one_slot(smollm2_path) as backend:
        _, _, stats, engine, _ = _short_prefix_of_a_long_state(backend)
    assert stats.cached_tokens <= 1 and engine.prompts_restored == 0


def test_a_saved_conversation_that_lends_its_start_to_another_prompt_stays_saved(
        smollm2_path, smollm2_reference):
    """A prompt keeping the first 60 of a saved 200-token conversation has it copied back
    and cut to those 60; the saved copy went with it, and the conversation's next turn
    found 60 tokens cached. It stays saved, and that turn finds all 200."""
    with _one_slot(smollm2_path) as backend:
        more = backend.tokenize(MORE, add_special=False)
        a, b = _long_then_other(backend)
        _, lent = _logits_after(backend, a[:60] + b[1:20])
        got, back = _logits_after(backend, a + more)
        engine = backend.stats()
    assert lent.cached_tokens == 60 and back.cached_tokens == len(a)
    assert engine.prompts_restored == 2
    _close(got, _fresh(smollm2_reference, a + more), _fresh(smollm2_reference, b + more))


def test_a_lent_state_llama_cpp_will_not_take_back_stays_saved_once(smollm2_path,
                                                                    monkeypatch):
    """A saved conversation lending its start stays saved while it is copied back; where
    llama.cpp will not take the copy, it is kept as it was, not a second time."""
    with _one_slot(smollm2_path) as backend:
        native = backend.native
        real = native.restore_sequence
        monkeypatch.setattr(native, "restore_sequence", lambda seq, data: real(
            seq, (ctypes.c_uint8 * (len(data) // 2)).from_buffer(data)))
        a, b = _long_then_other(backend)
        _, lent = _logits_after(backend, a[:60] + b[1:20])
        engine, saved = backend.stats(), backend.engine.prompts._saved
        lengths, size = sorted(len(s.tokens) for s in saved), sum(s.size for s in saved)
    assert lent.cached_tokens == 0 and engine.prompts_restored == 0
    assert lengths == sorted([len(a), len(b)])  # a once, and b, saved as it left
    assert engine.saved_bytes == size


class _States:
    """What the prompt cache asks of a model here: every sequence's state is `size` bytes."""
    stateful = windowed = False

    def __init__(self, size: int):
        self.size = size

    def save_sequence(self, seq: int, limit: int | None = None) -> ctypes.Array | None:
        return None if limit is not None and self.size > limit else (ctypes.c_uint8 * self.size)()


def test_a_burst_of_saves_looks_at_the_memory_once(monkeypatch):
    """Reading the memory available asks every process of the machine; a burst of new
    requests saves a slot each. Saves within FRESH_S of a look take its figure, less what
    they saved since: one look for the burst, and the floor still holds. Later saves look
    again."""
    from localinfer.backends.engine import prompt_cache
    from localinfer.backends.engine.slots import Slot

    size, looks = 1 << 20, []
    monkeypatch.setattr(prompt_cache, "ram_available",
                        lambda: looks.append(1) or PromptCache.RAM_FLOOR + 5 * size // 2)
    cache = PromptCache(_States(size), max_bytes=64 * size)
    cache.FRESH_S = 0.2
    for i in range(4):
        cache.save(Slot(i, cache=list(range(100 * i, 100 * i + 20))))
    assert (len(looks), cache.saves, cache.bytes) == (1, 2, 2 * size)  # a third: below the floor
    time.sleep(0.25)
    cache.save(Slot(5, cache=list(range(500, 520))))
    assert (len(looks), cache.saves) == (2, 3)  # (the memory looked at: 2.5 MiB to spare again)


class _Sized(_States):
    """As _States, each slot's state of the size set for it (`sizes[slot id]`)."""

    def __init__(self, stateful: bool = False):
        super().__init__(0)
        self.stateful, self.sizes = stateful, {}

    def save_sequence(self, seq: int, limit: int | None = None) -> ctypes.Array | None:
        return (ctypes.c_uint8 * self.sizes[seq])()


def _chosen(cache: PromptCache, tokens, limit, have, room, token_s):
    """The rule swap follows, by looking at every saved sequence: the one a slot keeps the
    most of (more than `have` and than MIN_TOKENS), fitting `room`, worth copying; of
    those keeping as many, the least to copy, then the oldest."""
    ranked = []
    for age, saved in enumerate(cache._saved):  # (oldest first)
        n = cache._keeps(saved, min(limit, next(
            (i for i, (a, b) in enumerate(zip(saved.tokens, tokens)) if a != b),
            min(len(saved.tokens), len(tokens)))))
        if (n > max(have, PromptCache.MIN_TOKENS - 1) and len(saved.tokens) <= room
                and cache._worth_copying(saved, n, n - have, token_s)):
            ranked.append(((n, -len(saved.data), -age), saved))
    return max(ranked, key=lambda r: r[0])[1] if ranked else None


@pytest.mark.parametrize("stateful", [False, True])
def test_the_saved_sequence_put_back_is_found_without_comparing_each(stateful):
    """Saved sequences are kept in order of their tokens, and a prompt is compared only
    with its neighbours there, a level at a time (with 1,000 saved behind one 500-token
    system prompt, each request compared with every one took 7.6 ms, three times). Checked
    against a look at each saved sequence, on conversations branching from shared starts
    at random (a recurrent model's: kept back to a checkpoint), saved, dropped past the cap
    and given back in turn; none saved is the start of another, in order or not."""
    import random

    from localinfer.backends.engine.slots import Checkpoint, Slot

    rng = random.Random(7)
    states = _Sized(stateful)
    cache = PromptCache(states, max_bytes=60_000)
    stems = [[rng.randrange(4) for _ in range(8 * rng.randrange(0, 5))] for _ in range(6)]
    seen: list[list[int]] = []

    def conversation():
        """A new one from a shared start, or one seen before: its next turn, or its start."""
        if seen and rng.random() < 0.5:
            tokens = list(rng.choice(seen))
            if rng.random() < 0.2:
                return tokens[:rng.randrange(PromptCache.MIN_TOKENS, len(tokens) + 1)]
        else:
            tokens = list(rng.choice(stems))
        while len(tokens) < PromptCache.MIN_TOKENS or rng.random() < 0.5:
            tokens += [rng.randrange(4) for _ in range(8 * rng.randrange(1, 4))]
        seen.append(tokens)
        return tokens

    looked = 0
    for step in range(1500):
        tokens = conversation()
        if rng.random() < 0.5:
            slot = Slot(step % 8, cache=tokens)
            if stateful:
                slot.checkpoints = [Checkpoint(n, (ctypes.c_uint8 * 8)())
                                    for n in range(8, len(tokens), 8) if rng.random() < 0.5]
            states.sizes[slot.id] = rng.choice([500, 1000, 2000])
            cache.save(slot)
        limit, have = len(tokens) - rng.choice([0, 1]), rng.randrange(0, 30)
        room = rng.choice([10**6, 60])
        token_s = rng.choice([None, 1e-3, 1e-6])
        best, shared = cache._best(tokens, limit, have, room, token_s)
        assert best is _chosen(cache, tokens, limit, have, room, token_s)
        looked += best is not None
        order = cache._order  # (a sequence that starts another comes just before one that does)
        assert not any(common_prefix(a.tokens, b.tokens) == len(a.tokens)
                       for a, b in zip(order, order[1:]))
        if best is not None:
            assert shared == cache._keeps(best, min(limit, common_prefix(best.tokens, tokens)))
            if rng.random() < 0.2:
                cache._drop([best])
    assert looked > 300 and len(cache) > 20  # (the rule was put to the test)
    assert cache._order == sorted(cache._saved, key=lambda s: s.tokens)
    assert set(map(id, cache._order)) == set(map(id, cache._saved))
    assert cache.bytes == sum(s.size for s in cache._saved)


def test_the_shared_start_of_two_sequences_is_counted_to_the_token():
    """common_prefix compares blocks of 256, 64, 16, 4 and 1 tokens: against a comparison
    token by token, for sequences differing at and around every block's edge, of lengths
    on both sides of them, as lists and as other sequences."""
    base = list(range(1000, 1700))
    for at in sorted({0, 1, 699} | {e + d for e in (4, 16, 64, 256, 512) for d in (-1, 0, 1)}):
        for length in (at, at + 1, 700):
            other = base[:at] + [0] * (length - at)
            want = next((i for i, (x, y) in enumerate(zip(base, other)) if x != y),
                        min(len(base), len(other)))
            assert common_prefix(base, other) == common_prefix(other, base) == want
            assert common_prefix(tuple(base), other) == want
