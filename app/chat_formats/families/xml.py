"""Calls as XML tags: Qwen3-Coder's `<tool_call><function=NAME><parameter=K>V</parameter>…`
(also Qwen 3.5, Nemotron 3 Nano, Step 3.5, which may leave out the first opening tag) and
GLM's `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…`. A value is JSON where
the tool's schema says it is not a string, else text."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from localinfer.chat_formats.grammar import literal
from localinfer.chat_formats.scan import (Call, CallGrammar, JsonScans, Parsed, Section, Tools,
                                          skip, waits_for)

__all__ = ["glm_grammar", "glm_section", "qwen3_coder_grammar", "qwen3_coder_section"]

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def _section(function: re.Pattern[str], parameter: re.Pattern[str], bare: str = "") -> Section:
    """Calls whose name `function` finds and whose arguments `parameter` does (key, value);
    `bare`: how a first call written without its opening tag begins."""

    def parse(text: str, final: bool, tools: Tools, scans: JsonScans) -> Parsed | None:
        calls: list[Call] = []
        at = 0
        while True:
            at = skip(text, at)
            if at >= len(text) or waits_for(text, at, OPEN):
                return Parsed(calls)
            if text.startswith(OPEN, at):
                at += len(OPEN)
            elif not calls and bare and text.startswith(bare, at):
                pass  # a first call written without its opening tag
            else:
                return Parsed(calls, text[at:]) if calls else None
            end = text.find(CLOSE, at)
            if end < 0:
                if final and bare and text.rfind("</function>", at) >= 0:
                    end = len(text)  # the closing tag left out at the reply's end
                else:
                    return Parsed(calls)
            body = text[at:end]
            head = function.search(body)
            if not head:
                return None
            name = head.group(1).strip()
            properties = (tools.get(name, {}).get("parameters") or {}).get("properties") or {}
            arguments = {}
            for match in parameter.finditer(body, head.end()):
                key, value = match.group(1).strip(), match.group(2)
                value = value[1:] if value.startswith("\n") else value
                value = value[:-1] if value.endswith("\n") else value
                arguments[key] = _value(value, (properties.get(key) or {}).get("type"))
            calls.append(Call(name, json.dumps(arguments, ensure_ascii=False), True))
            at = end + len(CLOSE)

    return parse


def _value(text: str, declared: Any) -> Any:
    if text.strip() == "null":
        return None
    if declared == "string" or (isinstance(declared, list) and "string" in declared):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


qwen3_coder_section = _section(re.compile(r"<function=([^>\n]+)>"),
                               re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S),
                               bare="<function=")
glm_section = _section(re.compile(r"^\s*([^<\n]+)"),
                       re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>",
                                  re.S))


def _grammar(glm: bool) -> CallGrammar:
    """Each of the tool's parameters as a tag with a value (its first 256 keys)."""

    def grammar(tools: Tools, names: Sequence[str]) -> str:
        alternatives = [_call(name, tools[name], glm) for name in names]
        return f"root ::= {' | '.join(alternatives)}\ntext ::= [^<]*\n"

    return grammar


def _call(name: str, tool: Mapping[str, Any], glm: bool) -> str:
    keys = list(((tool.get("parameters") or {}).get("properties") or {}))[:256]
    key = " | ".join(literal(k) for k in keys) or literal("value")
    if glm:
        return (f'"<tool_call>" {literal(name)} "\\n" ("<arg_key>" ({key}) '
                f'"</arg_key>\\n<arg_value>" text "</arg_value>\\n")* "</tool_call>"')
    return (f'"<tool_call>\\n<function=" {literal(name)} ">\\n" '
            f'("<parameter=" ({key}) ">\\n" text "\\n</parameter>\\n")* '
            f'"</function>\\n</tool_call>"')


qwen3_coder_grammar = _grammar(glm=False)
glm_grammar = _grammar(glm=True)
