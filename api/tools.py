"""Function calling: the request's tools offered to the model in its family's own way.

A template that renders `tools` itself gets them as its authors meant (OpenAI's shape), and
earlier calls in the conversation as objects; the reply is then read in the family's call
syntax (app/chat_formats/families/). A template that knows no tools gets them in the system
prompt with one generic reply shape: `{"name": "<tool>", "arguments": {...}}`. With
tool_choice "required" or a named tool a grammar forces a call in the family's syntax (the
generic shape where it has none), its arguments matching the tool's JSON schema, so even a
small model returns a well-formed call.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localinfer.api.errors import ApiError
from localinfer.backends.base import SamplingParams
from localinfer.chat_formats.calls import call_grammar, lazy_call_grammar
from localinfer.chat_formats.detect import ChatFormat
from localinfer.errors import InvalidRequest

__all__ = ["ToolSpec"]

MAX_TOOLS = 256

@dataclass(frozen=True)
class ToolSpec:
    functions: tuple[Mapping[str, Any], ...]  # {"name", "description", "parameters"}
    choice: str = "auto"  # "auto", "required", or the name of one function

    @classmethod
    def from_request(cls, tools: Sequence[Mapping[str, Any]] | None,
                     choice: str | Mapping[str, Any] | None) -> ToolSpec | None:
        if not tools or choice == "none":
            return None
        if len(tools) > MAX_TOOLS:
            raise ApiError(400, f"{len(tools)} tools is more than the {MAX_TOOLS} allowed")
        functions = tuple(t.get("function", t) for t in tools)
        names = [f.get("name") for f in functions]
        if not all(isinstance(n, str) and n for n in names):
            raise ApiError(400, "every tool needs a function name")
        if isinstance(choice, Mapping):
            choice = (choice.get("function") or {}).get("name")
            if choice not in names:
                raise ApiError(400, f"tool_choice names '{choice}', which is not among the tools")
        elif choice not in (None, "auto", "required"):
            raise ApiError(400, "tool_choice must be none, auto, required or a named function")
        return cls(functions, choice or "auto")

    @property
    def names(self) -> list[str]:
        return [f["name"] for f in self.functions]

    @property
    def by_name(self) -> dict[str, Mapping[str, Any]]:
        return {f["name"]: f for f in self.functions}

    def prepare(self, messages: Sequence[Mapping[str, Any]], params: SamplingParams,
                fmt: ChatFormat, thinking: bool = False
                ) -> tuple[list[dict[str, Any]], SamplingParams, dict[str, Any]]:
        """The messages, params forcing a call when one is required (or, with "auto",
        holding a call the model opens to its tool's schema), and what the template gets
        besides (`tools`, where it renders them)."""
        forced = self.choice != "auto"
        if fmt.template_tools:
            if forced:
                names = self.names if self.choice == "required" else [self.choice]
                params = dataclasses.replace(params, grammar=call_grammar(fmt, self.by_name,
                                                                          names))
            elif params.grammar is None:  # (a client's own grammar or format wins)
                lazy = _lazy(fmt, json.dumps(self.functions, sort_keys=True), thinking)
                if lazy is not None:
                    params = dataclasses.replace(params, grammar=lazy[0],
                                                 grammar_triggers=lazy[1])
            return ([with_call_objects(m) for m in messages], params,
                    {"tools": [{"type": "function", "function": dict(f)}
                               for f in self.functions]})
        messages = [_as_text(m) for m in messages]
        instructions = self._instructions()
        if messages and messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": messages[0]["content"] + "\n\n" + instructions}
        else:
            messages.insert(0, {"role": "system", "content": instructions})
        if forced:
            names = self.names if self.choice == "required" else [self.choice]
            params = dataclasses.replace(params, grammar=call_grammar(fmt, self.by_name, names))
        return messages, params, {}

    def _instructions(self) -> str:
        listing = "\n".join(json.dumps(f, ensure_ascii=False) for f in self.functions)
        must = ("You must call one of them." if self.choice == "required" else
                f"You must call {self.choice}." if self.choice != "auto" else
                "Call one only when it helps; otherwise answer normally.")
        return (f"You can call these tools:\n{listing}\n{must} To call a tool, reply with only "
                f'a JSON object: {{"name": <tool name>, "arguments": {{...}}}}')


@functools.lru_cache(maxsize=64)
def _lazy(fmt: ChatFormat, functions: str, thinking: bool) -> tuple[str, tuple[str, ...]] | None:
    """The lazy grammar of an `auto` request's tools, built once for the same tools (an
    agent sends them on every request). Tools too costly to hold to their schemas are left
    free rather than refused: with `auto`, a grammar is a help, not the request."""
    tools = {f["name"]: f for f in json.loads(functions)}
    try:
        return lazy_call_grammar(fmt, tools, thinking)
    except InvalidRequest:
        return None


def with_call_objects(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as templates read it: a call's arguments an object (OpenAI sends a JSON
    string; templates write `arguments | tojson`), text content never None."""
    message = dict(message)
    calls = message.get("tool_calls")
    if calls:
        fixed = []
        for call in calls:
            call = dict(call)
            function = dict(call.get("function") or {})
            if isinstance(function.get("arguments"), str):
                try:
                    function["arguments"] = json.loads(function["arguments"])
                except ValueError:
                    pass
            call["function"] = function
            call.setdefault("type", "function")
            fixed.append(call)
        message["tool_calls"] = fixed
    if message.get("content") is None:
        message["content"] = ""
    return message


def _as_text(message: Mapping[str, Any]) -> dict[str, Any]:
    """Earlier tool calls and results, written as text any chat template can render."""
    message = dict(message)
    calls = message.pop("tool_calls", None)
    if calls:
        rendered = []
        for call in calls:
            function = call.get("function", call)
            arguments = function.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    pass
            rendered.append({"name": function.get("name"), "arguments": arguments})
        text = json.dumps(rendered[0] if len(rendered) == 1 else rendered, ensure_ascii=False)
        message["content"] = (message.get("content") or "") + text
    message["content"] = message.get("content") or ""
    return message
