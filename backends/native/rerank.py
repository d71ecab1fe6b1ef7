"""Reranking: a cross-encoder reads a query and a document together and gives one score.

The model's own context cannot do it (its pooling is fixed when a context is made), so this
is a second llama.cpp context on the same weights with rank pooling — what llama-server's
`--reranking` sets — made on first use. The score of a pair is the first float llama.cpp
pools for its sequence (`llama_get_embeddings_seq`): a classification head's output over
the first token (BERT's kin) or, for a causal model (Qwen3-Reranker), P("yes") at its last.

A pair is written as llama-server writes it (`format_prompt_rerank`): the file's rerank
prompt (`tokenizer.chat_template.rerank`, with `{query}` and `{document}` in it) where it
has one, else [BOS] query [EOS] [SEP] document [EOS], each special token where the
vocabulary adds it. Only the prompt writes control tokens: a query or document that spells
one is read as text. Short pairs share a decode, each its own sequence, up to ~256 tokens in
all (a longer pair goes alone; `embeddings.groups` says why). A pair's score is its own alone: an encoder's exactly, a causal model's within rounding
(flash attention over the shared cells sums in another order: ~1e-3 at most). Each decode
runs on the engine's thread between two of its steps (PooledContext's `run`): requests on
several threads once decoded on several, and every OpenMP barrier then slept (~200 sleeps a
decode, 2 cores ~1.8 busy: 21-25 documents a second where one thread scored 27).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp

from localinfer.backends.base import stopped
from localinfer.backends.native.embeddings import (_MICRO_BATCH, _SEQUENCES, PooledContext,
                                                    groups)
from localinfer.backends.native.model import NativeModel
from localinfer.errors import EngineError, InvalidRequest, PromptTooLong

__all__ = ["Reranker"]

_SLOT = re.compile(r"(\{query\}|\{document\})")


class Reranker(PooledContext):
    """Rank pooling; up to _SEQUENCES pairs in one decode, over one pool of cells."""

    POOLING = llama_cpp.LLAMA_POOLING_TYPE_RANK
    SEQUENCES = _SEQUENCES
    WHAT = "a reranking"

    def __init__(self, native: NativeModel, n_ctx: int, n_threads: int | Callable[[], int],
                 run: Callable[[Callable[[], Any]], Any] | None = None):
        super().__init__(native, n_ctx, n_threads, run)
        source = llama_cpp.llama_model_chat_template(native.model, b"rerank")
        self.template = source.decode("utf-8", errors="replace") if source else None

    def _micro_batch(self) -> int:
        """A causal reranker's score is read at a pair's last token, whose micro-batch sees
        the earlier ones through the cells (llama.cpp keeps the last micro-batch's pooled
        value of each sequence): _MICRO_BATCH tokens at a time bound its compute buffer
        (Qwen3-Reranker-0.6B at --ctx 32768: 300 MiB, not 21 GiB). An encoder attends both
        ways: a pair is one micro-batch."""
        if self._causal():
            return min(self.n_ctx, _MICRO_BATCH)
        return self.n_ctx

    # ---------------------------------------------------------------- the pair's tokens
    def tokens(self, query: str, document: str, holds_control: Callable[[str], bool]
               ) -> list[int]:
        """One (query, document) pair as the model reads it. `holds_control(text)`: whether
        a text would tokenize to a control token (then it is tokenized apart, as text)."""
        if self.template is not None:
            return self._templated(query, document, holds_control)
        return self._joined(query, document)

    def _templated(self, query: str, document: str, holds_control: Callable[[str], bool]
                   ) -> list[int]:
        texts = {"{query}": query, "{document}": document}
        parts = _SLOT.split(self.template)  # prompt, slot, prompt, slot, …, prompt
        if not holds_control(query) and not holds_control(document):  # one text, as
            # llama-server tokenizes it (a word at a slot's edge merges as in training)
            whole = "".join(texts.get(part, part) for part in parts)
            return self.native.tokenize(whole, add_special=False, parse_special=True)
        tokens: list[int] = []
        for part in parts:
            if part in texts:
                tokens += self.native.tokenize(texts[part], add_special=False,
                                               parse_special=False)
            elif part:
                tokens += self.native.tokenize(part, add_special=False, parse_special=True)
        return tokens

    def _joined(self, query: str, document: str) -> list[int]:
        vocab = self.native.vocab
        end = llama_cpp.llama_vocab_eos(vocab)
        sep = llama_cpp.llama_vocab_sep(vocab)
        end = end if end >= 0 else sep
        if end < 0 and sep < 0:
            raise EngineError("this reranker's vocabulary has no end-of-text or separator "
                              "token and its file no rerank prompt: it cannot tell the query "
                              "from the document")
        add_end = llama_cpp.llama_vocab_get_add_eos(vocab) and end >= 0
        tokens = [self.native.bos()] if self.native.adds_bos() and self.native.bos() >= 0 else []
        tokens += self.native.tokenize(query, add_special=False, parse_special=False)
        tokens += [end] if add_end else []
        tokens += [sep] if llama_cpp.llama_vocab_get_add_sep(vocab) and sep >= 0 else []
        tokens += self.native.tokenize(document, add_special=False, parse_special=False)
        return tokens + ([end] if add_end else [])

    # ---------------------------------------------------------------- scoring
    def check(self, pairs: Sequence[Sequence[int]]) -> None:
        """Each pair fits the context (before any is scored)."""
        for pair in pairs:
            if not pair:
                raise InvalidRequest("a query and document came to no tokens at all")
            if len(pair) > self.n_ctx:
                raise PromptTooLong(len(pair), self.n_ctx)

    def score(self, pairs: Sequence[Sequence[int]], stop: threading.Event | None = None
              ) -> list[float]:
        """Each pair's score, in order; pairs are decoded as many at once as fit. A pair
        past the context is refused before any is decoded; once `stop` is set, no more are
        (Cancelled)."""
        self.check(pairs)
        scores: list[float] = []
        with self._turn:
            for group in groups(pairs, self.n_ctx):  # a decode each, between the engine's steps
                stopped(stop)
                scores += self._run(lambda group=group: self._decode(group))
        return scores

    def _decode(self, group: Sequence[Sequence[int]]) -> list[float]:
        with self._lock:
            ctx = self._context()
            self._read(ctx, group, "llama.cpp failed to score the documents")
            return [_score(ctx, seq) for seq in range(len(group))]


def _score(ctx: llama_cpp.llama_context_p, seq: int) -> float:
    pooled = llama_cpp.llama_get_embeddings_seq(ctx, seq)
    if not pooled:
        raise EngineError("this model gave no score: it has no rank pooling")
    value = float(pooled[0])
    if not math.isfinite(value):
        raise EngineError(f"this model gave a score that is not a number ({value})")
    return value
