"""What the families' parsers share: the result of reading a calls' section (`Call`,
`Parsed`), reading JSON in a section that grows (`json_end`, `json_call`, `json_args`, with
the scans so far passed in), the small scanning steps (`skip`, `waits_for`, `held`), and a
forced call's grammar built from frames of text around its JSON (`call_schema`, `framed`).

A section parser (`Section`) is given the text from a section's opening marker on, whether
the reply has ended, the request's tools by name, and its parser's `JsonScans`; it answers
the calls read so far and, once the section has ended, the text after it — or None when the
text is no call of its family (it is then given back as text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from localinfer.chat_formats.grammar import framed_json_grammar

__all__ = ["Call", "CallGrammar", "Frame", "JsonScans", "Parsed", "Section", "Tools",
           "call_schema", "framed", "held", "json_args", "json_call", "json_end", "skip",
           "waits_for"]

Tools = Mapping[str, Mapping[str, Any]]  # a request's functions by name
# where each JSON value of a section was last read to, by where it starts: (position, depth,
# inside a string); one reply parser's own, emptied when a section begins
JsonScans = dict[int, tuple[int, int, bool]]


@dataclass
class Call:
    name: str
    arguments: str  # JSON text so far (the whole of it once done)
    done: bool


@dataclass
class Parsed:
    calls: list[Call]
    rest: str | None = None  # text after the calls' section, once it has ended


Section = Callable[[str, bool, Tools, JsonScans], "Parsed | None"]

# text before a call's JSON, the JSON's schema, text after it
Frame = tuple[str, Mapping[str, Any], str]
# the grammar of a reply that is one call, of one of the names, in a family's syntax
CallGrammar = Callable[[Tools, Sequence[str]], str]


# ---------------------------------------------------------------------------- JSON scanning
_STRUCTURE = re.compile(r'[{}\[\]"]')
_STRING_BODY = re.compile(r'(?:[^"\\]|\\.)*')


def json_end(text: str, at: int, scans: JsonScans) -> int | None:
    """Where the JSON object or array starting at `at` ends, or None while it is open.

    A call's text is read again each time it grows (a 28 KB call in 4-character pieces took
    4.6 s), so a scan goes on from where the last one of the same section stopped."""
    pos, depth, in_string = scans.get(at, (at, 0, False))
    n = len(text)
    while pos < n:
        if in_string:
            pos = _STRING_BODY.match(text, pos).end()
            if pos >= n or text[pos] != '"':
                break  # open still (or an escape cut in two: read again from it)
            pos += 1
            in_string = False
            continue
        match = _STRUCTURE.search(text, pos)
        if match is None:
            pos = n
            break
        pos = match.end()
        char = match.group()
        if char == '"':
            in_string = True
        else:
            depth += 1 if char in "{[" else -1
            if depth == 0:
                scans.pop(at, None)
                return pos
    scans[at] = (pos, depth, in_string)
    return None


def skip(text: str, at: int) -> int:
    """Past the whitespace at `at`."""
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def waits_for(text: str, at: int, literal: str) -> bool:
    """Whether the text from `at` on is the start of `literal`, not all of it yet."""
    tail = text[at:]
    return len(tail) < len(literal) and literal.startswith(tail)


def held(text: str, markers: Sequence[str]) -> int:
    """How many characters at the end of `text` may be the start of a marker."""
    keep = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), keep, -1):
            if text.endswith(marker[:n]):
                keep = n
                break
    return keep


# ---------------------------------------------------------------------------- a call as JSON
_CALL_HEAD = re.compile(r'\{\s*"(?:name|function|tool_name)"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*'
                        r'"(?:arguments|parameters)"\s*:\s*(?=\{)')
_NAME_KEYS = ("name", "function", "tool_name")
_ARG_KEYS = ("arguments", "parameters")


def json_call(text: str, at: int, scans: JsonScans
              ) -> tuple[Call, int] | None | Literal[False]:
    """A call written as a JSON object at `at` ({"name": …, "arguments": {…}}): the call and
    where it ends; False while it is incomplete (a call with its name known streams its
    arguments meanwhile: `(call, -1)`); None when it is no call."""
    if at >= len(text):
        return False
    if text[at] != "{":
        return None
    end = json_end(text, at, scans)
    if end is None:
        head = _CALL_HEAD.match(text, at)
        if head:
            name = json.loads(f'"{head.group(1)}"')
            args_end = json_end(text, head.end(), scans)
            return Call(name, text[head.end():args_end], False), -1
        return False
    try:
        data = json.loads(text[at:end])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    name = next((data[k] for k in _NAME_KEYS if isinstance(data.get(k), str)), None)
    arguments = next((data[k] for k in _ARG_KEYS if k in data), {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not name or not isinstance(arguments, dict):
        return None
    head = _CALL_HEAD.match(text, at)  # the arguments as written, where they stream as text
    raw = (text[head.end():json_end(text, head.end(), scans)] if head
           else json.dumps(arguments, ensure_ascii=False))
    return Call(name, raw, True), end


def json_args(text: str, at: int, scans: JsonScans
              ) -> tuple[str, int] | None | Literal[False]:
    """A JSON object of arguments at `at`: its text and end; False while open (its text so
    far streams: `(text, -1)`); None when it is not one."""
    if at >= len(text):
        return False
    if text[at] != "{":
        return None
    end = json_end(text, at, scans)
    if end is None:
        return text[at:], -1
    try:
        if not isinstance(json.loads(text[at:end]), dict):
            return None
    except ValueError:
        return None
    return text[at:end], end


# ---------------------------------------------------------------------------- forced calls
def call_schema(name: str, params: Mapping[str, Any], name_key: str = "name",
                args_key: str = "arguments", **extra: Any) -> dict[str, Any]:
    """The schema of a call written as a JSON object: `extra` keys with fixed values, the
    name, then the arguments."""
    keys = {**{k: {"const": v} for k, v in extra.items()}, name_key: {"const": name},
            args_key: params}
    return {"type": "object", "properties": keys, "required": list(keys)}


def framed(frame: Callable[[str, Mapping[str, Any]], Frame]) -> CallGrammar:
    """The grammar of a family whose call is JSON between fixed texts: one frame a tool."""

    def grammar(tools: Tools, names: Sequence[str]) -> str:
        return framed_json_grammar([frame(name, tools[name].get("parameters")
                                          or {"type": "object"}) for name in names])

    return grammar
