"""Function calling for any model: tools described in the system prompt, calls parsed back.

A model is told the tools and the one reply shape that calls them:
`{"name": "<tool>", "arguments": {...}}`. With tool_choice "required" or a named tool the
grammar sampler forces that shape (arguments matching the tool's JSON schema), so even a
small model returns a well-formed call. With "auto" the reply is parsed afterwards: a call
if it is one, text otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localinfer.api.errors import ApiError
from localinfer.backends.base import SamplingParams
from localinfer.backends.grammar import json_schema_grammar

__all__ = ["ToolCall", "ToolSpec"]

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
_TAGS = re.compile(r"</?tool_call>")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolSpec:
    functions: tuple[Mapping[str, Any], ...]  # {"name", "description", "parameters"}
    choice: str = "auto"  # "auto", "required", or the name of one function

    @classmethod
    def from_request(cls, tools: Sequence[Mapping[str, Any]] | None,
                     choice: str | Mapping[str, Any] | None) -> ToolSpec | None:
        if not tools or choice == "none":
            return None
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

    def prepare(self, messages: Sequence[Mapping[str, Any]], params: SamplingParams
                ) -> tuple[list[dict[str, Any]], SamplingParams]:
        """The messages with the tools explained, and params forcing a call when required."""
        messages = [_as_text(m) for m in messages]
        instructions = self._instructions()
        if messages and messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": messages[0]["content"] + "\n\n" + instructions}
        else:
            messages.insert(0, {"role": "system", "content": instructions})
        if self.choice != "auto":
            params = dataclasses.replace(params, grammar=json_schema_grammar(self._call_schema()))
        return messages, params

    def _instructions(self) -> str:
        listing = "\n".join(json.dumps(f, ensure_ascii=False) for f in self.functions)
        must = ("You must call one of them." if self.choice == "required" else
                f"You must call {self.choice}." if self.choice != "auto" else
                "Call one only when it helps; otherwise answer normally.")
        return (f"You can call these tools:\n{listing}\n{must} To call a tool, reply with only "
                f'a JSON object: {{"name": <tool name>, "arguments": {{...}}}}')

    def _call_schema(self) -> dict[str, Any]:
        names = self.names if self.choice == "required" else [self.choice]
        options = []
        for f in self.functions:
            if f["name"] in names:
                options.append({
                    "type": "object",
                    "properties": {"name": {"const": f["name"]},
                                   "arguments": f.get("parameters") or {"type": "object"}},
                    "required": ["name", "arguments"],
                })
        return options[0] if len(options) == 1 else {"anyOf": options}

    def parse(self, text: str) -> list[ToolCall]:
        """The tool calls in a reply, or [] when it is plain text."""
        cleaned = _TAGS.sub("", _FENCE.sub("", text.strip())).strip()
        try:
            data = json.loads(cleaned)
        except ValueError:
            return []
        if isinstance(data, Mapping) and "tool_calls" in data:
            data = data["tool_calls"]
        items = data if isinstance(data, list) else [data]
        calls = []
        for item in items:
            if not isinstance(item, Mapping):
                return []
            item = item.get("function", item)
            name, arguments = item.get("name"), item.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    return []
            if name not in self.names or not isinstance(arguments, Mapping):
                return []
            calls.append(ToolCall(f"call_{uuid.uuid4().hex[:24]}", name, dict(arguments)))
        return calls


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
