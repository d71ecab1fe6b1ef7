"""Mistral's later syntax: `[TOOL_CALLS]NAME[ARGS]{…}`, repeated (Mistral Small 3.2,
Devstral, Ministral 3; a `[CALL_ID]…` after the name is left out). Mistral Nemo's list of
JSON calls is `listed.py`'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localinfer.chat_formats.scan import (Call, Frame, JsonScans, Parsed, Tools, framed,
                                          json_args, skip, waits_for)

__all__ = ["OPEN", "grammar", "section"]

OPEN, ARGS = "[TOOL_CALLS]", "[ARGS]"


def section(text: str, final: bool, tools: Tools, scans: JsonScans) -> Parsed | None:
    calls: list[Call] = []
    at = 0
    while True:
        at = skip(text, at)
        if at >= len(text) or waits_for(text, at, OPEN):
            return Parsed(calls)
        if not text.startswith(OPEN, at):
            return Parsed(calls, text[at:])
        at += len(OPEN)
        split = text.find(ARGS, at)
        if split < 0:
            if len(text) - at > 200 or "\n" in text[at:]:
                return None
            return Parsed(calls)
        name = text[at:split].split("[CALL_ID]", 1)[0].strip()
        found = json_args(text, skip(text, split + len(ARGS)), scans)
        if found is None or not name:
            return None
        if found is False:
            return Parsed(calls)
        raw, end = found
        calls.append(Call(name, raw, end >= 0))
        if end < 0:
            return Parsed(calls)
        at = end


def _frame(name: str, params: Mapping[str, Any]) -> Frame:
    return f"{OPEN}{name}{ARGS}", params, ""


grammar = framed(_frame)
