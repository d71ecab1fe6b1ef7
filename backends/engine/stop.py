"""Stop strings matched across token boundaries; partial stop text is never emitted. Also
llama-server's indentation limit for code completion: a line less indented than asked ends
the reply before it."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopMatcher"]


class StopMatcher:
    """Feed decoded text piece by piece; get back what is safe to emit.

    Text that could be the start of a stop string is held back until the next
    piece shows whether it is one.
    """

    def __init__(self, stops: Sequence[str], min_indent: int = 0):
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string found
        # a line after the first with text in it and fewer leading spaces or tabs than this
        # ends the reply at the newline before it (the completion left the block); 0: off
        self._min_indent = min_indent
        self._line = ""  # from a newline whose next line's indentation is not yet known
        self.newline = False  # a newline has been emitted

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        text = self._strings(piece)
        if self._min_indent > 0:
            text = self._indented(text, ending=self.stopped)
        self.newline = self.newline or "\n" in text
        return text

    def _strings(self, piece: str) -> str:
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

    def _indented(self, text: str, ending: bool) -> str:
        """What may go out of `text`, holding a newline and the next line's leading
        whitespace until its first other character shows the line's indentation (all of
        it, where the reply is `ending`)."""
        text, self._line = self._line + text, ""
        start = 0
        while (newline := text.find("\n", start)) >= 0:
            line_start = at = newline + 1
            while at < len(text) and text[at] in " \t":
                at += 1
            if at == len(text):  # its indentation is not known yet
                if ending:
                    return text
                self._line = text[newline:]
                return text[:newline]
            if text[at] != "\n" and at - line_start < self._min_indent:
                self.stopped = True
                self._held = ""
                return text[:newline]
            start = line_start
        return text

    def flush(self) -> str:
        """At the end of generation, the held text was not a stop string after all (nor a
        line less indented: a last line of whitespace goes out as it is)."""
        if self.stopped:
            return ""
        held, self._held = self._held, ""
        return self._indented(held, ending=True) if self._min_indent > 0 else held

    def _longest_partial_suffix(self, text: str) -> int:
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
