"""Llama 3.1–3.3's calls: `{"name": …, "parameters": {…}}` as the whole reply, or after
`<|python_tag|>`; several calls are separated by `;`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localinfer.chat_formats.scan import (Call, Frame, JsonScans, Parsed, Tools, call_schema,
                                          framed, json_call, skip)

__all__ = ["PYTHON_TAG", "grammar", "section"]

PYTHON_TAG = "<|python_tag|>"


def section(text: str, final: bool, tools: Tools, scans: JsonScans) -> Parsed | None:
    at = len(PYTHON_TAG) if text.startswith(PYTHON_TAG) else 0
    calls: list[Call] = []
    while True:
        at = skip(text, at)
        found = json_call(text, at, scans)
        if found is None:
            return None if not calls else Parsed(calls, text[at:])
        if found is False:
            return Parsed(calls) if not final or calls else None
        call, end = found
        calls.append(call)
        if end < 0:
            return Parsed(calls)
        at = skip(text, end)
        if at < len(text) and text[at] == ";":
            at += 1
        elif at >= len(text):
            return Parsed(calls, "" if final else None)
        else:
            return Parsed(calls, text[at:])


def _frame(name: str, params: Mapping[str, Any]) -> Frame:
    return "", call_schema(name, params, args_key="parameters"), ""


grammar = framed(_frame)
