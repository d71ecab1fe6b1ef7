"""Stop strings matched across token boundaries; partial stop text is never emitted."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopMatcher"]


class StopMatcher:
    """Feed decoded text piece by piece; get back what is safe to emit.

    Text that could be the start of a stop string is held back until the next
    piece shows whether it is one.
    """

    def __init__(self, stops: Sequence[str]):
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string found

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        if not self._stops:
            return piece
        text = self._held + piece
        found = [(i, s) for s in self._stops if (i := text.find(s)) >= 0]
        cut = min(found)[0] if found else -1
        if cut >= 0:
            self.stopped = True
            self.matched = min(found)[1]
            self._held = ""
            return text[:cut]
        keep = self._longest_partial_suffix(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At the end of generation, the held text was not a stop string after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_partial_suffix(self, text: str) -> int:
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
