"""Drafting for speculative decoding: guess the next tokens, from the text so far or a small model.

When the last few tokens of a sequence appeared earlier in it (the prompt quoted back, code
being edited, a list continuing), the tokens that followed them then are a good guess for
what follows now. The engine decodes the guesses in the same step as the real next token and
keeps the ones the sampler would have chosen anyway, so the output is exactly what plain
decoding gives — only faster when guesses are right.

A draft model (a small model of the same family: same vocabulary) guesses instead when one
is configured; it costs its own decode steps, and pays when it is much smaller than the
model and agrees with it often.
"""

from __future__ import annotations

from collections.abc import Sequence

from localinfer.backends.base import SamplingParams
from localinfer.backends.native.model import NativeModel, SamplerChain
from localinfer.errors import ModelLoadFailed

__all__ = ["DraftModel", "common_prefix", "ngram_draft"]


def ngram_draft(tokens: Sequence[int], max_draft: int = 8, max_ngram: int = 3,
                min_ngram: int = 2) -> list[int]:
    """Up to `max_draft` tokens that followed the latest earlier match of the sequence's tail.

    The longest tail (max_ngram down to min_ngram tokens) that occurs earlier wins; among its
    occurrences, the latest one.
    """
    n_tokens = len(tokens)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n_tokens <= n:
            continue
        tail = list(tokens[n_tokens - n:])
        last = tail[-1]
        for start in range(n_tokens - n - 1, -1, -1):
            # it runs every step: compare one token before slicing n of them
            if tokens[start + n - 1] == last and list(tokens[start:start + n]) == tail:
                follow = tokens[start + n:start + n + max_draft]
                return list(follow)
    return []


class DraftModel:
    """A small model with the same vocabulary that guesses the next tokens greedily.

    It keeps the KV of the last sequence it was asked about, so from one step to the next it
    reads only the tokens it has not seen (the target's accepted tokens) before guessing.
    """

    def __init__(self, path: str, target: NativeModel, n_ctx: int, n_batch: int,
                 n_threads: int, n_gpu_layers: int = 0, main_gpu: int = 0):
        self.native = NativeModel(path, n_ctx_total=n_ctx, n_slots=1, n_batch=n_batch,
                                  n_threads=n_threads, n_gpu_layers=n_gpu_layers, n_outputs=1,
                                  main_gpu=main_gpu,
                                  # (cut back each step past guesses read one at a time:
                                  # a window's cache could not be; a draft model's is small)
                                  swa_full=True)
        try:
            if self.native.stateful:  # it reads its guesses one at a time, and would have to
                # forget the rejected ones: a recurrent state cannot be cut back
                raise ModelLoadFailed("the draft model keeps a recurrent state, which cannot "
                                      "be rolled back to a rejected guess — pick a "
                                      "transformer of the same family")
            _check_same_vocabulary(self.native, target)
        except ModelLoadFailed:
            self.native.close()
            raise
        self.n_ctx = self.native.n_cells()  # one sequence: all its cells
        self.n_batch = self.native.n_batch()
        self.cache: list[int] = []
        self._batch = self.native.batch(self.n_batch)
        self._greedy = SamplerChain(self.native, SamplingParams(temperature=0))  # an argmax

    def unread(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` it reads before guessing what follows them: those it has not
        seen, and at least the last again, for its logits."""
        return len(tokens) - self._kept(tokens)

    def _kept(self, tokens: Sequence[int]) -> int:
        return max(0, min(common_prefix(self.cache, tokens), len(tokens) - 1))

    def propose(self, tokens: Sequence[int], max_draft: int,
                threads: int | None = None) -> list[int]:
        """Up to `max_draft` tokens the draft model would write after `tokens`; its decodes
        with `threads` threads (None: as they were)."""
        if max_draft <= 0 or len(tokens) + max_draft > self.n_ctx:
            return []
        if threads and threads != self.native.threads():
            self.native.set_threads(threads)
        keep = self._kept(tokens)
        if not self.native.forget(0, keep):
            self.native.forget_all()
            keep = 0
        del self.cache[keep:]
        for start in range(keep, len(tokens), self.n_batch):
            if not self._decode(tokens[start:start + self.n_batch], last_logits=True):
                return []
        draft: list[int] = []
        while True:
            token = self._greedy.sample(self.native, -1)
            if self.native.is_eog(token):
                return draft
            draft.append(token)
            # the last guess need not be read: the target checks it
            if len(draft) == max_draft or not self._decode([token], last_logits=True):
                return draft

    def _decode(self, tokens: Sequence[int], last_logits: bool) -> bool:
        b = self._batch
        for i, token in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = token, len(self.cache) + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = last_logits and i == len(tokens) - 1
        b.n_tokens = len(tokens)
        if self.native.decode(b) != 0:
            self.cache.clear()  # unknown state: start over next time
            self.native.forget_all()
            return False
        self.cache.extend(tokens)
        return True

    def close(self) -> None:
        if self._greedy:
            self._greedy.close()
            self.native.free_batch(self._batch)
            self._greedy = None
            self.native.close()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two sequences share (compared in blocks at C speed, 256
    tokens, then 64, 16, 4 and 1 where they differ: slots and saved prompts are compared
    with each prompt)."""
    a = a if isinstance(a, list) else list(a)
    b = b if isinstance(b, list) else list(b)
    n, end, block = 0, min(len(a), len(b)), 256
    while block:
        while n + block <= end and a[n:n + block] == b[n:n + block]:
            n += block
        block //= 4
    return n


def _check_same_vocabulary(draft: NativeModel, target: NativeModel) -> None:
    """Guesses are token ids: both models must mean the same text by each id."""
    why = None
    if draft.n_vocab != target.n_vocab:
        why = f"{draft.n_vocab} tokens against {target.n_vocab}"
    elif (draft.bos(), draft.eos()) != (target.bos(), target.eos()):
        why = "different start and end tokens"
    else:
        differing = next((t for t in range(target.n_vocab)
                          if draft.token_text(t) != target.token_text(t)), None)
        if differing is not None:
            why = f"token {differing} is {draft.token_text(differing)!r} against " \
                  f"{target.token_text(differing)!r}"
    if why:
        raise ModelLoadFailed(f"the draft model's vocabulary is not the model's ({why}) — "
                              "pick a smaller model of the same family")
