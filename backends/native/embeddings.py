"""Embeddings: a second llama.cpp context on the same weights, pooled as the model says (mean
where it says nothing), L2-normalised.

It is made on first use (chat-only servers never pay for it) and serves a request's inputs
in a row, requests in turn. Short inputs share a decode, each its own sequence (`groups`):
one decode of many short texts instead of one each. Its decodes run where the backend says
(`run`): the engine's thread, between two of its steps (Engine.call), so that one thread of
the process calls llama_decode — one OpenMP team, whose barriers spin (a second team's mere
existence makes every barrier of both sleep). A causal model's mean is taken from its last
hidden states as llama.cpp computes them, its output layer over every token skipped
(`FinalRows`, once checked against llama.cpp's own pooling).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp
import numpy

from localinfer.backends.base import stopped
from localinfer.backends.native import ggml
from localinfer.backends.native.model import NativeModel
from localinfer.model_store.shape import POOLED_SEQUENCES, POOLED_UBATCH
from localinfer.errors import EngineError, InvalidRequest, PromptTooLong

__all__ = ["Embedder", "FinalRows", "PooledContext", "groups"]

_SEQUENCES = POOLED_SEQUENCES  # inputs in one decode at most (their tokens within the context)
_DECODE_TOKENS = 256  # inputs share a decode up to this many tokens (a longer one alone)
_MICRO_BATCH = POOLED_UBATCH  # tokens computed at once where a sequence may span micro-batches


class PooledContext:
    """A second llama.cpp context on the model's weights whose outputs llama.cpp pools (the
    model's own context cannot: pooling is fixed when a context is made), made on first use
    and freed with the model. An input is one micro-batch where its pooling needs it so
    (`_micro_batch`); `SEQUENCES` inputs may share a decode, each its own sequence, over one
    pool of cells. `run(work)` runs one decode's work (a context made, a batch decoded, its
    outputs read) where llama.cpp should be called: the engine's thread (Engine.call), else
    the caller's."""

    POOLING = llama_cpp.LLAMA_POOLING_TYPE_MEAN
    SEQUENCES = 1
    WHAT = "an embedding"

    def __init__(self, native: NativeModel, n_ctx: int, n_threads: int | Callable[[], int],
                 run: Callable[[Callable[[], Any]], Any] | None = None,
                 before_made: Callable[[], None] | None = None):
        """before_made: called before the context is made, and may refuse (raise): a chat
        model's, which its plan did not count, is made only where its memory is free."""
        self.native = native
        self.n_ctx = n_ctx
        self._before_made = before_made
        # a count, or where the engine tunes its own, the count its prompt steps run with now
        self._threads = n_threads if callable(n_threads) else (lambda: n_threads)
        self._run = run or (lambda work: work())
        self._ctx = None
        self._lock = threading.Lock()
        # one request's decodes in a row, requests in turn: each ends as soon as it can
        # (their decodes interleaved, every request of a burst ended with the last)
        self._turn = threading.Lock()

    def _context(self) -> llama_cpp.llama_context_p:
        if self._ctx is None:
            if self._before_made is not None:
                self._before_made()
            params = llama_cpp.llama_context_default_params()
            params.n_ctx = params.n_batch = self.n_ctx
            params.n_ubatch = self._micro_batch()
            params.n_seq_max = self.SEQUENCES
            params.kv_unified = self.SEQUENCES > 1
            params.n_threads = params.n_threads_batch = self._threads()
            params.embeddings = True
            params.pooling_type = self._pooling()
            params.no_perf = True
            callback = self._eval_callback()
            if callback is not None:
                params.cb_eval = callback
            self._ctx = llama_cpp.llama_init_from_model(self.native.model, params)
            if not self._ctx:
                self._ctx = None
                raise EngineError(f"llama.cpp could not create {self.WHAT} context of "
                                  f"{self.n_ctx} tokens — lower --ctx")
        return self._ctx

    def _pooling(self) -> int:
        return self.POOLING

    def _eval_callback(self) -> Any:
        """What llama.cpp calls at each node of a decode's graph (ggml's eval callback), if
        anything: set when the context is made."""
        return None

    def _causal(self) -> bool:
        return bool(llama_cpp.llama_get_causal_attn(self.native.ctx))

    def _read(self, ctx: llama_cpp.llama_context_p, group: Sequence[Sequence[int]],
              failed: str) -> None:
        """`group` read, each input its own sequence from position 0, in cells cleared first.

        With embeddings on, llama.cpp makes every token an output, and each output a row of
        vocabulary-wide logits nobody reads: its output buffer grew by 1.1 GiB of host memory
        for one 1,890-token input over Qwen3's vocabulary, and its output layer's product
        took more time than the rest of a small model. So where the pooling reads only a
        sequence's last token (`_last_token`), the other tokens are read first with
        embeddings off and no outputs, then the last tokens alone with embeddings on; only
        where it reads them all (mean, CLS, an encoder) is every token an output (a causal
        model's mean then stops before the output layer: `FinalRows`)."""
        self._clear(ctx)
        if not self._last_token():
            _decode(ctx, [(seq, 0, tokens) for seq, tokens in enumerate(group)], True, failed)
            return
        heads = [(seq, 0, tokens[:-1]) for seq, tokens in enumerate(group) if len(tokens) > 1]
        if heads:
            llama_cpp.llama_set_embeddings(ctx, False)
            try:
                _decode(ctx, heads, False, failed)
            finally:
                llama_cpp.llama_set_embeddings(ctx, True)
        _decode(ctx, [(seq, len(tokens) - 1, tokens[-1:]) for seq, tokens in enumerate(group)],
                True, failed)

    def _clear(self, ctx: llama_cpp.llama_context_p) -> None:
        """Cells cleared, and the thread count of now, before an input is read."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        threads = self._threads()
        if threads != llama_cpp.llama_n_threads(ctx):
            llama_cpp.llama_set_n_threads(ctx, threads, threads)

    def _last_token(self) -> bool:
        """Pooled at each sequence's last token: a causal model's LAST pooling (Qwen3-
        Embedding) or rank pooling (Qwen3-Reranker: P("yes") there)."""
        return self._causal() and self._pooling() in (llama_cpp.LLAMA_POOLING_TYPE_LAST,
                                                      llama_cpp.LLAMA_POOLING_TYPE_RANK)

    def _micro_batch(self) -> int:
        """Tokens llama.cpp computes at once. It reserves its compute buffer for that many
        outputs, each as wide as the model's output layer (a causal model's vocabulary,
        pooled or not): 20 GiB for Qwen3's 151,936 at 32,768 tokens. Here a whole input is
        one micro-batch, as mean pooling needs (llama.cpp pools each micro-batch apart)."""
        return self.n_ctx

    def close(self) -> None:
        with self._lock:
            if self._ctx is not None:
                llama_cpp.llama_free(self._ctx)
                self._ctx = None


class Embedder(PooledContext):
    """The model's own pooling where its file names one (mean, CLS or last token: a
    Qwen3-Embedding's is its last token's), else mean; up to _SEQUENCES inputs a decode."""

    SEQUENCES = _SEQUENCES

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.final: FinalRows | None = None  # made with the context where the mean is ours
        self._final_off = False  # our mean was not llama.cpp's: its own pooling from then on

    def _eval_callback(self) -> Any:
        """A causal model's mean is taken here from its last hidden states (`FinalRows`),
        not after the output layer: where the memory is a KV cache alone (a recurrent
        state splits a decode by sequence, not in the batch's order)."""
        if (self._final_off or not self._causal() or self.native.recurrent
                or self.native.hybrid or self._pooling() != llama_cpp.LLAMA_POOLING_TYPE_MEAN):
            return None
        self.final = FinalRows()
        return self.final.callback

    def _means(self, ctx: llama_cpp.llama_context_p,
               group: Sequence[Sequence[int]]) -> list[list[float]] | None:
        """Each input's pooled vector after a decode of `group`: ours from its rows, checked
        against llama.cpp's at the first decode; llama.cpp's where they differ (from then on).
        None where ours was to be used and the rows were not there: llama.cpp did not pool
        them."""
        final = self.final
        if final is None:
            return [self._pooled(ctx, seq) for seq in range(len(group))]
        ours = _row_means(final.take(), group, self._n_embd())
        if final.skip:
            return None if ours is None else [_finite(vector) for vector in ours]
        theirs = [self._pooled(ctx, seq) for seq in range(len(group))]
        if ours is not None and not self._final_off and _same(ours, theirs):
            final.skip = True
            # ours from the first: the same text embeds to the same vector in every request
            # (the check's own decode gave llama.cpp's, ~1e-10 away from ours)
            return [_finite(vector) for vector in ours]
        self._final_off = True  # (off once off: the context is made again without the callback)
        return theirs

    def _pooling(self) -> int:
        declared = llama_cpp.llama_pooling_type(self.native.ctx)
        if declared in (llama_cpp.LLAMA_POOLING_TYPE_MEAN, llama_cpp.LLAMA_POOLING_TYPE_CLS,
                        llama_cpp.LLAMA_POOLING_TYPE_LAST):
            return declared
        return llama_cpp.LLAMA_POOLING_TYPE_MEAN

    def _micro_batch(self) -> int:
        """A causal model's last token sees the earlier micro-batches through the cells
        (llama.cpp keeps each sequence's value from its last micro-batch): pooled by it, an
        input may span several. Its mean is read in chunks of a micro-batch (`_chunks`).
        CLS pooling and an encoder read an input whole."""
        if self._causal() and self._pooling() != llama_cpp.LLAMA_POOLING_TYPE_CLS:
            return min(self.n_ctx, _MICRO_BATCH)
        return self.n_ctx

    def _chunks(self) -> int:
        """A causal model's mean over an input longer than a micro-batch is read a
        micro-batch a decode, each decode's mean weighted by its tokens (their hidden states
        see the earlier ones through the cells): the compute buffer and the output rows then
        hold a micro-batch of outputs, not the input's, each as wide as the vocabulary
        (with the input whole, 2 x 1.2 GiB for 2,048 tokens of Qwen3's). 0: read whole."""
        if self._causal() and self._pooling() == llama_cpp.LLAMA_POOLING_TYPE_MEAN:
            return self._micro_batch()
        return 0

    def embed_many(self, inputs: Sequence[Sequence[int]], stop: threading.Event | None = None
                   ) -> list[list[float]]:
        """Each input's embedding, in order; short ones share a decode. An empty input or
        one past the context is refused before any is read; once `stop` is set (its caller
        has gone) no more are read (Cancelled)."""
        for tokens in inputs:
            if not tokens:
                raise InvalidRequest("cannot embed an empty input")
            if len(tokens) > self.n_ctx:
                raise PromptTooLong(len(tokens), self.n_ctx)
        vectors: list[list[float]] = []
        with self._turn:
            for group in groups(inputs, self.n_ctx):  # a decode each, between the engine's steps
                stopped(stop)
                vectors += self._run(lambda group=group: self._decode(group))
        return [_normalised(vector) for vector in vectors]

    def _decode(self, group: Sequence[Sequence[int]]) -> list[list[float]]:
        with self._lock:
            vectors = self._decode_once(group)
            if vectors is None:  # our rows went missing: llama.cpp's own pooling from now on
                self._final_off = True
                vectors = self._decode_once(group)
            if self._final_off and self.final is not None:
                llama_cpp.llama_free(self._ctx)
                self._ctx, self.final = None, None
            if vectors is None:  # (cannot be: with `final` off, llama.cpp pools)
                raise EngineError("llama.cpp failed to compute the embedding")
            return vectors

    def _decode_once(self, group: Sequence[Sequence[int]]) -> list[list[float]] | None:
        failed = "llama.cpp failed to compute the embedding"
        ctx = self._context()
        if self.final is not None and self._final_off:
            self.final.skip = False  # (llama.cpp's pooling until the context is made again)
        chunk = self._chunks()
        if len(group) == 1 and chunk and len(group[0]) > chunk:
            tokens = group[0]
            self._clear(ctx)
            total = [0.0] * self._n_embd()
            for start in range(0, len(tokens), chunk):
                piece = tokens[start:start + chunk]
                _decode(ctx, [(0, start, piece)], True, failed)
                means = self._means(ctx, [piece])
                if means is None:
                    return None
                total = [t + len(piece) * v for t, v in zip(total, means[0])]
            return [[t / len(tokens) for t in total]]
        self._read(ctx, group, failed)
        return self._means(ctx, group)

    def _n_embd(self) -> int:
        return llama_cpp.llama_model_n_embd(self.native.model)

    def _pooled(self, ctx: llama_cpp.llama_context_p, seq: int) -> list[float]:
        pooled = llama_cpp.llama_get_embeddings_seq(ctx, seq)
        if not pooled:
            raise EngineError("this model gave no pooled embedding")
        return _finite(pooled[:self._n_embd()])


def _finite(vector: list[float]) -> list[float]:
    if not math.isfinite(sum(vector)):  # (a NaN or an infinity carries into the sum)
        raise EngineError("this model gave an embedding that is not a number — its file "
                          "is damaged, or its weights overflow")
    return vector


class FinalRows:
    """A causal model's last hidden states, the rows its mean is taken over (the node of
    the graph llama.cpp names `result_norm` and pools), copied out as llama.cpp computes
    them (ggml's eval callback).

    With embeddings on, llama.cpp makes every token an output and runs the output layer over
    all of them before it pools: a row of vocabulary-wide logits a token that nobody reads
    (SmolLM2's 49,152 x 576 is a fifth of its products a token). Once our mean of these rows
    was seen to be llama.cpp's own pooled vector (`skip`, set by the embedder after its
    first decode), the callback cancels the rest of the graph after them — ggml's contract:
    a callback that returns false for a node it was given "cancels the graph compute" — and
    the mean is ours. `computed_after`: the nodes of the last decode taken that llama.cpp
    went on to compute after the rows (the output layer and the pooling; none when skipped)."""

    NAME = b"result_norm"

    def __init__(self) -> None:
        self.skip = False
        self.rows: list[numpy.ndarray | None] = []
        self.after = 0  # (this decode's, so far)
        self.computed_after = 0
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_node)

    def take(self) -> list[numpy.ndarray | None]:
        rows, self.rows = self.rows, []
        self.computed_after, self.after = self.after, 0
        return rows

    def _on_node(self, tensor: int, ask: bool, _user_data: Any) -> bool:
        try:
            if ggml.tensor_name(tensor) != self.NAME:
                self.after += bool(ask and self.rows)
                return False
            if ask:
                return True
            self.rows.append(ggml.tensor_floats(tensor))
            return not self.skip
        except BaseException:  # nothing raised into llama.cpp: rows that fail their check
            self.rows.append(None)
            return True


def _row_means(rows: Sequence[numpy.ndarray | None], group: Sequence[Sequence[int]],
               width: int) -> list[list[float]] | None:
    """Each input's mean of the rows one decode of `group` copied out, its tokens in the
    batch's order (one micro-batch: llama.cpp computes it in that order); None where the
    rows are not one micro-batch's of `width` floats a token."""
    count = sum(len(tokens) for tokens in group)
    if len(rows) != 1 or rows[0] is None or rows[0].size != count * width:
        return None
    block = rows[0].reshape(count, width)
    means, at = [], 0
    for tokens in group:
        means.append(block[at:at + len(tokens)].mean(axis=0, dtype=numpy.float64).tolist())
        at += len(tokens)
    return means


def _same(ours: Sequence[Sequence[float]], theirs: Sequence[Sequence[float]]) -> bool:
    """Two sets of pooled vectors equal within float rounding (llama.cpp sums in float32)."""
    a, b = numpy.asarray(ours), numpy.asarray(theirs)
    if a.shape != b.shape or not numpy.isfinite(a).all() or not numpy.isfinite(b).all():
        return False
    return bool(numpy.abs(a - b).max() <= 1e-3 * max(1.0, float(numpy.abs(b).max())))


def _decode(ctx: llama_cpp.llama_context_p, pieces: Sequence[tuple[int, int, Sequence[int]]],
            outputs: bool, failed: str) -> None:
    """One llama_decode of `pieces`: (sequence, position of the first token, tokens)."""
    n = sum(len(tokens) for _, _, tokens in pieces)
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    try:
        at = 0
        for seq, start, tokens in pieces:
            for pos, token in enumerate(tokens, start):
                batch.token[at] = token
                batch.pos[at] = pos
                batch.n_seq_id[at] = 1
                batch.seq_id[at][0] = seq
                batch.logits[at] = outputs
                at += 1
        batch.n_tokens = n
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise EngineError(failed)
    finally:
        llama_cpp.llama_batch_free(batch)


def _normalised(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def groups(inputs: Sequence[Sequence[int]], n_ctx: int) -> list[list[Sequence[int]]]:
    """Consecutive inputs, as many to a decode as _DECODE_TOKENS, the context and
    _SEQUENCES hold (one longer than _DECODE_TOKENS alone). A decode's attention spans every
    token in it, masked by sequence, so its cost grows with the square of what it holds:
    nine 206-token rerank pairs to a decode scored 17 documents a second here, one to a
    decode 27 (a MiniLM-L6 shape, 2 cores)."""
    cap = min(n_ctx, _DECODE_TOKENS)
    out: list[list[Sequence[int]]] = []
    size = 0
    for tokens in inputs:
        if not out or len(out[-1]) == _SEQUENCES or size + len(tokens) > cap:
            out.append([])
            size = 0
        out[-1].append(tokens)
        size += len(tokens)
    return out
