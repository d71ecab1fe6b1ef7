"""Whether a greedy reply is right on any CPU, judged by a reference decode.

llama.cpp's kernels give slightly different floats for different batch shapes, cache
contents and CPUs, so two correct runs of one greedy request may part where the model's
two best tokens are nearly tied. A test that compares whole greedy replies across batch
compositions, slot counts or context sizes then passes on one CPU and fails on another.

`Reference.follows` checks a reply on its own instead: it decodes the same prompt on a
context of its own, one token per step, and walks the reply's text. At each step the
reply's next token must be one the reference ranks within `MARGIN` of its best: where
the best is far ahead (most steps) that is exactly the best token, and float noise far
smaller than the margin cannot change it; where two tokens are nearly tied, either is
right, and the walk goes on along the one the reply took. Where the reply ends, an end
of generation must be among the reference's choices (or the reply ran out of tokens).

Text does not say where its tokens part: where two near-tied choices both begin the rest of
the reply (" " and ' "' before '"2"'), either may be the reply's token. The walk takes the
likelier and, where the text then leaves the reference's choices, goes back to the last
such fork and takes the other (at most `FORKS` times a reply).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import llama_cpp
import numpy

from localinfer.backends.native.model import NativeModel

__all__ = ["MARGIN", "Reference", "eog_ban"]

# In logits. Measured on an AVX-512 CPU: smollm2 prefilling a prompt in one batch of 64
# tokens against one of 61 moves its top logits by up to 0.43 and the gap between its best
# two by up to 0.33 (gemma3 also up to 0.33); a gap of 1.0 does not flip.
MARGIN = 1.0
FORKS = 64  # the most alternatives a walk goes back to (a bound on the decodes it pays)


class Reference:
    """A model on a one-sequence context of its own, decoding one token per step."""

    def __init__(self, path: str | Path, n_ctx: int = 2048):
        self.model = NativeModel(str(path), n_ctx, 1, 512, 2)

    def close(self) -> None:
        self.model.close()

    def _decode(self, tokens: list[int]) -> numpy.ndarray:
        m = self.model
        for start in range(0, len(tokens), 512):
            part = tokens[start:start + 512]
            array = (llama_cpp.llama_token * len(part))(*part)
            assert llama_cpp.llama_decode(m.ctx, llama_cpp.llama_batch_get_one(array, len(part))) == 0
        row = llama_cpp.llama_get_logits_ith(m.ctx, -1)
        return numpy.ctypeslib.as_array(row, shape=(m.n_vocab,)).copy()

    def follows(self, prompt: list[int], text: str, finish: str | None = None, *,
                sure_length: bool = False, ban: Iterable[int] = (),
                margin: float = MARGIN) -> int:
        """Assert that `text` is a greedy reply to `prompt` (tokens), up to near-ties.

        finish: "stop" (the reply ended on its own: an end of generation must be a choice
        where the text ends), "length" or None (it was cut: anything may follow).
        sure_length: the test counts on the reply's length (a "length" finish after N
        tokens): no step may have had an end of generation among its choices, or on
        another CPU the reply could end there. ban: token ids the request banned (logit
        bias -100). Returns how many tokens the walk took.
        """
        ban = list(ban)
        m = self.model
        llama_cpp.llama_memory_clear(m.memory, True)
        want = text.encode("utf-8")
        n_past = len(prompt)
        logits = self._decode(list(prompt))
        pos = steps = 0
        forks: list[tuple[int, int, int, list[int]]] = []  # where the walk may go back
        first: AssertionError | None = None  # the likeliest walk's failure, reported
        tried = 0
        while True:
            try:
                token = self._step(logits, want, pos, steps, text, finish, sure_length, ban,
                                   margin)
            except AssertionError as failure:
                first = first or failure
                while forks and not forks[-1][3]:
                    forks.pop()
                if not forks or tried >= FORKS:
                    raise first from None
                pos, steps, n_past, others = forks[-1]
                token = others.pop(0)
                tried += 1
                assert llama_cpp.llama_memory_seq_rm(m.memory, 0, n_past, -1)
            else:
                if token is None:
                    return steps
                token, others = token
                if others:
                    forks.append((pos, steps, n_past, others))
            pos += len(self._piece(token))
            steps += 1
            n_past += 1
            logits = self._decode([token])

    def _step(self, logits: numpy.ndarray, want: bytes, pos: int, steps: int, text: str,
              finish: str | None, sure_length: bool, ban: list[int], margin: float
              ) -> tuple[int, list[int]] | None:
        """The reply's next token where `pos` bytes of it are read, and the other choices
        that also begin the rest of it; None where the reply ends there, as it may. An
        AssertionError where the text leaves the reference's choices."""
        m = self.model
        logits[ban] = -numpy.inf
        best = float(logits.max())
        near = numpy.flatnonzero(logits >= best - margin)
        near = near[numpy.argsort(-logits[near])]
        ends = [int(t) for t in near if llama_cpp.llama_vocab_is_eog(m.vocab, int(t))]
        if pos == len(want):
            assert finish != "stop" or ends, (
                f"the reply ends after {text!r}, but the reference would go on: its "
                f"choices were {self._show(near, logits)}")
            return None
        assert not (sure_length and ends), (
            f"after {want[:pos].decode('utf-8', 'replace')!r} (step {steps}) the reply "
            f"could as well have ended: its choices were {self._show(near, logits)} — "
            f"ban the end tokens or choose a prompt whose reply goes on")
        fits = [int(t) for t in near if int(t) not in ends and self._piece(int(t))
                and want.startswith(self._piece(int(t)), pos)]
        assert fits, (
            f"after {want[:pos].decode('utf-8', 'replace')!r} the reply wrote "
            f"{want[pos:pos + 24].decode('utf-8', 'replace')!r}, which is none of the "
            f"reference's choices {self._show(near, logits)} (step {steps})")
        return fits[0], fits[1:]

    def _piece(self, token: int) -> bytes:
        return self.model.piece(token)

    def _show(self, tokens: numpy.ndarray, logits: numpy.ndarray) -> list[tuple[str, float]]:
        return [(self._piece(int(t)).decode("utf-8", "replace"), round(float(logits[t]), 2))
                for t in tokens[:5]]


def eog_ban(native: NativeModel) -> dict[int, float]:
    """A logit bias that bans every end-of-generation token: a reply runs to its limit."""
    return {t: -100.0 for t in range(native.n_vocab)
            if llama_cpp.llama_vocab_is_eog(native.vocab, t)}
