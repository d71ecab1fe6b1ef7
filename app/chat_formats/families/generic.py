"""The generic shape, which a template without tools is taught (api/tools.py): a JSON object
`{"name": …, "arguments": {…}}`, or a list of them, maybe fenced or tagged. Written as taught,
it streams as the families' calls do: the call as soon as its name is known (and is one of
the tools), then its arguments in fragments. Any other shape (the arguments first or as a
string, a "tool_calls" or "function" wrapper) is judged once the reply has ended, whole."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from localinfer.chat_formats.scan import (Call, Frame, JsonScans, Parsed, Tools, call_schema,
                                          framed, json_call, skip, waits_for)

__all__ = ["FIRST_OPENERS", "grammar", "section"]

# how a reply that is a call begins
FIRST_OPENERS = ("{", "[", "```", "<tool_call>")


def section(text: str, final: bool, tools: Tools, scans: JsonScans) -> Parsed | None:
    streamed = _stream(text, final, tools, scans)
    if streamed is not _WHOLE:
        return streamed
    return _whole(text, tools) if final else Parsed([])


_WHOLE = Parsed([])  # (a sentinel: not the taught shape, to be judged whole at the end)
_OPENERS = (("```json", "```"), ("```", "```"), ("<tool_call>", "</tool_call>"))


def _stream(text: str, final: bool, tools: Tools, scans: JsonScans) -> Parsed | None:
    """The taught shape, read as it streams; _WHOLE where the reply is not in it (yet)."""
    calls: list[Call] = []
    at = 0
    while True:  # a call or a list of calls, maybe fenced or tagged (tagged ones repeat)
        at, close = _opener(text, skip(text, at))
        if at == _NOT_JSON:
            return Parsed(calls, text[at:]) if calls else None
        if at == _OPENING:
            return Parsed(calls, "" if final else None) if calls or not final else _WHOLE
        found = _calls(text, at, final, tools, calls, scans)
        if not isinstance(found, int):
            return found
        at = found
        if close:
            if waits_for(text, at, close) or (at >= len(text) and not final):
                return Parsed(calls)
            if text.startswith(close, at):
                at = skip(text, at + len(close))
        if at >= len(text):
            return Parsed(calls, "" if final else None)
        tagged_again = close == "</tool_call>" and (text.startswith("<tool_call>", at)
                                                    or waits_for(text, at, "<tool_call>"))
        if not tagged_again:
            return Parsed(calls, text[at:])


_OPENING, _NOT_JSON = -1, -2


def _opener(text: str, at: int) -> tuple[int, str]:
    """Past a fence or a tag that opens calls at `at`: where the JSON starts and the mark
    that closes it ("" for a bare object or list); _OPENING while the reply may still
    become one, _NOT_JSON where no JSON follows."""
    close = ""
    for opener, closing in _OPENERS:
        if waits_for(text, at, opener):
            return _OPENING, ""
        if text.startswith(opener, at):
            at, close = skip(text, at + len(opener)), closing
            break
    if at >= len(text):
        return _OPENING, ""
    return (at, close) if text[at] in "{[" else (_NOT_JSON, "")


def _calls(text: str, at: int, final: bool, tools: Tools, calls: list[Call],
           scans: JsonScans) -> int | Parsed | None:
    """The call, or list of calls, at `at` (added to `calls`): where it ends, or what the
    section is so far where it has not ended (None: no calls, _WHOLE: judge it whole)."""
    listed = text[at] == "["
    at = skip(text, at + 1) if listed else at
    while True:
        found = json_call(text, at, scans)
        if found is False:  # being written, its name not known yet
            return Parsed(calls, "" if final else None) if calls or not final else _WHOLE
        if found is None:  # not a call as taught: perhaps another shape of one
            return Parsed(calls, text[at:]) if calls else _WHOLE
        call, end = found
        if call.name not in tools:
            return Parsed(calls, text[at:]) if calls else None
        calls.append(call)
        if end < 0:  # its arguments stream meanwhile
            return Parsed(calls, "" if final else None)
        at = skip(text, end)
        if not listed:
            return at
        if at < len(text) and text[at] == ",":
            at = skip(text, at + 1)
        elif at < len(text) and text[at] == "]":
            return skip(text, at + 1)
        elif at >= len(text):
            return Parsed(calls, "" if final else None)
        else:
            return Parsed(calls, text[at:])


def _whole(text: str, tools: Tools) -> Parsed | None:
    """The whole reply as the calls it may be, in any shape a small model writes them."""
    cleaned = re.sub(r"</?tool_call>", "", re.sub(r"^```(?:json)?\s*|\s*```$", "",
                                                  text.strip())).strip()
    try:
        data = json.loads(cleaned)
    except ValueError:
        return None
    if isinstance(data, Mapping) and "tool_calls" in data:
        data = data["tool_calls"]
    calls = []
    for item in data if isinstance(data, list) else [data]:
        if not isinstance(item, Mapping):
            return None
        item = item.get("function", item)
        name, arguments = item.get("name"), item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if name not in tools or not isinstance(arguments, Mapping):
            return None
        calls.append(Call(name, json.dumps(arguments, ensure_ascii=False), True))
    return Parsed(calls, "") if calls else None


def _frame(name: str, params: Mapping[str, Any]) -> Frame:
    return "", call_schema(name, params), ""


grammar = framed(_frame)
