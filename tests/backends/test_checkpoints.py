"""Context checkpoints: a recurrent or hybrid model's slot saves its recurrent state near each
prompt's end, and a next prompt that leaves the cached sequence before its end goes back to
the newest checkpoint at or before the shared prefix, reading only the rest (checkpoints.py).
Judged by what a fresh decode of the prompt gives (its logits), and by the cached count.
Random-weight models of Qwen3.5's hybrid and Mamba2's shapes (tests/families.py)."""

from __future__ import annotations

import ctypes

import pytest

from localinfer.backends.base import SamplingParams
from localinfer.backends.engine.checkpoints import Checkpoints
from localinfer.backends.engine.slots import Slot

from ..families import arch_model
from ..greedy import Reference
from .test_recurrent import TEXT, _backend, _close, _fresh, _logits_after

TAIL = Checkpoints.TAIL


@pytest.fixture(scope="module", params=["qwen35", "mamba2"])
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def path(arch):
    return arch_model(arch)


@pytest.fixture(scope="module")
def reference(path):
    reference = Reference(path)
    yield reference
    reference.close()


def _reply(backend, prompt: list[int], n: int = 6) -> None:
    """A sampled reply (a random model's greedy text repeats one token)."""
    backend.generate(prompt, SamplingParams(temperature=1.5, seed=3, max_tokens=n)).text()


def test_a_turn_whose_reply_came_back_otherwise_goes_back_to_a_checkpoint(path, reference):
    """The next turn holds the prompt, another reply text than the one generated (a client
    that trimmed it, a template that strips reasoning) and a new question: the state cannot
    be cut back to the prompt's end, so it was read again whole; now the checkpoint saved a
    few tokens before that end is restored and only the rest is read."""
    with _backend(path) as backend:
        prompt = backend.tokenize(TEXT * 2)
        _reply(backend, prompt)
        turn = prompt + backend.tokenize(" A different reply.\nUser: and then?\nAssistant:",
                                         add_special=False)
        got, stats = _logits_after(backend, turn)
        engine = backend.stats()
    assert stats.cached_tokens == len(prompt) - TAIL
    assert (engine.checkpoints_restored, engine.checkpoint_tokens) == (1, len(prompt) - TAIL)
    _close(got, _fresh(reference, turn),
           _fresh(reference, prompt + prompt[-8:] + turn[len(prompt):]))


def test_a_chat_that_grows_reads_each_turn_from_a_checkpoint_of_the_last(path, arch,
                                                                         reference):
    """Qwen3.5's own template: each prompt ends in `<|im_start|>assistant\n<think>\n`, and
    the next one renders the reply that came back without its reasoning; each turn goes
    back to the checkpoint a few tokens before the last prompt's end."""
    if arch != "qwen35":
        pytest.skip("the hybrid's chat template")
    messages = [{"role": "system", "content": "You answer in one line."},
                {"role": "user", "content": "Where did the market move?"}]
    cached, lengths = [], []
    with _backend(path) as backend:
        for turn in range(3):
            prompt = backend.tokenize(backend.apply_chat_template(messages))
            generation = backend.generate(prompt, SamplingParams(temperature=1.5, seed=turn,
                                                                 max_tokens=10))
            generation.text()
            cached.append(generation.stats.cached_tokens)
            lengths.append(len(prompt))
            messages += [{"role": "assistant", "content": f"<think>\nhm\n</think>\n\nUp the "
                                                          f"hill, reply {turn}."},
                         {"role": "user", "content": f"And then {turn}?"}]
        last = backend.tokenize(backend.apply_chat_template(messages))
        got, stats = _logits_after(backend, last)
    assert cached == [0] + [n - TAIL for n in lengths[:-1]]
    assert stats.cached_tokens == lengths[-1] - TAIL
    _close(got, _fresh(reference, last), _fresh(reference, last[:lengths[-1]] + last[-12:]))


def test_the_same_prompt_twice_reads_only_its_tail(path, reference):
    with _backend(path) as backend:
        prompt = backend.tokenize(TEXT)
        _reply(backend, prompt)
        got, stats = _logits_after(backend, prompt)
    assert stats.cached_tokens == len(prompt) - TAIL
    _close(got, _fresh(reference, prompt), _fresh(reference, prompt + prompt[-6:]))


def test_without_checkpoints_such_a_turn_is_read_again(path, reference):
    with _backend(path, ctx_checkpoints=0) as backend:
        prompt = backend.tokenize(TEXT)
        _reply(backend, prompt)
        turn = prompt + backend.tokenize(" Another reply. Go on.", add_special=False)
        got, stats = _logits_after(backend, turn)
        engine = backend.stats()
    assert stats.cached_tokens == 0 and engine.checkpoints_restored == 0
    _close(got, _fresh(reference, turn), _fresh(reference, prompt + turn[-12:]))


def test_a_conversation_that_drops_a_middle_turn_goes_back_before_it(path, reference):
    """Three turns leave checkpoints near the end of each prompt; a prompt without the
    second turn's text goes back to the checkpoint before it (never to a later one, whose
    state holds the dropped text)."""
    with _backend(path) as backend:
        first = backend.tokenize(TEXT)
        middle = backend.tokenize(" A list of numbers: " + " ".join(str(n) for n in range(30)),
                                  add_special=False)
        last = backend.tokenize(" And the rest of the story, told backwards.",
                                add_special=False)
        _reply(backend, first)
        _reply(backend, first + middle)
        got, stats = _logits_after(backend, first + last)
    assert stats.cached_tokens == len(first) - TAIL
    _close(got, _fresh(reference, first + last), _fresh(reference, first + middle + last))


def test_a_checkpoint_llama_cpp_refuses_reads_the_prompt_again(path, reference):
    """A restore that fails (here a checkpoint cut short) is a full re-read, not a state
    half put back."""
    with _backend(path) as backend:
        prompt = backend.tokenize(TEXT)
        _reply(backend, prompt)
        slot = backend.engine.slots[0]
        (checkpoint,) = slot.checkpoints
        checkpoint.data = (ctypes.c_uint8 * (len(checkpoint.data) // 2)).from_buffer_copy(
            checkpoint.data, 0)
        turn = prompt + backend.tokenize(" Another reply. Go on.", add_special=False)
        got, stats = _logits_after(backend, turn)
        engine = backend.stats()
    assert stats.cached_tokens == 0 and engine.checkpoints_restored == 0
    _close(got, _fresh(reference, turn), _fresh(reference, prompt + turn[-12:]))


def test_a_hybrid_that_speculates_goes_back_to_a_checkpoint_too(reference, path, arch):
    """llama.cpp's rollback snapshots (speculative decoding on a hybrid) are reset by a
    restore: the state is the checkpoint's."""
    if arch != "qwen35":
        pytest.skip("a pure recurrent model does not speculate")
    with _backend(path, draft_tokens=4) as backend:
        prompt = backend.tokenize(TEXT * 2)
        backend.generate(prompt, SamplingParams(temperature=1.5, seed=7, max_tokens=20)).text()
        turn = prompt + backend.tokenize(" Not what was written. Next?", add_special=False)
        got, stats = _logits_after(backend, turn)
    assert stats.cached_tokens == len(prompt) - TAIL
    _close(got, _fresh(reference, turn), _fresh(reference, prompt + turn[-10:]))


# ----------------------------------------------------------------- the policy, as data
class _Memory:
    """What the policy asks of llama.cpp: a state of `size` bytes; every answer yes."""
    stateful = True
    windowed = False

    def __init__(self, size: int = 100):
        self.size = size
        self.restored: list[int] = []

    def save_partial(self, seq: int, limit: int | None = None) -> ctypes.Array | None:
        if limit is not None and self.size > limit:
            return None
        return (ctypes.c_uint8 * self.size)()

    def restore_partial(self, seq: int, data: ctypes.Array) -> bool:
        return True

    def forget(self, seq: int, start: int = -1, end: int = -1) -> bool:
        self.restored.append(start)
        return True


def _read(policy: Checkpoints, slot: Slot, n_prompt: int, chunk: int) -> list[int]:
    """Read a prompt of n_prompt tokens as the engine does, `chunk` at most a step: where
    each step's chunk ends."""
    ends, prompt = [], list(range(n_prompt))
    while len(slot.cache) < n_prompt:
        end = policy.before_chunk(slot, prompt, min(n_prompt, len(slot.cache) + chunk))
        slot.cache.extend(prompt[len(slot.cache):end])
        ends.append(end)
    return ends


@pytest.mark.parametrize("n_prompt, chunk, ends, saved", [
    (100, 512, [96, 100], [96]),  # a few tokens before the end
    (700, 512, [184, 696, 700], [184, 696]),  # and a chunk before that
    (4, 512, [4], []),  # too short for any
    (2100, 512, [512, 1024, 1536, 1584, 2096, 2100], [1024, 1584, 2096]),  # every 1000
])
def test_checkpoints_are_saved_near_the_prompts_end_and_every_so_often(n_prompt, chunk, ends,
                                                                       saved):
    policy, slot = Checkpoints(_Memory(), 8, chunk, every=1000), Slot(0)
    assert _read(policy, slot, n_prompt, chunk) == ends
    assert [c.n_tokens for c in slot.checkpoints] == saved


def test_a_slot_keeps_at_most_its_count_and_bytes_of_checkpoints_the_newest():
    by_count, slot = Checkpoints(_Memory(100), 2, 10, every=20), Slot(0)
    _read(by_count, slot, 95, 10)
    assert [c.n_tokens for c in slot.checkpoints] == [81, 91]
    by_bytes, slot = Checkpoints(_Memory(100), 8, 10, max_bytes=350, every=20), Slot(0)
    _read(by_bytes, slot, 95, 10)
    assert [c.n_tokens for c in slot.checkpoints] == [80, 81, 91]
    too_big, slot = Checkpoints(_Memory(400), 8, 10, max_bytes=350), Slot(0)
    _read(too_big, slot, 95, 10)
    assert slot.checkpoints == []


def test_with_no_cap_set_a_slot_keeps_two_checkpoints_larger_than_the_default_cap(
        monkeypatch):
    import localinfer.model_store.shape as shape

    monkeypatch.setattr(shape, "CHECKPOINT_CAP", 350)  # as 256 MiB to a 416 MiB window
    automatic, slot = Checkpoints(_Memory(400), 8, 10, every=20), Slot(0)
    _read(automatic, slot, 95, 10)
    assert [c.n_tokens for c in slot.checkpoints] == [81, 91]  # the two newest
    small, slot = Checkpoints(_Memory(100), 8, 10, every=20), Slot(0)
    _read(small, slot, 95, 10)
    assert [c.n_tokens for c in slot.checkpoints] == [80, 81, 91]  # within the default cap


def test_a_cut_goes_back_to_the_newest_checkpoint_at_or_before_it():
    memory = _Memory()
    policy, slot = Checkpoints(memory, 8, 10, every=20), Slot(0)
    _read(policy, slot, 95, 10)  # (at 20, 40, 60, 80, 81, 91)
    assert [policy.best(slot, n) for n in (19, 20, 79, 95)] == [0, 20, 60, 91]
    assert policy.restore(slot, 79) == 60 and memory.restored == [60]
    assert policy.restore(slot, 10) == 0
    Checkpoints.drop_past(slot, 60)
    assert [c.n_tokens for c in slot.checkpoints] == [20, 40, 60]
    assert (policy.restored, policy.restored_tokens) == (1, 60)


def test_a_model_that_can_cut_its_memory_keeps_none():
    class Transformer(_Memory):
        stateful = False

    policy, slot = Checkpoints(Transformer(), 8, 10, every=20), Slot(0)
    _read(policy, slot, 95, 10)
    assert slot.checkpoints == [] and not policy.on
