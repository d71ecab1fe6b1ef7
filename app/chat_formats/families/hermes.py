"""Hermes' syntax: each call a JSON object inside its own tags, one after another —
`<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Hermes, Qwen 2.5 and 3, QwQ,
Granite 4)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localinfer.chat_formats.scan import (Call, Frame, JsonScans, Parsed, Tools, call_schema,
                                          framed, json_call, skip, waits_for)

__all__ = ["OPEN", "grammar", "section"]

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def section(text: str, final: bool, tools: Tools, scans: JsonScans) -> Parsed | None:
    calls: list[Call] = []
    at = 0
    while True:
        at = skip(text, at)
        if at >= len(text) or waits_for(text, at, OPEN):
            return Parsed(calls)
        if not text.startswith(OPEN, at):
            return Parsed(calls, text[at:]) if calls else None
        found = json_call(text, skip(text, at + len(OPEN)), scans)
        if found is None:
            return None
        if found is False:
            return Parsed(calls)
        call, end = found
        calls.append(call)
        if end < 0:
            return Parsed(calls)
        at = skip(text, end)
        if text.startswith(CLOSE, at):
            at += len(CLOSE)
        elif waits_for(text, at, CLOSE) or at >= len(text):
            return Parsed(calls) if not final else Parsed(calls, "")
        else:
            return None


def _frame(name: str, params: Mapping[str, Any]) -> Frame:
    return f"{OPEN}\n", call_schema(name, params), f"\n{CLOSE}"


grammar = framed(_frame)
