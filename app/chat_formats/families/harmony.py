"""gpt-oss's Harmony messages: `<|start|>assistant<|channel|>analysis<|message|>…<|end|>`.
The analysis channel is reasoning, final and commentary are content, and a message to
`functions.NAME` is a call of NAME (a built-in tool's is left out). Its reply is read again
whole at each piece (parser.py's _HarmonyParser), so there is no section parser here."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from localinfer.chat_formats.scan import Frame, framed, held

__all__ = ["grammar", "messages"]

_HEAD = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def messages(text: str, final: bool) -> list[tuple[str, str, str, bool]]:
    """The messages in a reply so far: (kind, name, text, done), kind reasoning, content or
    call; a message still open leaves out what may be the start of its end."""
    items = []
    for message in text.split("<|start|>"):
        head, sep, body = message.partition("<|message|>")
        if not sep:
            continue  # its header is still being written
        done = "<|end|>" in body or final
        body = body.split("<|end|>", 1)[0]
        if not done:
            body = body[:len(body) - held(body, ["<|end|>", "<|start|>"])]
        channel = _HEAD.search(head)
        recipient = _RECIPIENT.search(head)
        if recipient:
            if recipient.group(1).startswith("functions."):
                items.append(("call", recipient.group(1)[len("functions."):], body, done))
        elif channel and channel.group(1) == "analysis":
            items.append(("reasoning", "", body, done))
        else:
            items.append(("content", "", body, done))
    return items


def _frame(name: str, params: Mapping[str, Any]) -> Frame:
    return (f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>",
            params, "")


grammar = framed(_frame)
