"""Gemma 4's calls: `<|tool_call>call:NAME{key:<|"|>text<|"|>, n:3}<tool_call|>`, repeated;
keys bare, strings between `<|"|>` marks."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from localinfer.chat_formats.scan import (Call, Frame, JsonScans, Parsed, Tools, framed, skip,
                                          waits_for)

__all__ = ["OPEN", "grammar", "section"]

OPEN, CLOSE = "<|tool_call>", "<tool_call|>"
_STRING = re.compile(r'(<\|"\|>.*?<\|"\|>)', re.S)
_BARE_KEY = re.compile(r'([{,]\s*)([A-Za-z_][\w.-]*)\s*:')


def section(text: str, final: bool, tools: Tools, scans: JsonScans) -> Parsed | None:
    calls: list[Call] = []
    at = 0
    while True:
        at = skip(text, at)
        if at >= len(text) or waits_for(text, at, OPEN):
            return Parsed(calls)
        if not text.startswith(OPEN, at):
            return Parsed(calls, text[at:]) if calls else None
        end = text.find(CLOSE, at)
        if end < 0 and not final:
            return Parsed(calls)
        body = text[at + len(OPEN):end if end >= 0 else len(text)].strip()
        head = re.match(r"call:([^{\s]+)\s*", body)
        if not head:
            return None
        pieces = _STRING.split(body[head.end():])
        written = "".join(json.dumps(p[5:-5], ensure_ascii=False) if i % 2 else
                          _BARE_KEY.sub(r'\1"\2":', p) for i, p in enumerate(pieces))
        try:
            arguments = json.loads(written)
        except ValueError:
            return None
        if not isinstance(arguments, dict):
            return None
        calls.append(Call(head.group(1), json.dumps(arguments, ensure_ascii=False), True))
        if end < 0:
            return Parsed(calls, "")
        at = end + len(CLOSE)


def _frame(name: str, params: Mapping[str, Any]) -> Frame:
    return f"{OPEN}call:{name}", params, CLOSE


grammar = framed(_frame)
