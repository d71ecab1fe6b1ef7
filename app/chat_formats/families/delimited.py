"""Calls between section tokens, each `CALL_OPEN NAME SEP {args} CALL_CLOSE`: DeepSeek V3.1
(`<｜tool▁calls▁begin｜>` …), DeepSeek R1 (which writes `function<｜tool▁sep｜>NAME` and
fences its JSON in ```json … ```) and Kimi K2 (`functions.NAME:0` between
`<|tool_calls_section_begin|>` tokens)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from localinfer.chat_formats.scan import (Call, CallGrammar, Frame, JsonScans, Parsed,
                                          Section, Tools, framed, json_args, skip, waits_for)

__all__ = ["DEEPSEEK", "KIMI", "deepseek_grammar", "deepseek_section", "kimi_grammar",
           "kimi_section"]

# DeepSeek's tokens, by their names
DEEPSEEK = {k: f"<｜{k}｜>" for k in ("tool▁calls▁begin", "tool▁calls▁end", "tool▁call▁begin",
                                       "tool▁sep", "tool▁call▁end")}
# Kimi K2's, in the order of the section's parts
KIMI = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>", "<|tool_call_end|>")


def _section(section_open: str, section_close: str, call_open: str, sep: str,
             call_close: str, name_of: Callable[[str], str]) -> Section:
    def parse(text: str, final: bool, tools: Tools, scans: JsonScans) -> Parsed | None:
        calls: list[Call] = []
        at = len(section_open)
        while True:
            at = skip(text, at)
            if at >= len(text) or waits_for(text, at, section_close) \
                    or waits_for(text, at, call_open):
                return Parsed(calls)
            if text.startswith(section_close, at):
                return Parsed(calls, text[at + len(section_close):])
            if not text.startswith(call_open, at):
                return None
            at += len(call_open)
            split = text.find(sep, at)
            if split < 0:
                return Parsed(calls) if len(text) - at < 300 else None
            head = text[at:split]
            at = split + len(sep)
            if head.strip() == "function":  # DeepSeek R1: function<sep>NAME\n```json\n{…}\n```
                line = text.find("\n", at)
                if line < 0:
                    return Parsed(calls)
                head, at = text[at:line], line + 1
                at = skip(text, at)
                if waits_for(text, at, "```json"):
                    return Parsed(calls)
                for fence in ("```json", "```"):
                    if text.startswith(fence, at):
                        at += len(fence)
                        break
            name = name_of(head.strip())
            found = json_args(text, skip(text, at), scans)
            if found is None or not name:
                return None
            if found is False:
                return Parsed(calls)
            raw, end = found
            calls.append(Call(name, raw, end >= 0))
            if end < 0:
                return Parsed(calls)
            at = skip(text, end)
            if waits_for(text, at, "```"):
                return Parsed(calls)
            if text.startswith("```", at):
                at += 3
            at = skip(text, at)
            if text.startswith(call_close, at):
                at += len(call_close)
            elif at >= len(text) or waits_for(text, at, call_close):
                return Parsed(calls)
            else:
                return None

    return parse


def _kimi_name(head: str) -> str:
    """functions.get_weather:0 → get_weather."""
    head = head.split(":", 1)[0]
    return head.split(".", 1)[1] if head.startswith("functions.") else head


deepseek_section = _section(DEEPSEEK["tool▁calls▁begin"], DEEPSEEK["tool▁calls▁end"],
                            DEEPSEEK["tool▁call▁begin"], DEEPSEEK["tool▁sep"],
                            DEEPSEEK["tool▁call▁end"], lambda h: h)
kimi_section = _section(*KIMI, _kimi_name)


def deepseek_grammar(r1: bool) -> CallGrammar:
    """DeepSeek V3.1's calls, or R1's (`function<sep>NAME` and the JSON fenced)."""
    ds = DEEPSEEK

    def frame(name: str, params: Mapping[str, Any]) -> Frame:
        head = f"function{ds['tool▁sep']}{name}\n```json\n" if r1 else f"{name}{ds['tool▁sep']}"
        tail = "\n```" if r1 else ""
        return (f"{ds['tool▁calls▁begin']}{ds['tool▁call▁begin']}{head}", params,
                f"{tail}{ds['tool▁call▁end']}{ds['tool▁calls▁end']}")

    return framed(frame)


def _kimi_frame(name: str, params: Mapping[str, Any]) -> Frame:
    return (f"{KIMI[0]}{KIMI[2]}functions.{name}:0{KIMI[3]}", params, f"{KIMI[4]}{KIMI[1]}")


kimi_grammar = framed(_kimi_frame)
