"""Grammars that hold a reply to the request's tools, in the family's own call syntax: one
call forced (tool_choice "required" or a named tool), or each call the model opens held to
its tool's schema while the text around stays free (tool_choice "auto", a lazy grammar that
the call's opening mark wakes). Each syntax's grammar is its module's in `families/`."""

from __future__ import annotations

import re
from collections.abc import Sequence

from localinfer.chat_formats.detect import ChatFormat
from localinfer.chat_formats.scan import Tools

__all__ = ["call_grammar", "lazy_call_grammar"]


def call_grammar(fmt: ChatFormat, tools: Tools, names: Sequence[str]) -> str:
    """A grammar that makes the reply one call, in the family's own syntax, of one of `names`
    with arguments that match its schema (tool_choice "required" or a named tool)."""
    return fmt.grammar(tools, names)


def lazy_call_grammar(fmt: ChatFormat, tools: Tools,
                      thinking: bool) -> tuple[str, tuple[str, ...]] | None:
    """For tool_choice "auto": a grammar that holds each call the model opens to the family's
    syntax and the tool's schema, and the patterns that wake it (its opening mark; after the
    reasoning, where the model thinks first, so a mark it only mentions while thinking stays
    free); None for a family whose calls have no opening mark (Llama 3, gpt-oss, generic).
    The text before the first call, and any text without one, is the model's own."""
    if not fmt.openers or fmt.name in ("llama3", "harmony") or not fmt.template_tools:
        return None
    grammar = call_grammar(fmt, tools, list(tools))
    head, _, rest = grammar.partition("\n")
    grammar = (f"root ::= tool-call ([ \\t\\n]* tool-call)*\n"
               f"tool-call ::= {head.removeprefix('root ::= ')}\n{rest}")
    opener = re.escape(fmt.openers[0])
    triggers: tuple[str, ...]
    if fmt.think and thinking and not fmt.calls_end_thinking:
        close = re.escape(fmt.think[1])
        triggers = (rf"[\s\S]*?{close}[\s\S]*?({opener}[\s\S]*)", rf"\s*({opener}[\s\S]*)")
    else:
        triggers = (rf"[\s\S]*?({opener}[\s\S]*)",)
    return grammar, triggers
