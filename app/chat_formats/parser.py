"""A reply taken apart as it streams: `ReplyParser` takes the reply's text piece by piece
and gives back what it can already say — content up to a possible marker (a marker's first
characters are held until they are known), reasoning, and each call as soon as its name is
known, with its JSON arguments in fragments as they come. A call that turns out malformed
is given back as text: a request never fails because a model wrote a bad call.

The parser is a small state machine (start → reasoning → start → content ⇄ calls); in the
calls state it hands the section so far to its format's section parser (families/), with
its own record of the JSON scanned so far. gpt-oss's replies are read by `_HarmonyParser`,
whole again at each piece.
"""

from __future__ import annotations

from localinfer.chat_formats.detect import HARMONY, ChatFormat
from localinfer.chat_formats.families import harmony
from localinfer.chat_formats.reply import Piece
from localinfer.chat_formats.scan import JsonScans, Parsed, Tools, held

__all__ = ["ReplyParser", "parser"]


def parser(fmt: ChatFormat, tools: Tools | None, reasoning: bool = False,
           continued: bool = False) -> ReplyParser:
    """The parser of a reply in this format. continued: the reply goes on from a start the
    request gave it (a prefix): it is content from its first character, its leading
    whitespace kept."""
    made = (_HarmonyParser if fmt is HARMONY else ReplyParser)(fmt, tools, reasoning)
    if continued and fmt is not HARMONY:
        made.state = "content"
    return made


class ReplyParser:
    """A reply's text in, Pieces out, as the text streams.

    tools: the request's functions by name (None: no tools, so no calls are looked for);
    reasoning: whether the prompt opened a reasoning block the reply continues."""

    def __init__(self, fmt: ChatFormat, tools: Tools | None, reasoning: bool = False):
        self.fmt = fmt
        self.tools = tools
        self.buffer = ""
        self.state = "reasoning" if reasoning and fmt.think else "start"
        self.section = ""
        self.sent: list[int] = []  # each call's arguments sent so far (characters)
        self.base = 0  # calls of sections already closed
        self.ids: list[str] = []
        self.finished: set[int] = set()  # calls whose arguments are all sent
        self.degraded = False
        self.scans: JsonScans = {}  # the section's JSON scans so far

    reasoning_tokens = 0  # pieces fed (tokens, as the engine streams them) while reasoning

    def feed(self, text: str) -> list[Piece]:
        """The next piece of the reply (a token's text): what can be said of it now."""
        thinking = self.state == "reasoning"
        self.buffer += text
        pieces = self._advance(final=False)
        if thinking or any(p.kind == "reasoning" for p in pieces):
            self.reasoning_tokens += 1
        return pieces

    def close(self) -> list[Piece]:
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while True:
            state = self.state
            if state == "reasoning":
                self._reasoning(out, final)
            elif state == "start":
                self._start(final)
            elif state == "content":
                self._content(out, final)
            elif state == "calls":
                self._calls(out, final)
            if self.state == state:
                return [p for p in out if p.text or p.kind in ("call", "done")]

    def _reasoning(self, out: list[Piece], final: bool) -> None:
        close = self.fmt.think[1]
        # a call ends the block too where a family calls tools without closing it (Qwen 3.5)
        openers = self.fmt.openers if self.tools is not None and self.fmt.calls_end_thinking \
            else ()
        found = [(at, m) for m in (close, *openers) if (at := self.buffer.find(m)) >= 0]
        rest: str | None = None
        if found:
            at, marker = min(found)
            body = self.buffer[:at].rstrip()
            rest = self.buffer[at + len(marker):] if marker == close else self.buffer[at:]
        elif final:
            body, rest = self.buffer.rstrip(), ""
        else:  # a marker's first characters, and trailing whitespace, wait: the block's
            # last whitespace is dropped
            body = self.buffer[:len(self.buffer) - held(self.buffer, [close, *openers])]
            body = body.rstrip()
            self.buffer = self.buffer[len(body):]
        if not self._reasoning_sent:
            body = body.lstrip()
        if body:
            out.append(Piece("reasoning", body))
            self._reasoning_sent = True
        if rest is not None:
            self.buffer, self.state, self._thought = rest.lstrip(), "start", True

    _reasoning_sent = False
    _thought = False  # a reasoning block has closed

    def _start(self, final: bool) -> None:
        """Before any content: a reasoning block may open, or a reply-opening call."""
        stripped = self.buffer.lstrip()
        if not stripped and not final:
            return  # a reply's leading whitespace is dropped
        candidates = [*self.fmt.first_openers] if self.tools is not None else []
        if self.fmt.think and not self._thought:
            candidates.append(self.fmt.think[0])
        if not final and any(m.startswith(stripped) for m in candidates) and \
                len(stripped) < max(map(len, candidates), default=0):
            return  # it may yet be one of them
        if self.fmt.think and not self._thought and stripped.startswith(self.fmt.think[0]):
            self.buffer = stripped[len(self.fmt.think[0]):]
            self.state = "reasoning"
            return
        if self.tools is not None and not self.degraded:
            for opener in self.fmt.first_openers:
                if stripped.startswith(opener):
                    self.buffer, self.section, self.state = "", stripped, "calls"
                    self.scans.clear()
                    return
        self.buffer = stripped
        self.state = "content"

    def _content(self, out: list[Piece], final: bool) -> None:
        openers = self.fmt.openers if self.tools is not None and not self.degraded else ()
        for marker in self.fmt.dropped:
            self.buffer = self.buffer.replace(marker, "")
        found = [(self.buffer.find(o), o) for o in openers]
        found = [(at, o) for at, o in found if at >= 0]
        if found:
            at, _ = min(found)
            out.append(Piece("content", self.buffer[:at]))
            self.section, self.buffer, self.state = self.buffer[at:], "", "calls"
            self.scans.clear()
            return
        keep = 0 if final else held(self.buffer, [*openers, *self.fmt.dropped])
        out.append(Piece("content", self.buffer[:len(self.buffer) - keep]))
        self.buffer = self.buffer[len(self.buffer) - keep:]

    def _calls(self, out: list[Piece], final: bool) -> None:
        self.section += self.buffer
        self.buffer = ""
        parsed = self.fmt.section(self.section, final, self.tools or {}, self.scans)
        if parsed is not None and final and not parsed.calls:
            parsed = None
        if parsed is not None and final and any(not c.done for c in parsed.calls) \
                and len(self.sent) == self.base:
            parsed = None  # ended inside a call none of which was sent: text after all
        if parsed is None:
            if len(self.sent) == self.base:  # nothing of it sent: the section was text
                self.degraded = True
                self.buffer, self.section, self.state = self.section, "", "content"
                self.scans.clear()
                return
            parsed = Parsed([], "")
        self._give_out(parsed, out)
        if parsed.rest is not None:
            self.base = len(self.sent)
            self.buffer, self.section, self.state = parsed.rest, "", "content"
            self.scans.clear()
        elif final:
            self.section = ""

    def _give_out(self, parsed: Parsed, out: list[Piece]) -> None:
        """What is new of the section's calls: a call once its name is known, its arguments
        since the last piece, its end."""
        for i, call in enumerate(parsed.calls):
            index = self.base + i
            if index >= len(self.sent):
                if not call.name:
                    break
                self.sent.append(0)
                self.ids.append(self.fmt.call_id())
                out.append(Piece("call", index=index, id=self.ids[index], name=call.name))
            fresh = call.arguments[self.sent[index]:]
            if fresh:
                out.append(Piece("arguments", fresh, index=index))
                self.sent[index] = len(call.arguments)
            if call.done and index not in self.finished:
                self.finished.add(index)
                out.append(Piece("done", index=index))


class _HarmonyParser(ReplyParser):
    """gpt-oss: the reply is read again as a whole at each piece (its messages are short
    headers and bodies), and what grew since is given out."""

    def _advance(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        items = harmony.messages(self.buffer, final)
        for k, (kind, name, text, done) in enumerate(items):
            if k >= len(self.sent):
                self.sent.append(0)
                self.ids.append("")
                if kind == "call":
                    if self.tools is None:
                        continue
                    self.ids[k] = self.fmt.call_id()
                    out.append(Piece("call", index=self._index(k), id=self.ids[k], name=name))
            if kind == "call" and not self.ids[k]:
                continue
            if kind != "call" and not self.sent[k]:
                text = text.lstrip()
                self.sent[k] = len(items[k][2]) - len(text)  # leading whitespace skipped
                text = items[k][2]
            fresh = text[self.sent[k]:]
            if kind != "call" and not done:
                fresh = fresh[:len(fresh) - (len(fresh) - len(fresh.rstrip()))]
            if kind != "call" and done:
                fresh = fresh.rstrip()
            if fresh:
                out.append(Piece("arguments" if kind == "call" else kind, fresh,
                                 index=self._index(k)))
                self.sent[k] += len(fresh)
            if kind == "call" and done and k not in self.finished:
                self.finished.add(k)
                out.append(Piece("done", index=self._index(k)))
        return out

    def _index(self, k: int) -> int:
        """A call's index among the calls (messages of other kinds come between)."""
        return sum(1 for i in self.ids[:k] if i)
