"""Calls as a JSON list after one marker: `[TOOL_CALLS][{…}, …]` (Mistral Nemo),
`<|tool_call|>[…]` (Granite 3), `<|START_ACTION|>[…]<|END_ACTION|>` (Command R7B, whose
calls name `tool_name` and `parameters`). A single call without its list is read too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localinfer.chat_formats.scan import (Call, Frame, JsonScans, Parsed, Section, Tools,
                                          call_schema, framed, json_call, skip, waits_for)

__all__ = ["command_r7b_grammar", "granite_grammar", "mistral_nemo_grammar", "section"]


def section(open_: str, close: str = "") -> Section:
    """The section parser of calls listed after `open_` (and before `close`, where given)."""

    def parse(text: str, final: bool, tools: Tools, scans: JsonScans) -> Parsed | None:
        at = skip(text, len(open_))
        if at >= len(text):
            return Parsed([])
        if text[at] != "[":
            found = json_call(text, at, scans)  # a single call without its list
            if not found:
                return None if found is None else Parsed([])
            call, end = found
            return Parsed([call], None if end < 0 else _after(text, end, close))
        calls: list[Call] = []
        at += 1
        while True:
            at = skip(text, at)
            if at < len(text) and text[at] == "]":
                return Parsed(calls, _after(text, at + 1, close))
            found = json_call(text, at, scans)
            if found is None:
                return None
            if found is False:
                return Parsed(calls)
            call, end = found
            calls.append(call)
            if end < 0:
                return Parsed(calls)
            at = skip(text, end)
            if at < len(text) and text[at] == ",":
                at += 1

    return parse


def _after(text: str, at: int, close: str) -> str | None:
    """The text after a section that ends with `close` (maybe none), or None while the
    closing marker may still come."""
    at = skip(text, at)
    if close:
        if waits_for(text, at, close):
            return None
        if text.startswith(close, at):
            at += len(close)
    return text[at:]


def _mistral_nemo(name: str, params: Mapping[str, Any]) -> Frame:
    return "[TOOL_CALLS][", call_schema(name, params), "]"


def _granite(name: str, params: Mapping[str, Any]) -> Frame:
    return "<|tool_call|>[", call_schema(name, params), "]"


def _command_r7b(name: str, params: Mapping[str, Any]) -> Frame:
    return ("<|START_ACTION|>[", call_schema(name, params, "tool_name", "parameters",
                                             tool_call_id="0"), "]<|END_ACTION|>")


mistral_nemo_grammar = framed(_mistral_nemo)
granite_grammar = framed(_granite)
command_r7b_grammar = framed(_command_r7b)
