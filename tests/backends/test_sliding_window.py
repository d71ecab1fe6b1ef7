"""A sliding-window cache kept at its window (swa_full off, the default): Gemma 3's windowed
layers hold their last n_swa tokens and a micro-batch per slot, and llama.cpp reuses the
cells the window has left behind. Cut back further than that, the sequence no longer holds
what the next token attends to, and llama.cpp says yes to the cut all the same; the engine
goes back to a context checkpoint or reads the prompt again. Judged by a fresh decode's
logits (tests/greedy.py), on the tiny random Gemma 3 (window 64; tests/families.py).

What llama.cpp does, measured here (n_batch 512, 1,500 tokens decoded in one sequence):
its windowed cache holds 768 cells (64 + 512, padded to 256), so the sequence's lowest
position held (`llama_memory_seq_pos_min`) is 732; `llama_memory_seq_rm` says yes to a cut
anywhere, and the decode after a cut at p is a fresh decode's (within ~0.02) for
p >= 732 + 63 = 795, and as far off as another prompt's below (0.8 at 733, 0.19 at 760; at
p = 100 the window's cache is left empty). A checkpoint (llama.cpp's partial state: the
window's last 64 cells, 41,872 bytes) taken at p and restored after the sequence grew to
1,500, then a cut at p, gives a fresh decode's logits for any p."""

from __future__ import annotations

import re

import llama_cpp
import numpy
import pytest

from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.engine.checkpoints import Checkpoints
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.native.model import NativeModel
from localinfer.model_store.fit import estimate_memory
from localinfer.model_store.gguf_info import read_gguf_info

from ..families import arch_model
from ..greedy import Reference
from .test_recurrent import _close, _fresh, _logits_after

pytestmark = pytest.mark.numerics

N_SWA = 64
CELLS = 768  # the windowed cache of one sequence at n_batch 512: 64 + 512, padded to 256
TAIL = Checkpoints.TAIL


@pytest.fixture(scope="module")
def path():
    return arch_model("gemma3")


@pytest.fixture(scope="module")
def reference(path):
    reference = Reference(path, n_ctx=4096)
    yield reference
    reference.close()


def _tokens(n: int, seed: int) -> list[int]:
    """n random ids of the vocabulary's ordinary middle (no control tokens)."""
    return [int(t) for t in numpy.random.default_rng(seed).integers(1000, 20000, n)]


def _decode(native: NativeModel, tokens: list[int], start: int) -> numpy.ndarray:
    batch = native.batch(512)
    try:
        for at in range(0, len(tokens), 512):
            part = tokens[at:at + 512]
            batch.n_tokens = len(part)
            for i, token in enumerate(part):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + at + i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, i == len(part) - 1
            assert native.decode(batch) == 0
    finally:
        native.free_batch(batch)
    row = llama_cpp.llama_get_logits_ith(native.ctx, -1)
    return numpy.ctypeslib.as_array(row, shape=(native.n_vocab,)).copy()


@pytest.fixture(scope="module")
def windowed(path):
    native = NativeModel(str(path), 4096, 1, 512, 2)
    yield native
    native.close()


LONG, TAIL_TOKENS = _tokens(1500, 1), _tokens(40, 2)


def test_llama_cpp_says_yes_to_a_cut_past_the_window_it_dropped(windowed, reference):
    """The facts the engine is built on (llama.cpp's behaviour; this fails if it changes)."""
    native = windowed
    assert native.windowed and native.n_swa == N_SWA and not native.can_shift()
    native.forget_all()
    _decode(native, LONG, 0)
    pos_min = llama_cpp.llama_memory_seq_pos_min(native.memory, 0)
    assert pos_min == len(LONG) - CELLS
    good, bad = pos_min + N_SWA - 1, pos_min + N_SWA - 2
    assert native.can_cut(0, good) and not native.can_cut(0, bad)
    assert not native.forget(0, 600)  # refused, and nothing dropped
    assert llama_cpp.llama_memory_seq_pos_max(native.memory, 0) == len(LONG) - 1
    # llama.cpp's own answer: yes, and the window's cache is left empty
    assert llama_cpp.llama_memory_seq_rm(native.memory, 0, 600, -1)
    assert llama_cpp.llama_memory_seq_pos_min(native.memory, 0) == -1
    wrong = _decode(native, TAIL_TOKENS, 600)
    want = _fresh(reference, LONG[:600] + TAIL_TOKENS)
    assert float(numpy.abs(wrong - want).max()) > 0.3
    native.forget_all()
    _decode(native, LONG, 0)
    assert native.forget(0, good)
    _close(_decode(native, TAIL_TOKENS, good), _fresh(reference, LONG[:good] + TAIL_TOKENS),
           wrong)


@pytest.mark.parametrize("at", [100, 1200])
def test_a_checkpoint_restored_makes_any_cut_whole_again(windowed, reference, path, at):
    native = windowed
    native.forget_all()
    _decode(native, LONG[:at], 0)
    checkpoint = native.save_partial(0)
    # the window's 64 cells, as the memory plan counts a checkpoint
    assert checkpoint is not None
    assert len(checkpoint) == read_gguf_info(path).shape().checkpoint_bytes(swa_full=False)
    _decode(native, LONG[at:], at)
    assert native.restore_partial(0, checkpoint)
    assert llama_cpp.llama_memory_seq_pos_min(native.memory, 0) == at - N_SWA
    assert native.forget(0, at)
    got = _decode(native, TAIL_TOKENS, at)
    _close(got, _fresh(reference, LONG[:at] + TAIL_TOKENS),
           _fresh(reference, LONG + TAIL_TOKENS))


# ------------------------------------------------------------------------ the engine
def _backend(path, **options) -> LlamaCppBackend:
    return LlamaCppBackend(path, LoadOptions(**{"n_ctx": 2048, **options}), name="model")


def _reply(backend, prompt: list[int], n: int) -> None:
    backend.generate(prompt, SamplingParams(temperature=1.5, seed=3, max_tokens=n,
                                            ignore_eos=True)).text()


def test_a_conversation_that_grows_keeps_its_prefix(path, reference):
    """Short replies: each next prompt leaves the cached sequence within the window and a
    micro-batch of its end, where a plain cut is whole."""
    with _backend(path) as backend:
        prompt = _tokens(900, 3)
        _reply(backend, prompt, 6)
        for turn in range(2):
            last, prompt = prompt, prompt + _tokens(20 + turn, 10 + turn)  # another reply
            got, stats = _logits_after(backend, prompt)
            assert stats.cached_tokens == len(last)
        engine = backend.stats()
    assert engine.checkpoints_restored == 0
    _close(got, _fresh(reference, prompt), _fresh(reference, prompt[:-20] + prompt[-10:]))


def test_a_long_reply_then_another_goes_back_to_a_checkpoint(path, reference):
    """A reply of 800 tokens moves the window past the prompt's end: the next prompt, with
    another reply text, restores the checkpoint saved a few tokens before that end."""
    with _backend(path) as backend:
        prompt = _tokens(900, 4)
        _reply(backend, prompt, 800)
        turn = prompt + _tokens(30, 5)
        got, stats = _logits_after(backend, turn)
        engine = backend.stats()
    _close(got, _fresh(reference, turn), _fresh(reference, prompt + turn[-12:]))
    assert stats.cached_tokens == len(prompt) - TAIL
    assert (engine.checkpoints_restored, engine.checkpoint_tokens) == (1, len(prompt) - TAIL)


@pytest.mark.parametrize("shared, cached", [
    (1000, 1500 - TAIL - 512),  # the checkpoint a chunk before the prompt's end
    (100, 0),  # none so early: read again
])
def test_a_prompt_that_diverges_further_back_is_never_answered_from_a_broken_window(
        path, reference, shared, cached):
    """After 1,500 prompt tokens and a reply of 400 the window's cache holds positions from
    about 1,136: a prompt that shares the first 1,000 cannot be cut there."""
    with _backend(path) as backend:
        _reply(backend, LONG, 400)
        prompt = LONG[:shared] + _tokens(50, 6)
        got, stats = _logits_after(backend, prompt)
    _close(got, _fresh(reference, prompt), _fresh(reference, LONG[:shared + 20] + prompt[-30:]))
    assert stats.cached_tokens == cached


def test_with_swa_full_every_prefix_is_kept(path, reference):
    with _backend(path, swa_full=True) as backend:
        assert not backend.native.windowed and backend.native.can_shift()
        _reply(backend, LONG, 4)
        prompt = LONG[:100] + _tokens(50, 6)
        got, stats = _logits_after(backend, prompt)
    assert stats.cached_tokens == 100
    _close(got, _fresh(reference, prompt), _fresh(reference, LONG[:120] + prompt[-30:]))


def test_speculation_on_a_window_gives_the_reference_decode(path, reference):
    """Guesses rejected are cut within the last decode, whose window is whole: the reply is
    the reference's, past where the window's cache reuses cells."""
    with _backend(path, draft_tokens=4) as backend:
        prompt = LONG[:1000]
        generation = backend.generate(prompt, SamplingParams(temperature=0, max_tokens=40))
        text = generation.text()
    assert reference.follows(prompt, text, generation.stats.finish_reason) > 8


def test_the_plan_counts_the_window_the_engine_allocates(path, caplog):
    """The load's KV (llama.cpp's log) is what the plan counts by default: the full layer
    at 2 x 2,048 cells, the five windowed ones at 768 a slot."""
    caplog.set_level("DEBUG", logger="localinfer.llama_cpp")
    with _backend(path, n_slots=2) as backend:
        assert backend.native.windowed
    text = caplog.text
    swa = re.search(r"creating +SWA KV cache, size = (\d+) cells", text)
    assert swa and int(swa[1]) == CELLS
    kv = sum(float(m) for m in re.findall(r"KV buffer size =\s+([\d.]+) MiB", text))
    planned = estimate_memory(read_gguf_info(path), 2048, 2).kv_cache / 2 ** 20
    assert abs(planned - kv) <= max(0.05 * kv, 0.02), (planned, kv)
