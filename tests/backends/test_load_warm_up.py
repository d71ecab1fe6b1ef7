"""What a model's first request would pay once, paid as it loads: llama.cpp's first decode
(`NativeModel.warm_up`: the weights of a mapped file read in, a device's buffers made) and
the facts asked of every token of the vocabulary (`NativeModel.learn_vocabulary`: whether a
message's text holds control tokens, the least count of tokens a long prompt could be).
Before, the first request after a load waited for both: 0.1 s on smollm2's vocabulary, 0.36
s on Qwen's, and several first requests at once each asked every token
(bench/results/first_reply.md). On the real models."""

from __future__ import annotations

import ctypes
import threading

import llama_cpp
import pytest

from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.native.model import NativeModel
from localinfer.errors import ModelLoadFailed

GREEDY = SamplingParams(temperature=0, max_tokens=24)


def _vocabulary_facts(native: NativeModel) -> tuple[frozenset[str], int]:
    """Each token asked of llama.cpp here, as the two facts are defined."""
    special = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
    heads = {native.token_text(t)[:1] for t in range(native.n_vocab)
             if llama_cpp.llama_vocab_get_attr(native.vocab, t) & special} - {""}
    buf = ctypes.create_string_buffer(256)
    return frozenset(heads), max(len(native._piece(t, buf)) for t in range(native.n_vocab))


def _count_questions(monkeypatch) -> list:
    """Every llama_vocab_get_attr call from now on, as (vocab, token): another model's
    learning thread may still be asking about its own."""
    asked = []
    real = llama_cpp.llama_vocab_get_attr
    monkeypatch.setattr(llama_cpp, "llama_vocab_get_attr",
                        lambda vocab, token: asked.append((vocab, token)) or real(vocab, token))
    return asked


def _of(asked: list, native: NativeModel) -> list[int]:
    return [token for vocab, token in asked if vocab is native.vocab]


def test_the_first_decode_runs_at_load_and_leaves_the_cache_empty(smollm2_path,
                                                                 smollm2_reference,
                                                                 monkeypatch):
    decoded = []
    real = llama_cpp.llama_decode

    def decode(ctx, batch):
        decoded.append(([batch.token[i] for i in range(batch.n_tokens)],
                        threading.current_thread()))
        return real(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", decode)
    with LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=512, n_slots=2)) as backend:
        native = backend.native
        # before any request, and on the engine's thread: the one that calls llama_decode
        # (a team of OpenMP threads for each thread that decodes; two make each other sleep)
        assert decoded == [([native.bos(), native.eos()], backend.engine._thread)]
        assert [native.next_position(seq) for seq in (0, 1)] == [0, 0]
        # the first request is answered as from a context that never decoded anything
        prompt = backend.tokenize(backend.apply_chat_template(
            [{"role": "user", "content": "Name a colour of the sea."}]))
        generation = backend.generate(prompt, GREEDY)
        text = generation.text()
        assert generation.stats.cached_tokens == 0
        assert smollm2_reference.follows(prompt, text, generation.stats.finish_reason) > 8


def test_a_model_whose_first_decode_fails_is_refused_as_it_loads(smollm2_path, monkeypatch):
    """llama.cpp's error code for a decode it could not run (a device out of memory, a
    broken tensor) at load: a clear refusal there, not the first request's error."""
    monkeypatch.setattr(llama_cpp, "llama_decode", lambda ctx, batch: -3)
    with pytest.raises(ModelLoadFailed, match=r"could not decode with this model \(its first "
                                              r"decode returned -3\)"):
        LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=512))


def test_the_vocabulary_is_learnt_as_the_model_loads(smollm2_path, monkeypatch):
    real = llama_cpp.llama_vocab_get_attr
    asked = _count_questions(monkeypatch)
    with LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=512)) as backend:
        native = backend.native
        # before any request, each token asked once
        assert sorted(_of(asked, native)) == list(range(native.n_vocab))
        assert native._longest is not None and native._heads is not None
        # what a request asks now is known, and is what llama.cpp says of each token
        monkeypatch.setattr(llama_cpp, "llama_vocab_get_attr", real)
        assert (native.control_heads(), native.longest_piece()) == _vocabulary_facts(native)
        assert "<" in native.control_heads()  # (smollm2's <|im_start|> and the like)
        backend.prompt_tokens([{"role": "user", "content": "Hello <b>there</b>"}])
        assert sorted(_of(asked, native)) == list(range(native.n_vocab))  # none again


def test_callers_at_once_learn_the_vocabulary_once(smollm2_path, monkeypatch):
    native = NativeModel(str(smollm2_path), 256, 1, 64, 1)
    try:
        asked = _count_questions(monkeypatch)
        results = []
        callers = [threading.Thread(target=lambda: results.append(native.longest_piece()))
                   for _ in range(4)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(60)
        assert sorted(_of(asked, native)) == list(range(native.n_vocab))
        assert len(results) == 4 and len(set(results)) == 1
    finally:
        native.close()
