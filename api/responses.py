"""OpenAI's Responses API (`POST /v1/responses`), a thin converter onto the one generate path.

What it takes: `input` (a string, or items: messages with text parts, `function_call` and
`function_call_output`, `reasoning`), `instructions`, function `tools` with `tool_choice`,
`text.format` (json_object, json_schema), `reasoning.effort`, `max_output_tokens`,
`temperature`, `top_p`, `stream`, and `previous_response_id`: a response the server stored
(`store`, on by default) continues, its input and output before the new input — within the
server's lifetime, the last `MAX_STORED` responses and at most `MAX_STORED_BYTES` of them.
Output items are the reply's reasoning, its message and its function calls, in the order
the model wrote them, each streamed as the API's events; a reply cut at its limit ends with
`response.incomplete`.

Tools as Codex sends them: `function` tools; `namespace` groups of function tools (its
multi-agent and MCP tools), offered to the model as one function each named
`<namespace>__<name>` (or `<namespace><name>` where the namespace ends in `_`, as MCP's
`mcp__server__` do) and returned as a `function_call` with its `namespace` and `name`
apart; `custom` (free-form) tools, offered as a function of one string `input` and returned
as a `custom_tool_call`. Tools that OpenAI's servers run (web search, file search, code
interpreter, …) cannot run here and are left out, as a provider without them would.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal, NoReturn, Optional, Union

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from localinfer.api import core, images
from localinfer.api.errors import ApiError
from localinfer.api.metrics import observe
from localinfer.api.tools import ToolSpec
from localinfer.backends.base import DoneEvent, ErrorEvent, RequestStats
from localinfer.chat_formats.prompt import EFFORT_BUDGETS
from localinfer.chat_formats.reply import Piece
from localinfer.chat_formats.grammar import ANY_JSON, json_schema_grammar

__all__ = ["router"]

log = logging.getLogger("localinfer.api")

router = APIRouter(prefix="/v1", tags=["responses"])

MAX_STORED = 1000
MAX_STORED_BYTES = 64 << 20


class ResponsesRequest(core.OpenAISampling):
    """The Responses API's fields, and the sampling fields of a chat completion, which
    llama-server takes here too (logit_bias, top_k, seed, stop, grammar, …)."""

    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    text: Optional[dict[str, Any]] = None
    reasoning: Optional[dict[str, Any]] = None
    max_output_tokens: Optional[int] = Field(None, ge=1)
    stream: bool = False
    store: bool = True
    previous_response_id: Optional[str] = Field(None, max_length=200)
    parallel_tool_calls: bool = True
    metadata: Optional[dict[str, Any]] = None

    def effort(self) -> str | None:
        effort = (self.reasoning or {}).get("effort")
        if effort not in (None, "none", "minimal", "low", "medium", "high"):
            raise ApiError(400, "reasoning.effort must be none, minimal, low, medium or high")
        return effort


# ---------------------------------------------------------------------------- stored responses
class _Store:
    """Responses kept for previous_response_id, and to be read back or deleted by their id
    (GET and DELETE /v1/responses/{id}, its input_items): each one's conversation as
    messages, the response object, and the items of its input."""

    def __init__(self) -> None:
        self._items: collections.OrderedDict[str, tuple[_Kept, int]] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response_id: str, kept: _Kept) -> None:
        size = len(json.dumps(dataclasses.astuple(kept), ensure_ascii=False))
        with self._lock:
            self._items[response_id] = (kept, size)
            self._bytes += size
            while self._items and (len(self._items) > MAX_STORED
                                   or self._bytes > MAX_STORED_BYTES):
                _, (_, gone) = self._items.popitem(last=False)
                self._bytes -= gone

    def kept(self, response_id: str) -> _Kept:
        with self._lock:
            found = self._items.get(response_id) or _missing(response_id)
            self._items.move_to_end(response_id)
            return found[0]

    def get(self, response_id: str) -> list[dict[str, Any]]:
        """The conversation of a stored response, to continue."""
        return [dict(m) for m in self.kept(response_id).messages]

    def delete(self, response_id: str) -> None:
        with self._lock:
            self._bytes -= (self._items.pop(response_id, None) or _missing(response_id))[1]


def _missing(response_id: str) -> NoReturn:
    raise ApiError(404, f"no stored response '{response_id[:80]}' — responses are kept while "
                        f"this server runs (the last {MAX_STORED}), and only those created "
                        f"with store on")


@dataclasses.dataclass(frozen=True)
class _Kept:
    messages: list[dict[str, Any]]  # the conversation, the reply last
    response: dict[str, Any]
    inputs: list[dict[str, Any]]  # its input's items, each with an id


def _store(request: Request) -> _Store:
    state = request.app.state
    if not hasattr(state, "responses"):
        state.responses = _Store()
    return state.responses


# ---------------------------------------------------------------------------- input
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def _text_of(content: Any, where: str, pictures: bool = False) -> str | list[dict[str, Any]]:
    """A content's text; with `pictures` (a user's message), its parts where it has
    input_image parts: each as {"type": "image", "url": its data URL}, kept so in the
    stored conversation and read by `_files` as each request starts."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ApiError(400, f"{where}: content must be text or a list of text parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and pictures:
            url = part.get("image_url")
            if not isinstance(url, str):
                raise ApiError(400, f"{where}: an input_image needs image_url, a data URL "
                                    f"(file_id is not taken: this server keeps no files)")
            images.from_url(url)  # (a bad one refused now, not when a later turn reads it)
            parts.append({"type": "image", "url": url})
        elif kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": str(part.get("text") or "")})
        else:
            raise ApiError(400, f"{where}: only text parts{' and input_image' if pictures else ''}"
                                f" are supported here, not {kind!r}")
    if any(p["type"] == "image" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _files(messages: list[dict[str, Any]]
           ) -> tuple[list[dict[str, Any]], list[bytes | images.Remote]]:
    """The messages as a backend takes them (an image part without its URL), and their
    images' files in order."""
    files: list[bytes | images.Remote] = []
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            files += [images.from_url(p["url"]) for p in content if p["type"] == "image"]
            message = {**message, "content": [{"type": "image"} if p["type"] == "image" else p
                                              for p in content]}
        out.append(message)
    return out, files


def _messages(items: Union[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Input items as chat messages: calls join the assistant turn they belong to, their
    outputs are tool messages, reasoning goes with the assistant turn after it."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    reasoning = ""
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ApiError(400, f"{where}: role must be user, system, developer or "
                                    f"assistant")
            message: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                       "content": _text_of(item.get("content"), where,
                                                           role == "user")}
            if role == "assistant" and reasoning:
                message["reasoning_content"], reasoning = reasoning, ""
            out.append(message)
        elif kind in ("function_call", "custom_tool_call"):
            name = str(item.get("name") or "")
            if item.get("namespace"):
                name = _flat(str(item["namespace"]), name)
            arguments = (str(item.get("arguments") or "{}") if kind == "function_call" else
                         json.dumps({"input": str(item.get("input") or "")}, ensure_ascii=False))
            call = {"id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
                    "function": {"name": name, "arguments": arguments}}
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "content": ""})
                if reasoning:
                    out[-1]["reasoning_content"], reasoning = reasoning, ""
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                        "content": output if isinstance(output, str)
                        else _text_of(output, where)})
        elif kind == "reasoning":
            reasoning += _text_of(item.get("content") or item.get("summary"), where)
        else:
            raise ApiError(400, f"{where}: items of type {kind!r} are not supported — send "
                                f"messages, function_call and function_call_output items")
    return out


@dataclasses.dataclass(frozen=True)
class _Origin:
    """What a function offered to the model is to the client: a namespace's member, or a
    custom (free-form) tool."""

    name: str
    namespace: str | None = None
    custom: bool = False


def _flat(namespace: str, name: str) -> str:
    """A namespace member's name as the model sees it: `ns__name`, or `ns` + `name` where the
    namespace ends in `_` (MCP's `mcp__server__`)."""
    return f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"


_CUSTOM_INPUT = {"type": "object", "required": ["input"], "additionalProperties": False,
                 "properties": {"input": {"type": "string"}}}


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in tool.items() if k in ("name", "description", "parameters")}


def _tools(body: ResponsesRequest) -> tuple[ToolSpec | None, dict[str, _Origin]]:
    """The tools as functions the model is offered, and the client's view of those that are
    not plain functions (by the name the model calls)."""
    functions: list[dict[str, Any]] = []
    origin: dict[str, _Origin] = {}
    for i, tool in enumerate(body.tools or ()):
        kind = tool.get("type")
        if kind == "function":
            functions.append(_function(tool))
        elif kind == "namespace":
            namespace = str(tool.get("name") or "")
            members = tool.get("tools")
            if not namespace or not isinstance(members, list):
                raise ApiError(400, f"tools[{i}]: a namespace needs a name and a list of tools")
            for member in members:
                if not isinstance(member, dict) or member.get("type", "function") != "function":
                    raise ApiError(400, f"tools[{i}]: a namespace holds function tools only")
                flat = _flat(namespace, str(member.get("name") or ""))
                functions.append({**_function(member), "name": flat})
                origin[flat] = _Origin(str(member.get("name")), namespace)
        elif kind == "custom":
            name = str(tool.get("name") or "")
            functions.append({"name": name, "description": str(tool.get("description") or ""),
                              "parameters": _CUSTOM_INPUT})
            origin[name] = _Origin(name, custom=True)
        else:  # web_search, file_search, code_interpreter, …: OpenAI's servers run them
            log.info("tools[%d] (%.60s) runs on OpenAI's servers, not here: left out", i, kind)
    choice = body.tool_choice
    if isinstance(choice, dict):
        name = str(choice.get("name") or "")
        choice = {"function": {"name": _flat(str(choice["namespace"]), name)
                               if choice.get("namespace") else name}}
    return ToolSpec.from_request(functions, choice), origin


def _grammar(body: ResponsesRequest) -> str | None:
    fmt = (body.text or {}).get("format") or {}
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_JSON
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise ApiError(400, "text.format json_schema needs a schema object")
        return json_schema_grammar(fmt["schema"])
    raise ApiError(400, f"text.format.type must be text, json_object or json_schema, not "
                        f"{kind!r}")


# ---------------------------------------------------------------------------- output
class _Output:
    """The response's output items as the reply's pieces arrive, and the events that say so."""

    def __init__(self, response: dict[str, Any], origin: dict[str, _Origin] | None = None):
        self.response = response
        self.items: list[dict[str, Any]] = response["output"]
        self.open: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}
        self.origin = origin or {}
        self.custom: dict[str, str] = {}  # a custom call's arguments so far, by item id
        self.sequence = 0

    def event(self, kind: str, **data: Any) -> dict[str, Any]:
        """One event, holding a copy of what it shows: an item sent as added is not
        changed by the deltas after it (a client appends them to it)."""
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1,  # (a delta's text is
                **{k: copy.deepcopy(v) if isinstance(v, (dict, list)) else v  # no copy)
                   for k, v in data.items()}}

    def _start(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self.items.append(item)
        self.open = item
        events.append(self.event("response.output_item.added", output_index=len(self.items) - 1,
                                 item=item))
        if item["type"] == "message":
            item["content"].append({"type": "output_text", "text": "", "annotations": []})
            events.append(self.event("response.content_part.added", item_id=item["id"],
                                     output_index=len(self.items) - 1, content_index=0,
                                     part={"type": "output_text", "text": "",
                                           "annotations": []}))
        elif item["type"] == "reasoning":
            item["content"].append({"type": "reasoning_text", "text": ""})
        return events

    def _close(self, status: str = "completed") -> list[dict[str, Any]]:
        """The open item done; `incomplete` where the reply was cut in it (at its limit: a
        call's arguments may then not be whole)."""
        item, self.open = self.open, None
        if item is None:
            return []
        index = self.items.index(item)
        events = []
        if item["type"] == "message":
            part = item["content"][0]
            events += [self.event("response.output_text.done", item_id=item["id"],
                                  output_index=index, content_index=0, text=part["text"],
                                  logprobs=[]),
                       self.event("response.content_part.done", item_id=item["id"],
                                  output_index=index, content_index=0, part=part)]
        elif item["type"] == "reasoning":
            events.append(self.event("response.reasoning_text.done", item_id=item["id"],
                                     output_index=index, content_index=0,
                                     text=item["content"][0]["text"]))
        elif item["type"] == "custom_tool_call":
            item["input"] = _custom_input(self.custom.pop(item["id"], ""))
            events.append(self.event("response.custom_tool_call_input.done",
                                     item_id=item["id"], output_index=index,
                                     input=item["input"]))
        else:
            events.append(self.event("response.function_call_arguments.done",
                                     item_id=item["id"], output_index=index,
                                     arguments=item["arguments"]))
        item["status"] = status
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events

    def add(self, piece: Piece) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if piece.kind == "reasoning":
            if self.open is None or self.open["type"] != "reasoning":
                events += self._start({"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}",
                                       "summary": [], "content": [],
                                       "status": "in_progress"})
            self.open["content"][0]["text"] += piece.text
            events.append(self.event("response.reasoning_text.delta", item_id=self.open["id"],
                                     output_index=len(self.items) - 1, content_index=0,
                                     delta=piece.text))
        elif piece.kind == "content":
            if self.open is None or self.open["type"] != "message":
                events += self._start({"type": "message", "id": f"msg_{uuid.uuid4().hex}",
                                       "role": "assistant", "status": "in_progress",
                                       "content": []})
            self.open["content"][0]["text"] += piece.text
            events.append(self.event("response.output_text.delta", item_id=self.open["id"],
                                     output_index=len(self.items) - 1, content_index=0,
                                     delta=piece.text, logprobs=[]))
        elif piece.kind == "call":
            origin = self.origin.get(piece.name) or _Origin(piece.name)
            item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}",
                    "call_id": piece.id, "name": origin.name, "arguments": "",
                    "status": "in_progress"}
            if origin.namespace is not None:
                item["namespace"] = origin.namespace
            if origin.custom:  # (its input is the arguments' one string, given at its end)
                item = {"type": "custom_tool_call", "id": f"ctc_{uuid.uuid4().hex}",
                        "call_id": piece.id, "name": origin.name, "input": "",
                        "status": "in_progress"}
                self.custom[item["id"]] = ""
            self.calls[piece.index] = item
            events += self._start(item)
        elif piece.kind == "arguments":
            item = self.calls[piece.index]
            if item["type"] == "custom_tool_call":
                self.custom[item["id"]] += piece.text
            else:
                item["arguments"] += piece.text
                events.append(self.event("response.function_call_arguments.delta",
                                         item_id=item["id"], output_index=self.items.index(item),
                                         delta=piece.text))
        return events

    def finish(self, stats: RequestStats, job: core.Job, reasoning: int) -> list[dict[str, Any]]:
        incomplete = stats.finish_reason == "length"
        events = self._close("incomplete" if incomplete else "completed")
        self.response.update({
            "status": "incomplete" if incomplete else "completed",
            "completed_at": int(time.time()),
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "usage": {"input_tokens": job.prompt_tokens,
                      "input_tokens_details": {"cached_tokens": stats.cached_tokens},
                      "output_tokens": stats.generated_tokens,
                      "output_tokens_details": {"reasoning_tokens": reasoning},
                      "total_tokens": job.prompt_tokens + stats.generated_tokens},
            "timings": dataclasses.replace(stats.figures(),
                                           reasoning_tokens=reasoning).to_timings(),
        })
        return events

    def message(self) -> dict[str, Any]:
        """The reply as an assistant message, for a response that continues this one."""
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        for item in self.items:
            if item["type"] == "message":
                message["content"] += item["content"][0]["text"]
            elif item["type"] == "reasoning":
                message["reasoning_content"] = (message.get("reasoning_content", "")
                                                + item["content"][0]["text"])
            else:  # (as the model wrote it: the name it was offered, the arguments' JSON)
                name = (_flat(item["namespace"], item["name"]) if item.get("namespace")
                        else item["name"])
                arguments = (item["arguments"] if item["type"] == "function_call" else
                             json.dumps({"input": item["input"]}, ensure_ascii=False))
                message.setdefault("tool_calls", []).append({
                    "id": item["call_id"], "type": "function",
                    "function": {"name": name, "arguments": arguments}})
        return message


def _custom_input(arguments: str) -> str:
    """A custom tool's input from the arguments the model wrote for its one parameter."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return str(value.get("input", "")) if isinstance(value, dict) else str(value)


def _response(body: ResponsesRequest, model: str, response_id: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "model": model, "output": [], "error": None,
            "incomplete_details": None, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "metadata": body.metadata or {},
            "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id,
            "reasoning": body.reasoning or {"effort": None, "summary": None},
            "store": body.store, "temperature": body.temperature,
            "text": body.text or {"format": {"type": "text"}},
            "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
            "top_p": body.top_p, "usage": None}


@router.post("/responses")
async def responses(body: ResponsesRequest, request: Request):
    store = _store(request)
    history = store.get(body.previous_response_id) if body.previous_response_id else []
    conversation = history + _messages(body.input)
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    tools, origin = _tools(body)
    params = body.params(body.max_output_tokens, _grammar(body) or body.grammar)
    effort = body.effort()
    turns, files = _files(system + conversation)
    job = await core.start(request.app.state.pool, body.model or None, params,
                           messages=turns, tools=tools, images=files,
                           template_args={"reasoning_effort": effort} if effort else None,
                           think_budget=EFFORT_BUDGETS.get(effort or ""))
    response_id = f"resp_{uuid.uuid4().hex}"
    output = _Output(_response(body, job.model.name, response_id), origin)

    def keep() -> None:
        if body.store:
            store.put(response_id, _Kept(conversation + [output.message()],
                                         copy.deepcopy(output.response), _input_items(body)))

    if body.stream:
        return StreamingResponse(_stream(job, output, keep), media_type="text/event-stream")
    reply, stats, reasoning = await job.read()
    observe(job, stats)
    for piece in reply.pieces:
        output.add(piece)
    output.finish(stats, job, reasoning)
    keep()
    return output.response


@router.get("/responses/{response_id}")
async def retrieve(response_id: str, request: Request) -> dict[str, Any]:
    """A stored response, as it was answered."""
    return _store(request).kept(response_id).response


@router.delete("/responses/{response_id}")
async def delete(response_id: str, request: Request) -> dict[str, Any]:
    _store(request).delete(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.get("/responses/{response_id}/input_items")
async def input_items(response_id: str, request: Request, after: str | None = None,
                      limit: int = Query(20, ge=1, le=100),
                      order: Literal["asc", "desc"] = "desc") -> dict[str, Any]:
    """A stored response's input items, a page at a time (OpenAI's list: newest first
    unless `order` is asc, `after` an item's id)."""
    items = _store(request).kept(response_id).inputs
    items = items if order == "asc" else items[::-1]
    if after is not None:
        at = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if at is None:
            raise ApiError(404, f"no input item '{after[:80]}' in response '{response_id[:80]}'")
        items = items[at + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


def _input_items(body: ResponsesRequest) -> list[dict[str, Any]]:
    """A request's input as the items a stored response lists: a string is a user message;
    each item gets an id where it came without one."""
    if isinstance(body.input, str):
        items = [{"type": "message", "role": "user",
                  "content": [{"type": "input_text", "text": body.input}]}]
    else:
        items = body.input
    return [{"id": item.get("id") or f"msg_{uuid.uuid4().hex}", **item} for item in items]


@router.post("/responses/input_tokens")
async def input_tokens(body: ResponsesRequest, request: Request) -> dict[str, Any]:
    """The tokens a response's input takes, rendered as /v1/responses renders it (with the
    stored conversation of previous_response_id)."""
    history = _store(request).get(body.previous_response_id) if body.previous_response_id else []
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    turns, files = _files(system + history + _messages(body.input))
    effort = body.effort()
    n = await core.count(request.app.state.pool, body.model or None, turns, _tools(body)[0],
                         {"reasoning_effort": effort} if effort else None, files)
    return {"object": "response.input_tokens", "input_tokens": n}


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


async def _stream(job: core.Job, output: _Output, keep) -> AsyncIterator[str]:
    """The Responses API's events: created, in_progress, each item's added / deltas / done,
    then completed (incomplete for a reply cut at its limit; failed, with the error)."""
    yield _sse(output.event("response.created", response=output.response))
    yield _sse(output.event("response.in_progress", response=output.response))
    reader = job.parser()
    async for event in job.events():
        if isinstance(event, ErrorEvent):
            output.response.update(status="failed", error={"code": "server_error",
                                                           "message": str(event.error)})
            yield _sse(output.event("response.failed", response=output.response))
            return
        if isinstance(event, DoneEvent):
            for piece in reader.close():
                for item in output.add(piece):
                    yield _sse(item)
            observe(job, event.stats)  # (after the parser's last pieces: TTFT)
            for item in output.finish(event.stats, job, reader.reasoning_tokens):
                yield _sse(item)
            keep()
            yield _sse(output.event(f"response.{output.response['status']}",
                                    response=output.response))
            return
        for piece in reader.feed(event.text):
            for item in output.add(piece):
                yield _sse(item)
