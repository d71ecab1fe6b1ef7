"""Speculative decoding's guesses for a lone generating stream: how many, and which.

The scheduler (engine.py) decodes the guesses with the stream's next token; this part keeps
those its sampler agrees with, so the reply is what plain decoding would give. It decides
whether a stream is guessed for (a lone generating stream, nothing reading a prompt), how
many guesses it gets, makes them (a draft model, or prompt lookup: draft.py), and tracks
how well they do: guesses that keep failing cost a prompt token's compute each, so below a
quarter accepted it stops, and probes with two every 16 tokens in case the text turns
repetitive.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import ContextManager

from localinfer.backends.engine.batch import StepBatch
from localinfer.backends.engine.draft import DraftModel, ngram_draft
from localinfer.backends.engine.slots import Slot, SlotState

__all__ = ["Speculator"]

MIN_QUALITY = 0.25  # the moving share of guesses accepted below which a stream stops guessing
PROBE_EVERY = 16  # tokens between probes of a stream that stopped
PROBE_GUESSES = 2


class Speculator:
    def __init__(self, draft_tokens: int, drafter: DraftModel | None = None,
                 cores: Callable[[int], ContextManager[int | None]] | None = None):
        """draft_tokens: guesses per step, at most (0: off); drafter: a small model of the
        same family to guess with instead of prompt lookup (owned: closed with this);
        cores(n_prompt): the engine's claim of the cores around the drafter's decodes, as a
        step of that many prompt tokens claims them, giving the threads it may use."""
        self.draft_tokens = draft_tokens
        self.drafter = drafter
        self.cores = cores or (lambda n_prompt: contextlib.nullcontext())

    def candidate(self, slots: Sequence[Slot]) -> Slot | None:
        """The stream to guess for this step, if any: a lone generating one."""
        if not self.draft_tokens:
            return None
        generating = [s for s in slots if s.state is SlotState.GENERATING]
        if len(generating) != 1 or any(s.state is SlotState.PROCESSING_PROMPT for s in slots):
            return None
        slot = generating[0]
        if slot.task.pictures:  # its tokens hold images' placeholders, which no guess may be
            return None
        if slot.task.think is not None and not slot.task.think.done:
            return None  # (a reasoning budget writes tokens of its own: one a step)
        if slot.draft_quality < MIN_QUALITY and slot.task.stats.generated_tokens % PROBE_EVERY:
            return None
        return slot

    def guesses(self, slot: Slot, room: int) -> list[int]:
        """Up to `room` guesses of what follows the slot's tokens (fewer while probing)."""
        room = min(room, PROBE_GUESSES if slot.draft_quality < MIN_QUALITY else self.draft_tokens)
        if room <= 0:
            return []
        if self.drafter is not None:
            # it reads the tokens it has not seen, then decodes its guesses one at a time:
            # more than a step's worth of tokens to read is a prompt's read (threads.py)
            unread = self.drafter.unread(slot.cache)
            with self.cores(unread if unread > self.draft_tokens + 1 else 0) as threads:
                return self.drafter.propose(slot.cache, room, threads)
        return ngram_draft(slot.cache, max_draft=room)

    def add_guesses(self, slots: Sequence[Slot], batch: StepBatch, room: int,
                    n_ctx_slot: int) -> None:
        """A lone generating stream's guesses, into the batch after its next token: as many
        as `room` (what the batch and the cells hold), its own cells and its reply's limit
        allow."""
        slot = self.candidate(slots)
        if slot is None:
            return
        room = min(room, n_ctx_slot - len(slot.cache) - 1)
        max_tokens = slot.task.params.max_tokens
        if max_tokens is not None:  # no guesses past the last token it may write
            room = min(room, max_tokens - slot.task.stats.generated_tokens - 1)
        slot.draft = self.guesses(slot, room)
        index, row = slot.batch_index, slot.output_row
        for token in slot.draft:
            batch.add(slot, token, logits=True)
        slot.batch_index, slot.output_row = index, row  # the real next token's come first

    def verify(self, slot: Slot, sample: Callable[[Slot, int], int | None],
               emit: Callable[[Slot, int, int], None],
               forget: Callable[[int, int], bool]) -> bool:
        """Sample the real next token, then each guess's successor while the guesses hold.

        Every emitted token is sampled by the request's own sampler from logits computed
        with exactly the tokens before it, so the output is what plain decoding would give.
        `sample` is the engine's (None: the request failed), `emit` hands a token on (with
        the batch row of the logits it was drawn from), and
        `forget(seq, from)` drops the rejected guesses' KV (a hybrid's recurrent state:
        rolled back to a snapshot). False where llama.cpp refused to drop them: the
        sequence no longer holds what the slot says it holds.
        """
        draft, slot.draft = slot.draft, []
        task = slot.task
        del slot.cache[len(slot.cache) - len(draft):]
        task.stats.draft_tokens += len(draft)
        token = sample(slot, slot.batch_index)
        if token is None:  # failed: the guesses' KV goes all the same
            return forget(slot.id, len(slot.cache))
        slot.state = SlotState.GENERATING
        emit(slot, token, slot.batch_index)
        accepted = 0
        while slot.task is task and accepted < len(draft) and token == draft[accepted]:
            slot.cache.append(draft[accepted])  # its KV, computed this step, is valid
            accepted += 1
            token = sample(slot, slot.batch_index + accepted)
            if token is None:
                break
            emit(slot, token, slot.batch_index + accepted)
        task.stats.accepted_tokens += accepted
        self.record(slot, accepted, len(draft))
        return forget(slot.id, len(slot.cache))  # the rejected guesses' KV goes

    @staticmethod
    def record(slot: Slot, accepted: int, guessed: int) -> None:
        """How a step's guesses did, into the slot's moving share."""
        slot.draft_quality += 0.3 * (accepted / guessed - slot.draft_quality)

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
            self.drafter = None
