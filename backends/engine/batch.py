"""One step's batch: the tokens the engine decodes together — each with its slot's sequence
and position, and whether its logits are wanted (one output row each, in batch order).

Adding a token also appends it to its slot's cache: the KV written by the decode is then
the slot's. The engine fills it (engine.py `_fill_batch`: generating slots' next tokens, a
lone stream's guesses, then prompt chunks), decodes it once and samples the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy

from localinfer.backends.native.model import NativeModel
from localinfer.backends.engine.slots import Slot
from localinfer.errors import EngineError

__all__ = ["StepBatch"]


class StepBatch:
    def __init__(self, native: NativeModel, size: int):
        self.native = native
        self.size = size
        self._batch = native.batch(size)
        self.n_tokens = 0
        self.n_outputs = 0  # logits asked for so far
        self.fillers: list[Slot] = []  # idle slots with a filler token in this step

    def clear(self) -> None:
        self.n_tokens = self.n_outputs = 0
        self._batch.n_tokens = 0
        self.fillers = []

    def add(self, slot: Slot, token: int, logits: bool) -> None:
        """One token of `slot`'s sequence, at the next position; with `logits`, the slot's
        output row is this token's."""
        n, b = self.n_tokens, self._batch
        b.token[n] = token
        b.pos[n] = len(slot.cache) - slot.deficit  # (less what M-RoPE images save)
        b.n_seq_id[n] = 1
        b.seq_id[n][0] = slot.id
        b.logits[n] = logits
        slot.cache.append(token)
        if logits:
            slot.batch_index, slot.output_row = n, self.n_outputs
            self.n_outputs += 1
        self.n_tokens = n + 1

    def add_filler(self, slot: Slot) -> None:
        """A token of idle `slot`'s sequence after the prefix it keeps: it takes the step to a
        shape llama.cpp decodes faster (padding.py). It asks for logits too, which no one
        reads: the output layer's product then has the step's count of rows, not the
        streams' (the largest matrix of a small model). Its cell is not the slot's: the
        engine removes it once the step is decoded."""
        n, b = self.n_tokens, self._batch
        b.token[n] = slot.cache[-1] if slot.cache else 0
        b.pos[n] = len(slot.cache)
        b.n_seq_id[n] = 1
        b.seq_id[n][0] = slot.id
        b.logits[n] = True
        self.n_outputs += 1
        self.fillers.append(slot)
        self.n_tokens = n + 1

    def add_prompt(self, slot: Slot, tokens: Sequence[int], start: int, end: int,
                   logits_last: bool) -> None:
        """Prompt tokens [start, end) of `slot`; logits only for the prompt's last token,
        and only if `logits_last` (a rebuilt request's next token is known already)."""
        last = len(tokens) - 1
        for i in range(start, end):
            self.add(slot, tokens[i], logits_last and i == last)

    def decode(self) -> int:
        """llama_decode of the batch (its return code); until the device is done."""
        if self.n_outputs > self.native.n_outputs:  # llama.cpp would abort the process
            raise EngineError(f"a step asked for {self.n_outputs} logits, more than the "
                              f"{self.native.n_outputs} the context holds")
        self._batch.n_tokens = self.n_tokens
        return self.native.decode(self._batch)

    def greedy_picks(self, slots: Sequence[Slot]) -> numpy.ndarray | None:
        """The best token of every output row, in one pass, when several greedy streams
        sample this step: per stream, reading its row costs more Python than the argmax."""
        greedy = sum(1 for s in slots
                     if s.task and s.batch_index >= 0 and not s.draft and s.sampler.argmax)
        if greedy < 2:
            return None
        logits = self.native.logits()  # rows in batch order
        rows = numpy.ctypeslib.as_array(logits, shape=(self.n_outputs, self.native.n_vocab))
        return rows.argmax(axis=1)  # the first of the highest, as llama.cpp's greedy picks

    def free(self) -> None:
        self.native.free_batch(self._batch)
