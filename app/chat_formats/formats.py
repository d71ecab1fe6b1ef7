"""How a model family writes tool calls and reasoning, read from its own chat template, and a
reply taken apart as it streams: content, reasoning, and tool calls.

A template that renders `tools` itself teaches the model its family's call syntax (Hermes'
`<tool_call>` JSON, Llama 3's bare JSON, Mistral's `[TOOL_CALLS]`, DeepSeek's and Kimi's
section tokens, Qwen3-Coder's and GLM's XML, Granite's `<|tool_call|>`, Command R7B's
actions); `detect` names the syntax from the template's text, as llama.cpp and Ollama do.
A template that knows no tools gets them through a generic instruction and writes the
generic JSON shape (`api/tools.py`). Reasoning is the text between a family's thinking
markers (`<think>` … `</think>`, Command R7B's `<|START_THINKING|>`); a template whose
generation prompt opens the block itself (DeepSeek-R1, QwQ) starts the reply inside it.

`ReplyParser` takes the reply's text piece by piece and gives back what it can already say:
content up to a possible marker (a marker's first characters are held until they are
known), reasoning, and each call as soon as its name is known, with its JSON arguments in
fragments as they come. A call that turns out malformed is given back as text: a request
never fails because a model wrote a bad call.
"""

from __future__ import annotations

import json
import re
import secrets
import string
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localinfer.chat_formats.think import ThinkLimit
from localinfer.chat_formats.grammar import framed_json_grammar, literal

__all__ = ["EFFORT_BUDGETS", "ChatFormat", "Piece", "Reply", "ReplyParser", "arguments_object",
           "call_grammar", "detect", "lazy_call_grammar", "opens_reasoning", "parser",
           "start_chat", "think_limit", "with_thinking"]


@dataclass(frozen=True)
class Piece:
    """What a reply says next: `content` or `reasoning` text, a `call` (its index, id and
    name), a fragment of a call's `arguments` (JSON text; a call's fragments joined are
    its arguments), or `done`: that call's arguments are complete."""

    kind: str
    text: str = ""
    index: int = 0
    id: str = ""
    name: str = ""


@dataclass
class Reply:
    """A whole reply, gathered from its Pieces."""

    content: str = ""
    reasoning: str = ""
    calls: list[dict[str, str]] = field(default_factory=list)  # id, name, arguments (JSON)
    pieces: list[Piece] = field(default_factory=list)  # all of them, in the reply's order

    def add(self, piece: Piece) -> None:
        self.pieces.append(piece)
        if piece.kind == "content":
            self.content += piece.text
        elif piece.kind == "reasoning":
            self.reasoning += piece.text
        elif piece.kind == "call":
            self.calls.append({"id": piece.id, "name": piece.name, "arguments": ""})
        elif piece.kind == "arguments":
            self.calls[piece.index]["arguments"] += piece.text

    @classmethod
    def of(cls, pieces: Sequence[Piece]) -> Reply:
        reply = cls()
        for piece in pieces:
            reply.add(piece)
        return reply


def arguments_object(text: str) -> dict[str, Any]:
    """A call's arguments as an object (Ollama's shape); {} when a reply ended inside them."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class _Call:
    name: str
    arguments: str  # JSON text so far (the whole of it once done)
    done: bool


@dataclass
class _Parsed:
    calls: list[_Call]
    rest: str | None = None  # text after the calls' section, once it has ended


# a section parser: the text from a section's opening marker on, and whether the reply has
# ended; None when the text is no call of this family
Section = Callable[[str, bool, Mapping[str, Mapping[str, Any]]], "_Parsed | None"]


@dataclass(frozen=True)
class ChatFormat:
    name: str
    openers: tuple[str, ...] = ()  # where a calls' section begins, anywhere in a reply
    first_openers: tuple[str, ...] = ()  # … or only as a reply's first text
    section: Section | None = None
    think: tuple[str, str] | None = None  # reasoning's markers
    dropped: tuple[str, ...] = ()  # markers around the answer, not part of it
    template_tools: bool = True  # the template writes the tools itself
    short_ids: bool = False  # Mistral's templates insist on 9-character call ids
    preserved: tuple[str, ...] = field(default=())  # control tokens to keep as text
    calls_end_thinking: bool = False  # a call opens without closing the reasoning first
    variant: str = ""  # DeepSeek: "r1" writes `function<sep>NAME` and fences the JSON

    def call_id(self) -> str:
        if self.short_ids:
            return "".join(secrets.choice(string.ascii_letters + string.digits)
                           for _ in range(9))
        return f"call_{secrets.token_hex(12)}"

    @property
    def markers(self) -> tuple[str, ...]:
        return (*self.openers, *self.first_openers, *(self.think or ()), *self.dropped)


# ---------------------------------------------------------------------------- JSON scanning
_STRUCTURE = re.compile(r'[{}\[\]"]')
_STRING_BODY = re.compile(r'(?:[^"\\]|\\.)*')
_scans = threading.local()  # a parser's scans so far, while it reads its section


def _json_end(text: str, at: int) -> int | None:
    """Where the JSON object or array starting at `at` ends, or None while it is open.

    A call's text is read again each time it grows (a 28 KB call in 4-character pieces took
    4.6 s), so where a parser is reading, a scan goes on from where the last one stopped."""
    memo = getattr(_scans, "memo", None)
    pos, depth, in_string = memo.get(at, (at, 0, False)) if memo is not None else (at, 0, False)
    n = len(text)
    while pos < n:
        if in_string:
            pos = _STRING_BODY.match(text, pos).end()
            if pos >= n or text[pos] != '"':
                break  # open still (or an escape cut in two: read again from it)
            pos += 1
            in_string = False
            continue
        match = _STRUCTURE.search(text, pos)
        if match is None:
            pos = n
            break
        pos = match.end()
        char = match.group()
        if char == '"':
            in_string = True
        else:
            depth += 1 if char in "{[" else -1
            if depth == 0:
                if memo is not None:
                    memo.pop(at, None)
                return pos
    if memo is not None:
        memo[at] = (pos, depth, in_string)
    return None


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def _waits_for(text: str, at: int, literal: str) -> bool:
    """Whether the text from `at` on is the start of `literal`, not all of it yet."""
    tail = text[at:]
    return len(tail) < len(literal) and literal.startswith(tail)


_CALL_HEAD = re.compile(r'\{\s*"(?:name|function|tool_name)"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*'
                        r'"(?:arguments|parameters)"\s*:\s*(?=\{)')
_NAME_KEYS = ("name", "function", "tool_name")
_ARG_KEYS = ("arguments", "parameters")


def _json_call(text: str, at: int) -> tuple[_Call, int] | None | bool:
    """A call written as a JSON object at `at` ({"name": …, "arguments": {…}}): the call and
    where it ends; False while it is incomplete (a call with its name known streams its
    arguments meanwhile: `(call, -1)`); None when it is no call."""
    if at >= len(text):
        return False
    if text[at] != "{":
        return None
    end = _json_end(text, at)
    if end is None:
        head = _CALL_HEAD.match(text, at)
        if head:
            name = json.loads(f'"{head.group(1)}"')
            args_end = _json_end(text, head.end())
            return _Call(name, text[head.end():args_end], False), -1
        return False
    try:
        data = json.loads(text[at:end])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    name = next((data[k] for k in _NAME_KEYS if isinstance(data.get(k), str)), None)
    arguments = next((data[k] for k in _ARG_KEYS if k in data), {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not name or not isinstance(arguments, dict):
        return None
    head = _CALL_HEAD.match(text, at)  # the arguments as written, where they stream as text
    raw = (text[head.end():_json_end(text, head.end())] if head
           else json.dumps(arguments, ensure_ascii=False))
    return _Call(name, raw, True), end


def _json_args(text: str, at: int) -> tuple[str, int] | None | bool:
    """A JSON object of arguments at `at`: its text and end; False while open (its text so
    far streams: `(text, -1)`); None when it is not one."""
    if at >= len(text):
        return False
    if text[at] != "{":
        return None
    end = _json_end(text, at)
    if end is None:
        return text[at:], -1
    try:
        if not isinstance(json.loads(text[at:end]), dict):
            return None
    except ValueError:
        return None
    return text[at:end], end


# ---------------------------------------------------------------------------- section parsers
def _tagged(open_: str, close: str) -> Section:
    """Calls as JSON objects, each inside its own tags: <tool_call>{…}</tool_call> (Hermes,
    Qwen 2.5 and 3, Granite 4), and one after another."""

    def parse(text: str, final: bool, tools: Mapping[str, Mapping[str, Any]]) -> _Parsed | None:
        calls: list[_Call] = []
        at = 0
        while True:
            at = _skip(text, at)
            if at >= len(text) or _waits_for(text, at, open_):
                return _Parsed(calls)
            if not text.startswith(open_, at):
                return _Parsed(calls, text[at:]) if calls else None
            found = _json_call(text, _skip(text, at + len(open_)))
            if found is None:
                return None
            if found is False:
                return _Parsed(calls)
            call, end = found
            calls.append(call)
            if end < 0:
                return _Parsed(calls)
            at = _skip(text, end)
            if text.startswith(close, at):
                at += len(close)
            elif _waits_for(text, at, close) or at >= len(text):
                return _Parsed(calls) if not final else _Parsed(calls, "")
            else:
                return None

    return parse


def _listed(open_: str, close: str = "") -> Section:
    """Calls as a JSON list after one marker: [TOOL_CALLS][{…}, …] (Mistral Nemo),
    <|tool_call|>[…] (Granite 3), <|START_ACTION|>[…]<|END_ACTION|> (Command R7B)."""

    def parse(text: str, final: bool, tools: Mapping[str, Mapping[str, Any]]) -> _Parsed | None:
        at = _skip(text, len(open_))
        if at >= len(text):
            return _Parsed([])
        if text[at] != "[":
            found = _json_call(text, at)  # a single call without its list
            if not found:
                return None if found is None else _Parsed([])
            call, end = found
            return _Parsed([call], None if end < 0 else _after(text, end, close))
        calls: list[_Call] = []
        at += 1
        while True:
            at = _skip(text, at)
            if at < len(text) and text[at] == "]":
                return _Parsed(calls, _after(text, at + 1, close))
            found = _json_call(text, at)
            if found is None:
                return None
            if found is False:
                return _Parsed(calls)
            call, end = found
            calls.append(call)
            if end < 0:
                return _Parsed(calls)
            at = _skip(text, end)
            if at < len(text) and text[at] == ",":
                at += 1

    return parse


def _after(text: str, at: int, close: str) -> str | None:
    """The text after a section that ends with `close` (maybe none), or None while the
    closing marker may still come."""
    at = _skip(text, at)
    if close:
        if _waits_for(text, at, close):
            return None
        if text.startswith(close, at):
            at += len(close)
    return text[at:]


def _named(open_: str, args: str) -> Section:
    """[TOOL_CALLS]name[ARGS]{…}, repeated (Mistral Small 3.2, Devstral, Ministral 3)."""

    def parse(text: str, final: bool, tools: Mapping[str, Mapping[str, Any]]) -> _Parsed | None:
        calls: list[_Call] = []
        at = 0
        while True:
            at = _skip(text, at)
            if at >= len(text) or _waits_for(text, at, open_):
                return _Parsed(calls)
            if not text.startswith(open_, at):
                return _Parsed(calls, text[at:])
            at += len(open_)
            split = text.find(args, at)
            if split < 0:
                if len(text) - at > 200 or "\n" in text[at:]:
                    return None
                return _Parsed(calls)
            name = text[at:split].split("[CALL_ID]", 1)[0].strip()
            found = _json_args(text, _skip(text, split + len(args)))
            if found is None or not name:
                return None
            if found is False:
                return _Parsed(calls)
            raw, end = found
            calls.append(_Call(name, raw, end >= 0))
            if end < 0:
                return _Parsed(calls)
            at = end

    return parse


def _delimited(section_open: str, section_close: str, call_open: str, sep: str,
               call_close: str, name_of: Callable[[str], str]) -> Section:
    """Calls between section tokens, each `call_open NAME sep {args} call_close` (DeepSeek
    V3.1, Kimi K2; DeepSeek R1 writes `function<sep>NAME` and fences its JSON)."""

    def parse(text: str, final: bool, tools: Mapping[str, Mapping[str, Any]]) -> _Parsed | None:
        calls: list[_Call] = []
        at = len(section_open)
        while True:
            at = _skip(text, at)
            if at >= len(text) or _waits_for(text, at, section_close) \
                    or _waits_for(text, at, call_open):
                return _Parsed(calls)
            if text.startswith(section_close, at):
                return _Parsed(calls, text[at + len(section_close):])
            if not text.startswith(call_open, at):
                return None
            at += len(call_open)
            split = text.find(sep, at)
            if split < 0:
                return _Parsed(calls) if len(text) - at < 300 else None
            head = text[at:split]
            at = split + len(sep)
            if head.strip() == "function":  # DeepSeek R1: function<sep>NAME\n```json\n{…}\n```
                line = text.find("\n", at)
                if line < 0:
                    return _Parsed(calls)
                head, at = text[at:line], line + 1
                at = _skip(text, at)
                if _waits_for(text, at, "```json"):
                    return _Parsed(calls)
                for fence in ("```json", "```"):
                    if text.startswith(fence, at):
                        at += len(fence)
                        break
            name = name_of(head.strip())
            found = _json_args(text, _skip(text, at))
            if found is None or not name:
                return None
            if found is False:
                return _Parsed(calls)
            raw, end = found
            calls.append(_Call(name, raw, end >= 0))
            if end < 0:
                return _Parsed(calls)
            at = _skip(text, end)
            if _waits_for(text, at, "```"):
                return _Parsed(calls)
            if text.startswith("```", at):
                at += 3
            at = _skip(text, at)
            if text.startswith(call_close, at):
                at += len(call_close)
            elif at >= len(text) or _waits_for(text, at, call_close):
                return _Parsed(calls)
            else:
                return None

    return parse


def _xml(open_: str, close: str, function: re.Pattern[str], parameter: re.Pattern[str],
         bare: str = "") -> Section:
    """Calls as XML: Qwen3-Coder's <tool_call><function=NAME><parameter=K>V</parameter>…
    and GLM's <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…; a value is
    JSON where the tool's schema says it is not a string, else text."""

    def parse(text: str, final: bool, tools: Mapping[str, Mapping[str, Any]]) -> _Parsed | None:
        calls: list[_Call] = []
        at = 0
        while True:
            at = _skip(text, at)
            if at >= len(text) or _waits_for(text, at, open_):
                return _Parsed(calls)
            if text.startswith(open_, at):
                at += len(open_)
            elif not calls and bare and text.startswith(bare, at):
                pass  # a first call written without its opening tag
            else:
                return _Parsed(calls, text[at:]) if calls else None
            end = text.find(close, at)
            if end < 0:
                if final and bare and text.rfind("</function>", at) >= 0:
                    end = len(text)  # the closing tag left out at the reply's end
                else:
                    return _Parsed(calls)
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
            calls.append(_Call(name, json.dumps(arguments, ensure_ascii=False), True))
            at = end + len(close)

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


_GEMMA_STRING = re.compile(r'(<\|"\|>.*?<\|"\|>)', re.S)
_BARE_KEY = re.compile(r'([{,]\s*)([A-Za-z_][\w.-]*)\s*:')


def _gemma4(text: str, final: bool, tools: Mapping[str, Mapping[str, Any]]) -> _Parsed | None:
    """Gemma 4: <|tool_call>call:NAME{key:<|"|>text<|"|>, n:3}<tool_call|>, repeated; keys
    bare, strings between <|"|> marks."""
    calls: list[_Call] = []
    at = 0
    while True:
        at = _skip(text, at)
        if at >= len(text) or _waits_for(text, at, "<|tool_call>"):
            return _Parsed(calls)
        if not text.startswith("<|tool_call>", at):
            return _Parsed(calls, text[at:]) if calls else None
        end = text.find("<tool_call|>", at)
        if end < 0 and not final:
            return _Parsed(calls)
        body = text[at + len("<|tool_call>"):end if end >= 0 else len(text)].strip()
        head = re.match(r"call:([^{\s]+)\s*", body)
        if not head:
            return None
        pieces = _GEMMA_STRING.split(body[head.end():])
        written = "".join(json.dumps(p[5:-5], ensure_ascii=False) if i % 2 else
                          _BARE_KEY.sub(r'\1"\2":', p) for i, p in enumerate(pieces))
        try:
            arguments = json.loads(written)
        except ValueError:
            return None
        if not isinstance(arguments, dict):
            return None
        calls.append(_Call(head.group(1), json.dumps(arguments, ensure_ascii=False), True))
        if end < 0:
            return _Parsed(calls, "")
        at = end + len("<tool_call|>")


def _generic(text: str, final: bool, tools: Mapping[str, Mapping[str, Any]]) -> _Parsed | None:
    """The generic shape a template without tools is taught (api/tools.py): a JSON object
    {"name": …, "arguments": {…}}, or a list of them, maybe fenced or tagged. Written as
    taught, it streams as the families' calls do: the call as soon as its name is known
    (and is one of the tools), then its arguments in fragments. Any other shape (the
    arguments first or as a string, a "tool_calls" or "function" wrapper) is judged once the
    reply has ended, whole."""
    streamed = _generic_stream(text, final, tools)
    if streamed is not _WHOLE:
        return streamed
    return _generic_whole(text, tools) if final else _Parsed([])


_WHOLE = _Parsed([])  # (a sentinel: not the taught shape, to be judged whole at the end)
_GENERIC_OPENERS = (("```json", "```"), ("```", "```"), ("<tool_call>", "</tool_call>"))


def _generic_stream(text: str, final: bool,
                    tools: Mapping[str, Mapping[str, Any]]) -> _Parsed | None:
    """The taught shape, read as it streams; _WHOLE where the reply is not in it (yet)."""
    calls: list[_Call] = []
    at = 0
    while True:  # a call or a list of calls, maybe fenced or tagged (tagged ones repeat)
        at, close = _generic_opener(text, _skip(text, at))
        if at == _NOT_JSON:
            return _Parsed(calls, text[at:]) if calls else None
        if at == _OPENING:
            return _Parsed(calls, "" if final else None) if calls or not final else _WHOLE
        found = _generic_calls(text, at, final, tools, calls)
        if not isinstance(found, int):
            return found
        at = found
        if close:
            if _waits_for(text, at, close) or (at >= len(text) and not final):
                return _Parsed(calls)
            if text.startswith(close, at):
                at = _skip(text, at + len(close))
        if at >= len(text):
            return _Parsed(calls, "" if final else None)
        tagged_again = close == "</tool_call>" and (text.startswith("<tool_call>", at)
                                                    or _waits_for(text, at, "<tool_call>"))
        if not tagged_again:
            return _Parsed(calls, text[at:])


_OPENING, _NOT_JSON = -1, -2


def _generic_opener(text: str, at: int) -> tuple[int, str]:
    """Past a fence or a tag that opens calls at `at`: where the JSON starts and the mark
    that closes it ("" for a bare object or list); _OPENING while the reply may still
    become one, _NOT_JSON where no JSON follows."""
    close = ""
    for opener, closing in _GENERIC_OPENERS:
        if _waits_for(text, at, opener):
            return _OPENING, ""
        if text.startswith(opener, at):
            at, close = _skip(text, at + len(opener)), closing
            break
    if at >= len(text):
        return _OPENING, ""
    return (at, close) if text[at] in "{[" else (_NOT_JSON, "")


def _generic_calls(text: str, at: int, final: bool, tools: Mapping[str, Mapping[str, Any]],
                   calls: list[_Call]) -> int | _Parsed | None:
    """The call, or list of calls, at `at` (added to `calls`): where it ends, or what the
    section is so far where it has not ended (None: no calls, _WHOLE: judge it whole)."""
    listed = text[at] == "["
    at = _skip(text, at + 1) if listed else at
    while True:
        found = _json_call(text, at)
        if found is False:  # being written, its name not known yet
            return _Parsed(calls, "" if final else None) if calls or not final else _WHOLE
        if found is None:  # not a call as taught: perhaps another shape of one
            return _Parsed(calls, text[at:]) if calls else _WHOLE
        call, end = found
        if call.name not in tools:
            return _Parsed(calls, text[at:]) if calls else None
        calls.append(call)
        if end < 0:  # its arguments stream meanwhile
            return _Parsed(calls, "" if final else None)
        at = _skip(text, end)
        if not listed:
            return at
        if at < len(text) and text[at] == ",":
            at = _skip(text, at + 1)
        elif at < len(text) and text[at] == "]":
            return _skip(text, at + 1)
        elif at >= len(text):
            return _Parsed(calls, "" if final else None)
        else:
            return _Parsed(calls, text[at:])


def _generic_whole(text: str, tools: Mapping[str, Mapping[str, Any]]) -> _Parsed | None:
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
        calls.append(_Call(name, json.dumps(arguments, ensure_ascii=False), True))
    return _Parsed(calls, "") if calls else None


# ---------------------------------------------------------------------------- the families
_THINK = ("<think>", "</think>")
_DS = {k: f"<｜{k}｜>" for k in ("tool▁calls▁begin", "tool▁calls▁end", "tool▁call▁begin",
                                   "tool▁sep", "tool▁call▁end")}

GENERIC = ChatFormat("generic", first_openers=("{", "[", "```", "<tool_call>"),
                     section=_generic, template_tools=False)


def detect(source: str | None) -> ChatFormat:
    """The call syntax and reasoning markers of a chat template, from its text."""
    if not source:
        return GENERIC
    think = _THINK if "<think>" in source or "</think>" in source else None
    if "<｜tool▁calls▁begin｜>" in source:
        return ChatFormat("deepseek", openers=(_DS["tool▁calls▁begin"],),
                          section=_delimited(_DS["tool▁calls▁begin"], _DS["tool▁calls▁end"],
                                             _DS["tool▁call▁begin"], _DS["tool▁sep"],
                                             _DS["tool▁call▁end"], lambda h: h),
                          think=think or _THINK, preserved=tuple(_DS.values()),
                          variant="r1" if "```json" in source else "")
    if "<|channel|>" in source and "<|message|>" in source:
        return HARMONY
    if "<|tool_call>" in source:
        return ChatFormat("gemma4", openers=("<|tool_call>",), section=_gemma4,
                          think=("<|channel>thought", "<channel|>"), dropped=("<channel|>",),
                          preserved=("<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>",
                                     "<channel|>"))
    if "<|tool_calls_section_begin|>" in source:
        return ChatFormat("kimi-k2", openers=("<|tool_calls_section_begin|>",),
                          section=_delimited("<|tool_calls_section_begin|>",
                                             "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                                             "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                                             _kimi_name),
                          think=think, preserved=("<|tool_calls_section_begin|>",
                                                  "<|tool_calls_section_end|>",
                                                  "<|tool_call_begin|>",
                                                  "<|tool_call_argument_begin|>",
                                                  "<|tool_call_end|>"))
    if "<|START_ACTION|>" in source:
        return ChatFormat("command-r7b", openers=("<|START_ACTION|>",),
                          section=_listed("<|START_ACTION|>", "<|END_ACTION|>"),
                          think=("<|START_THINKING|>", "<|END_THINKING|>"),
                          dropped=("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
                          preserved=("<|START_ACTION|>", "<|END_ACTION|>", "<|START_THINKING|>",
                                     "<|END_THINKING|>", "<|START_RESPONSE|>",
                                     "<|END_RESPONSE|>"))
    if "<function=" in source and "<parameter=" in source:
        return ChatFormat("qwen3-coder", openers=("<tool_call>", "<function="),
                          section=_xml("<tool_call>", "</tool_call>", re.compile(r"<function=([^>\n]+)>"),
                                       re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S),
                                       bare="<function="),
                          think=think, calls_end_thinking=True)
    if "<arg_key>" in source:
        return ChatFormat("glm", openers=("<tool_call>",),
                          section=_xml("<tool_call>", "</tool_call>", re.compile(r"^\s*([^<\n]+)"),
                                       re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)"
                                                  r"</arg_value>", re.S)),
                          think=think)
    if "<tool_call>" in source:
        return ChatFormat("hermes", openers=("<tool_call>",),
                          section=_tagged("<tool_call>", "</tool_call>"), think=think)
    if "[TOOL_CALLS]" in source:
        if "[ARGS]" in source:
            return ChatFormat("mistral", openers=("[TOOL_CALLS]",),
                              section=_named("[TOOL_CALLS]", "[ARGS]"), short_ids=True,
                              think=("[THINK]", "[/THINK]") if "[THINK]" in source else None,
                              preserved=("[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]"))
        return ChatFormat("mistral-nemo", openers=("[TOOL_CALLS]",),
                          section=_listed("[TOOL_CALLS]"), short_ids=True,
                          preserved=("[TOOL_CALLS]",))
    if "<|tool_call|>" in source:
        return ChatFormat("granite", openers=("<|tool_call|>",), section=_listed("<|tool_call|>"),
                          think=think, dropped=("<response>", "</response>"),
                          preserved=("<|tool_call|>",))
    if "ipython" in source and "tools" in source:
        return ChatFormat("llama3", openers=("<|python_tag|>",), first_openers=("{",),
                          section=_llama3, preserved=("<|python_tag|>",))
    if re.search(r"\btools\b", source):
        return ChatFormat("generic-template", first_openers=GENERIC.first_openers,
                          section=_generic, think=think)
    return ChatFormat("generic", first_openers=GENERIC.first_openers, section=_generic,
                      think=think, template_tools=False)


HARMONY = ChatFormat("harmony", think=("<|channel|>analysis", "<|end|>"),
                     preserved=("<|start|>", "<|end|>", "<|channel|>", "<|message|>",
                                "<|constrain|>"))
_HARMONY_HEAD = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def _harmony(text: str, final: bool) -> list[tuple[str, str, str, bool]]:
    """gpt-oss's messages in a reply: (kind, name, text, done) with kind reasoning, content or
    call — analysis is reasoning, final and commentary are content, and a message to
    `functions.NAME` is a call of NAME (a built-in tool's is left out)."""
    items = []
    for message in text.split("<|start|>"):
        head, sep, body = message.partition("<|message|>")
        if not sep:
            continue  # its header is still being written
        done = "<|end|>" in body or final
        body = body.split("<|end|>", 1)[0]
        if not done:
            body = body[:len(body) - _held(body, ["<|end|>", "<|start|>"])]
        channel = _HARMONY_HEAD.search(head)
        recipient = _RECIPIENT.search(head)
        if recipient:
            if recipient.group(1).startswith("functions."):
                items.append(("call", recipient.group(1)[len("functions."):], body, done))
        elif channel and channel.group(1) == "analysis":
            items.append(("reasoning", "", body, done))
        else:
            items.append(("content", "", body, done))
    return items


def _kimi_name(head: str) -> str:
    """functions.get_weather:0 → get_weather."""
    head = head.split(":", 1)[0]
    return head.split(".", 1)[1] if head.startswith("functions.") else head


def _llama3(text: str, final: bool, tools: Mapping[str, Mapping[str, Any]]) -> _Parsed | None:
    """Llama 3.1–3.3: {"name": …, "parameters": {…}} as the whole reply, or after
    <|python_tag|>; several calls are separated by `;`."""
    at = len("<|python_tag|>") if text.startswith("<|python_tag|>") else 0
    calls: list[_Call] = []
    while True:
        at = _skip(text, at)
        found = _json_call(text, at)
        if found is None:
            return None if not calls else _Parsed(calls, text[at:])
        if found is False:
            return _Parsed(calls) if not final or calls else None
        call, end = found
        calls.append(call)
        if end < 0:
            return _Parsed(calls)
        at = _skip(text, end)
        if at < len(text) and text[at] == ";":
            at += 1
        elif at >= len(text):
            return _Parsed(calls, "" if final else None)
        else:
            return _Parsed(calls, text[at:])


# ---------------------------------------------------------------------------- forced calls
def call_grammar(fmt: ChatFormat, tools: Mapping[str, Mapping[str, Any]],
                 names: Sequence[str]) -> str:
    """A grammar that makes the reply one call, in the family's own syntax, of one of `names`
    with arguments that match its schema (tool_choice "required" or a named tool)."""
    frames = []
    for name in names:
        params = (tools[name].get("parameters") or {"type": "object"})
        frames.append(_frame(fmt, name, params))
    if fmt.name in ("qwen3-coder", "glm"):
        return _xml_grammar(fmt, [(n, tools[n]) for n in names])
    return framed_json_grammar(frames)


def lazy_call_grammar(fmt: ChatFormat, tools: Mapping[str, Mapping[str, Any]],
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
    if fmt.think and thinking and not fmt.calls_end_thinking:
        close = re.escape(fmt.think[1])
        triggers = (rf"[\s\S]*?{close}[\s\S]*?({opener}[\s\S]*)", rf"\s*({opener}[\s\S]*)")
    else:
        triggers = (rf"[\s\S]*?({opener}[\s\S]*)",)
    return grammar, triggers


def _frame(fmt: ChatFormat, name: str, params: Mapping[str, Any]
           ) -> tuple[str, Mapping[str, Any], str]:
    """Text before a call's JSON, the JSON's schema, text after it."""
    def call(name_key: str = "name", args_key: str = "arguments", **extra: Any
             ) -> dict[str, Any]:
        keys = {**{k: {"const": v} for k, v in extra.items()}, name_key: {"const": name},
                args_key: params}
        return {"type": "object", "properties": keys, "required": list(keys)}

    ds = _DS
    frames = {
        "hermes": ("<tool_call>\n", call(), "\n</tool_call>"),
        "llama3": ("", call(args_key="parameters"), ""),
        "mistral": (f"[TOOL_CALLS]{name}[ARGS]", params, ""),
        "mistral-nemo": ("[TOOL_CALLS][", call(), "]"),
        "granite": ("<|tool_call|>[", call(), "]"),
        "command-r7b": ("<|START_ACTION|>[", call("tool_name", "parameters", tool_call_id="0"),
                        "]<|END_ACTION|>"),
        "kimi-k2": (f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0"
                    "<|tool_call_argument_begin|>", params,
                    "<|tool_call_end|><|tool_calls_section_end|>"),
        "gemma4": (f"<|tool_call>call:{name}", params, "<tool_call|>"),
        "harmony": (f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>",
                    params, ""),
    }
    if fmt.name == "deepseek":
        head = (f"function{ds['tool▁sep']}{name}\n```json\n" if fmt.variant == "r1"
                else f"{name}{ds['tool▁sep']}")
        tail = "\n```" if fmt.variant == "r1" else ""
        return (f"{ds['tool▁calls▁begin']}{ds['tool▁call▁begin']}{head}", params,
                f"{tail}{ds['tool▁call▁end']}{ds['tool▁calls▁end']}")
    return frames.get(fmt.name, ("", call(), ""))  # the generic shape


def _xml_grammar(fmt: ChatFormat, tools: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Qwen3-Coder's and GLM's calls: each of the tool's parameters as a tag with a value."""
    alternatives = []
    for name, tool in tools:
        keys = list(((tool.get("parameters") or {}).get("properties") or {}))[:256]
        key = " | ".join(literal(k) for k in keys) or literal("value")
        if fmt.name == "glm":
            alternatives.append(f'"<tool_call>" {literal(name)} "\\n" ("<arg_key>" ({key}) '
                                f'"</arg_key>\\n<arg_value>" text "</arg_value>\\n")* '
                                f'"</tool_call>"')
        else:
            alternatives.append(f'"<tool_call>\\n<function=" {literal(name)} ">\\n" '
                                f'("<parameter=" ({key}) ">\\n" text "\\n</parameter>\\n")* '
                                f'"</function>\\n</tool_call>"')
    return f"root ::= {' | '.join(alternatives)}\ntext ::= [^<]*\n"


# ---------------------------------------------------------------------------- a chat's start
def with_thinking(fmt: ChatFormat | None, template_args: Mapping[str, Any] | None
                  ) -> dict[str, Any] | None:
    """What a template gets besides the messages, with thinking on unless asked off where
    the family reasons, as llama.cpp renders it (DeepSeek-R1's template closes the block at
    once where `enable_thinking` is unset)."""
    args = dict(template_args or {})
    if fmt is not None and fmt.think:
        args.setdefault("enable_thinking", True)
    return args or None


def start_chat(backend: Any, params: Any, messages: Sequence[Mapping[str, Any]],
               think: bool | None = None, images: Sequence[Any] = ()
               ) -> tuple[Any, ReplyParser]:
    """A chat without tools queued (one trip to a runner), and the parser of its reply:
    `think` turns the template's thinking on or off (None: on, where the family reasons);
    `images` go where the messages' image parts are."""
    fmt = detect(backend.info.chat_template)
    args = with_thinking(fmt, None if think is None else {"enable_thinking": think})
    tokens, generation = backend.start(params, messages, None, args, images)
    return generation, parser(fmt, None, opens_reasoning(backend, fmt, tokens))


# ---------------------------------------------------------------------------- the prompt's end
_THINK_TAILS: weakref.WeakKeyDictionary[Any, list[list[int]]] = weakref.WeakKeyDictionary()


def opens_reasoning(backend: Any, fmt: ChatFormat | None, tokens: Sequence[int]) -> bool:
    """Whether a prompt (its tokens) ends inside a reasoning block its template opened
    (DeepSeek-R1 and QwQ write `<think>` themselves): then the reply starts as reasoning.
    `backend` tokenizes the block's opening mark, once per model."""
    if fmt is None or fmt.think is None or fmt is HARMONY:
        return False
    tails = _THINK_TAILS.get(backend)
    if tails is None:
        tails = [backend.tokenize(fmt.think[0] + end, add_special=False) for end in ("", "\n")]
        _THINK_TAILS[backend] = tails
    return any(tail and list(tokens[-len(tail):]) == tail for tail in tails)


# how long each effort level lets a family that marks its reasoning with tags think (gpt-oss
# reads the level in its own template instead); "none" turns thinking off in the template
EFFORT_BUDGETS = {"minimal": 0, "low": 1024, "medium": 4096, "high": None}
_THINK_MARKS: weakref.WeakKeyDictionary[Any, tuple[tuple[int, ...], ...]] = (
    weakref.WeakKeyDictionary())


def think_limit(backend: Any, fmt: ChatFormat | None, budget: int | None) -> ThinkLimit | None:
    """A reasoning budget in the family's own marks (as tokens, asked of `backend` once per
    model): the block closes after `budget` tokens with a line break and its closing mark.
    None where there is no budget, or the family marks no reasoning block with tags."""
    if budget is None or fmt is None or fmt.think is None or fmt is HARMONY:
        return None
    marks = _THINK_MARKS.get(backend)
    if marks is None:
        opening, closing = fmt.think
        marks = tuple(tuple(backend.tokenize(text, add_special=False))
                      for text in (opening, closing, "\n" + closing))
        _THINK_MARKS[backend] = marks
    return ThinkLimit(budget, *marks)


# ---------------------------------------------------------------------------- the parser
def _held(text: str, markers: Sequence[str]) -> int:
    """How many characters at the end of `text` may be the start of a marker."""
    keep = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), keep, -1):
            if text.endswith(marker[:n]):
                keep = n
                break
    return keep


def parser(fmt: ChatFormat, tools: Mapping[str, Mapping[str, Any]] | None,
           reasoning: bool = False) -> ReplyParser:
    """The parser of a reply in this format."""
    return (_HarmonyParser if fmt is HARMONY else ReplyParser)(fmt, tools, reasoning)


class ReplyParser:
    """A reply's text in, Pieces out, as the text streams.

    tools: the request's functions by name (None: no tools, so no calls are looked for);
    reasoning: whether the prompt opened a reasoning block the reply continues."""

    def __init__(self, fmt: ChatFormat, tools: Mapping[str, Mapping[str, Any]] | None,
                 reasoning: bool = False):
        self.fmt = fmt
        self.tools = tools
        self.buffer = ""
        self.state = "reasoning" if reasoning and fmt.think else "start"
        self.section = ""
        self.sent: list[int] = []  # each call's arguments sent so far (characters)
        self.base = 0  # calls of sections already closed
        self.ids: list[str] = []
        self.finished: set[int] = set()  # calls whose arguments are all sent
        self.degraded = False
        self.scans: dict[int, tuple[int, int, bool]] = {}  # the section's JSON scans so far

    reasoning_tokens = 0  # pieces fed (tokens, as the engine streams them) while reasoning

    def feed(self, text: str) -> list[Piece]:
        """The next piece of the reply (a token's text): what can be said of it now."""
        thinking = self.state == "reasoning"
        self.buffer += text
        pieces = self._advance(final=False)
        if thinking or any(p.kind == "reasoning" for p in pieces):
            self.reasoning_tokens += 1
        return pieces

    def close(self) -> list[Piece]:
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        while True:
            state = self.state
            if state == "reasoning":
                self._reasoning(out, final)
            elif state == "start":
                self._start(final)
            elif state == "content":
                self._content(out, final)
            elif state == "calls":
                self._calls(out, final)
            if self.state == state:
                return [p for p in out if p.text or p.kind in ("call", "done")]

    def _reasoning(self, out: list[Piece], final: bool) -> None:
        close = self.fmt.think[1]
        # a call ends the block too where a family calls tools without closing it (Qwen 3.5)
        openers = self.fmt.openers if self.tools is not None and self.fmt.calls_end_thinking \
            else ()
        found = [(at, m) for m in (close, *openers) if (at := self.buffer.find(m)) >= 0]
        rest: str | None = None
        if found:
            at, marker = min(found)
            body = self.buffer[:at].rstrip()
            rest = self.buffer[at + len(marker):] if marker == close else self.buffer[at:]
        elif final:
            body, rest = self.buffer.rstrip(), ""
        else:  # a marker's first characters, and trailing whitespace, wait: the block's
            # last whitespace is dropped
            body = self.buffer[:len(self.buffer) - _held(self.buffer, [close, *openers])]
            body = body.rstrip()
            self.buffer = self.buffer[len(body):]
        if not self._reasoning_sent:
            body = body.lstrip()
        if body:
            out.append(Piece("reasoning", body))
            self._reasoning_sent = True
        if rest is not None:
            self.buffer, self.state, self._thought = rest.lstrip(), "start", True

    _reasoning_sent = False
    _thought = False  # a reasoning block has closed

    def _start(self, final: bool) -> None:
        """Before any content: a reasoning block may open, or a reply-opening call."""
        stripped = self.buffer.lstrip()
        if not stripped and not final:
            return  # a reply's leading whitespace is dropped
        candidates = [*self.fmt.first_openers] if self.tools is not None else []
        if self.fmt.think and not self._thought:
            candidates.append(self.fmt.think[0])
        if not final and any(m.startswith(stripped) for m in candidates) and \
                len(stripped) < max(map(len, candidates), default=0):
            return  # it may yet be one of them
        if self.fmt.think and not self._thought and stripped.startswith(self.fmt.think[0]):
            self.buffer = stripped[len(self.fmt.think[0]):]
            self.state = "reasoning"
            return
        if self.tools is not None and not self.degraded:
            for opener in self.fmt.first_openers:
                if stripped.startswith(opener):
                    self.buffer, self.section, self.state = "", stripped, "calls"
                    self.scans.clear()
                    return
        self.buffer = stripped
        self.state = "content"

    def _content(self, out: list[Piece], final: bool) -> None:
        openers = self.fmt.openers if self.tools is not None and not self.degraded else ()
        for marker in self.fmt.dropped:
            self.buffer = self.buffer.replace(marker, "")
        found = [(self.buffer.find(o), o) for o in openers]
        found = [(at, o) for at, o in found if at >= 0]
        if found:
            at, _ = min(found)
            out.append(Piece("content", self.buffer[:at]))
            self.section, self.buffer, self.state = self.buffer[at:], "", "calls"
            self.scans.clear()
            return
        keep = 0 if final else _held(self.buffer, [*openers, *self.fmt.dropped])
        out.append(Piece("content", self.buffer[:len(self.buffer) - keep]))
        self.buffer = self.buffer[len(self.buffer) - keep:]

    def _calls(self, out: list[Piece], final: bool) -> None:
        self.section += self.buffer
        self.buffer = ""
        _scans.memo = self.scans
        try:
            parsed = self.fmt.section(self.section, final, self.tools or {})
        finally:
            _scans.memo = None
        if parsed is not None and final and not parsed.calls:
            parsed = None
        if parsed is not None and final and any(not c.done for c in parsed.calls) \
                and len(self.sent) == self.base:
            parsed = None  # ended inside a call none of which was sent: text after all
        if parsed is None:
            if len(self.sent) == self.base:  # nothing of it sent: the section was text
                self.degraded = True
                self.buffer, self.section, self.state = self.section, "", "content"
                self.scans.clear()
                return
            parsed = _Parsed([], "")
        for i, call in enumerate(parsed.calls):
            index = self.base + i
            if index >= len(self.sent):
                if not call.name:
                    break
                self.sent.append(0)
                self.ids.append(self.fmt.call_id())
                out.append(Piece("call", index=index, id=self.ids[index], name=call.name))
            fresh = call.arguments[self.sent[index]:]
            if fresh:
                out.append(Piece("arguments", fresh, index=index))
                self.sent[index] = len(call.arguments)
            if call.done and index not in self.finished:
                self.finished.add(index)
                out.append(Piece("done", index=index))
        if parsed.rest is not None:
            self.base = len(self.sent)
            self.buffer, self.section, self.state = parsed.rest, "", "content"
            self.scans.clear()
        elif final:
            self.section = ""


class _HarmonyParser(ReplyParser):
    """gpt-oss: the reply is read again as a whole at each piece (its messages are short
    headers and bodies), and what grew since is given out."""

    def _advance(self, final: bool) -> list[Piece]:
        out: list[Piece] = []
        items = _harmony(self.buffer, final)
        for k, (kind, name, text, done) in enumerate(items):
            if k >= len(self.sent):
                self.sent.append(0)
                self.ids.append("")
                if kind == "call":
                    if self.tools is None:
                        continue
                    self.ids[k] = self.fmt.call_id()
                    out.append(Piece("call", index=self._index(k), id=self.ids[k], name=name))
            if kind == "call" and not self.ids[k]:
                continue
            if kind != "call" and not self.sent[k]:
                text = text.lstrip()
                self.sent[k] = len(items[k][2]) - len(text)  # leading whitespace skipped
                text = items[k][2]
            fresh = text[self.sent[k]:]
            if kind != "call" and not done:
                fresh = fresh[:len(fresh) - (len(fresh) - len(fresh.rstrip()))]
            if kind != "call" and done:
                fresh = fresh.rstrip()
            if fresh:
                out.append(Piece("arguments" if kind == "call" else kind, fresh,
                                 index=self._index(k)))
                self.sent[k] += len(fresh)
            if kind == "call" and done and k not in self.finished:
                self.finished.add(k)
                out.append(Piece("done", index=self._index(k)))
        return out

    def _index(self, k: int) -> int:
        """A call's index among the calls (messages of other kinds come between)."""
        return sum(1 for i in self.ids[:k] if i)
