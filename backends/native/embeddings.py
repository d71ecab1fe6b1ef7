"""Embeddings: a second llama.cpp context on the same weights, pooled by mean, L2-normalised.

It is made on first use (chat-only servers never pay for it) and serves one input at a
time under a lock. Its decodes run where the backend says (`run`): the engine's thread,
between two of its steps (Engine.call), so that one thread of the process calls
llama_decode — one OpenMP team, whose barriers spin (a second team's mere existence makes
every barrier of both sleep).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp

from localinfer.backends.native.model import NativeModel
from localinfer.errors import EngineError, InvalidRequest, PromptTooLong

__all__ = ["Embedder", "PooledContext"]


class PooledContext:
    """A second llama.cpp context on the model's weights whose outputs llama.cpp pools (the
    model's own context cannot: pooling is fixed when a context is made), made on first use
    and freed with the model. A whole input is one micro-batch (pooling needs it so);
    `SEQUENCES` inputs may share a decode, each its own sequence, over one pool of cells.
    `run(work)` runs one decode's work (a context made, a batch decoded, its outputs read)
    where llama.cpp should be called: the engine's thread (Engine.call), else the caller's."""

    POOLING = llama_cpp.LLAMA_POOLING_TYPE_MEAN
    SEQUENCES = 1
    WHAT = "an embedding"

    def __init__(self, native: NativeModel, n_ctx: int, n_threads: int,
                 run: Callable[[Callable[[], Any]], Any] | None = None):
        self.native = native
        self.n_ctx = n_ctx
        self._n_threads = n_threads
        self._run = run or (lambda work: work())
        self._ctx = None
        self._lock = threading.Lock()

    def _context(self) -> llama_cpp.llama_context_p:
        if self._ctx is None:
            params = llama_cpp.llama_context_default_params()
            params.n_ctx = params.n_batch = params.n_ubatch = self.n_ctx
            params.n_seq_max = self.SEQUENCES
            params.kv_unified = self.SEQUENCES > 1
            params.n_threads = params.n_threads_batch = self._n_threads
            params.embeddings = True
            params.pooling_type = self.POOLING
            params.no_perf = True
            self._ctx = llama_cpp.llama_init_from_model(self.native.model, params)
            if not self._ctx:
                self._ctx = None
                raise EngineError(f"llama.cpp could not create {self.WHAT} context of "
                                  f"{self.n_ctx} tokens — lower --ctx")
        return self._ctx

    def close(self) -> None:
        with self._lock:
            if self._ctx is not None:
                llama_cpp.llama_free(self._ctx)
                self._ctx = None


class Embedder(PooledContext):
    """Mean pooling, one input at a time."""

    def embed(self, tokens: Sequence[int]) -> list[float]:
        if not tokens:
            raise InvalidRequest("cannot embed an empty input")
        if len(tokens) > self.n_ctx:
            raise PromptTooLong(len(tokens), self.n_ctx)
        vector = self._run(lambda: self._decode(tokens))
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        return [v / norm for v in vector]

    def _decode(self, tokens: Sequence[int]) -> list[float]:
        with self._lock:
            ctx = self._context()
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
            batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
            try:
                for i, token in enumerate(tokens):
                    batch.token[i] = token
                    batch.pos[i] = i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = True
                batch.n_tokens = len(tokens)
                if llama_cpp.llama_decode(ctx, batch) != 0:
                    raise EngineError("llama.cpp failed to compute the embedding")
                pooled = llama_cpp.llama_get_embeddings_seq(ctx, 0)
                if not pooled:
                    raise EngineError("this model gave no pooled embedding")
                return pooled[: llama_cpp.llama_model_n_embd(self.native.model)]
            finally:
                llama_cpp.llama_batch_free(batch)
