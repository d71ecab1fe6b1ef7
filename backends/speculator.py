"""Speculative decoding's guesses for a lone generating stream: how many, and which.

The scheduler (engine.py) decodes the guesses with the stream's next token and keeps those
its sampler agrees with, so the reply is what plain decoding would give; this part decides
whether a stream is guessed for (a lone generating stream, nothing reading a prompt), how
many guesses it gets, makes them (a draft model, or prompt lookup: draft.py), and tracks
how well they do: guesses that keep failing cost a prompt token's compute each, so below a
quarter accepted it stops, and probes with two every 16 tokens in case the text turns
repetitive.
"""

from __future__ import annotations

from collections.abc import Sequence

from localinfer.backends.draft import DraftModel, ngram_draft
from localinfer.backends.slots import Slot, SlotState

__all__ = ["Speculator"]

MIN_QUALITY = 0.25  # the moving share of guesses accepted below which a stream stops guessing
PROBE_EVERY = 16  # tokens between probes of a stream that stopped
PROBE_GUESSES = 2


class Speculator:
    def __init__(self, draft_tokens: int, drafter: DraftModel | None = None):
        """draft_tokens: guesses per step, at most (0: off); drafter: a small model of the
        same family to guess with instead of prompt lookup (owned: closed with this)."""
        self.draft_tokens = draft_tokens
        self.drafter = drafter

    def candidate(self, slots: Sequence[Slot]) -> Slot | None:
        """The stream to guess for this step, if any: a lone generating one."""
        if not self.draft_tokens:
            return None
        generating = [s for s in slots if s.state is SlotState.GENERATING]
        if len(generating) != 1 or any(s.state is SlotState.PROCESSING_PROMPT for s in slots):
            return None
        slot = generating[0]
        if slot.draft_quality < MIN_QUALITY and slot.task.stats.generated_tokens % PROBE_EVERY:
            return None
        return slot

    def guesses(self, slot: Slot, room: int) -> list[int]:
        """Up to `room` guesses of what follows the slot's tokens (fewer while probing)."""
        room = min(room, PROBE_GUESSES if slot.draft_quality < MIN_QUALITY else self.draft_tokens)
        if room <= 0:
            return []
        if self.drafter is not None:
            return self.drafter.propose(slot.cache, room)
        return ngram_draft(slot.cache, max_draft=room)

    @staticmethod
    def record(slot: Slot, accepted: int, guessed: int) -> None:
        """How a step's guesses did, into the slot's moving share."""
        slot.draft_quality += 0.3 * (accepted / guessed - slot.draft_quality)

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
            self.drafter = None
