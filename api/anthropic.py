"""The Anthropic Messages API (`POST /v1/messages`), as a thin converter onto the one generate
path (`core.start`), streamed as Anthropic's events.

What it takes: `system` (a string or text blocks), `messages` whose content is a string or
blocks — text, images, `tool_use`, `tool_result`, `thinking` — `tools` (name, description,
input_schema) with `tool_choice` (auto, any, tool, none), `thinking` (enabled or disabled:
the template's thinking on or off; adaptive: the template's default), `max_tokens`
(required, as Anthropic requires it), `temperature`, `top_p`, `top_k`, `stop_sequences`,
`stream`. A reply is `thinking`, `text` and `tool_use` blocks in the order the model wrote
them (stop_reason `tool_use` when it called). Errors have Anthropic's shape and wording
(`errors.error_response`), which its clients recover by.

What real clients send beyond the documented API: Claude Code puts `system` messages inside
`messages` (after the first user turn) for models not its own; their text joins the system
prompt, in order, so every chat template can render it. Tools that Anthropic's servers run
(web search, code execution: a `type` and no `input_schema`) cannot run here and are left
out, as a model behind a gateway without them would see it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from localinfer.api import core, images
from localinfer.api.errors import ApiError
from localinfer.api.metrics import observe
from localinfer.api.tools import ToolSpec
from localinfer.backends.base import DoneEvent, ErrorEvent, RequestStats, SamplingParams
from localinfer.chat_formats.reply import Piece, arguments_object

__all__ = ["router"]

log = logging.getLogger("localinfer.api")

router = APIRouter(prefix="/v1", tags=["anthropic"])


class Block(core.Lenient):
    type: str
    text: Optional[str] = None


class Message(core.Lenient):
    role: str = Field(max_length=64)  # user, assistant; system as Claude Code sends it
    content: Union[str, list[Block]]


class MessagesRequest(core.Lenient):
    model: str = Field(min_length=1, max_length=200)
    messages: list[Message] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: Union[str, list[Block], None] = None
    temperature: float = core.sampling_field("temperature", 1.0)
    top_p: float = core.sampling_field("top_p", 1.0)
    top_k: int = core.sampling_field("top_k", 0)
    stop_sequences: Optional[list[str]] = Field(None, max_length=64)
    stream: bool = False
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None
    # llama-server's: a GBNF grammar the reply must follow (bounded as any grammar is)
    grammar: Optional[str] = Field(None, max_length=512 * 1024)

    def params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              min_p=0.0, max_tokens=self.max_tokens,
                              stop=tuple(self.stop_sequences or ()), grammar=self.grammar)

    def tool_spec(self) -> ToolSpec | None:
        functions = []
        for i, tool in enumerate(self.tools or ()):
            if tool.get("type") not in (None, "custom") and "input_schema" not in tool:
                log.info("tools[%d] (%.60s) runs on Anthropic's servers, not here: left out",
                         i, tool.get("type"))
                continue
            functions.append({"name": tool.get("name"), "description": tool.get("description", ""),
                              "parameters": tool.get("input_schema") or {"type": "object"}})
        kind = (self.tool_choice or {}).get("type", "auto")
        choice: Any = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
        if kind == "tool":
            choice = {"function": {"name": (self.tool_choice or {}).get("name")}}
        elif choice is None:
            raise ApiError(400, "tool_choice.type must be auto, any, tool or none")
        return ToolSpec.from_request(functions, choice)

    def template_args(self) -> dict[str, Any] | None:
        kind = (self.thinking or {}).get("type")
        return {"enable_thinking": kind == "enabled"} if kind in ("enabled", "disabled") \
            else None

    def think_budget(self) -> int | None:
        """thinking.budget_tokens: the reasoning block ends there (Anthropic's least is
        1,024; any number of 0 or more is taken)."""
        thinking = self.thinking or {}
        budget = thinking.get("budget_tokens")
        if thinking.get("type") != "enabled" or budget is None:
            return None
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise ApiError(400, "thinking.budget_tokens must be a whole number of 0 or more")
        return budget


def _text(content: Union[str, list[Block], None], where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for block in content:
        if block.type != "text":
            raise ApiError(400, f"{where}: only text blocks are supported here, not "
                                f"{block.type!r}")
    return "".join(block.text or "" for block in content)


def _image(extra: dict[str, Any], where: str) -> bytes | images.Remote:
    """An image block's file: its `source` in base64, or a URL (see api/images.py)."""
    source = extra.get("source")
    if not isinstance(source, dict):
        raise ApiError(400, f"{where}: an image block needs a source")
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        return images.from_base64(source["data"])
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return images.from_url(source["url"])  # (fetched only where image_urls allows it)
    raise ApiError(400, f"{where}: an image's source must be base64 (type, media_type, data) "
                        f"or a url")


def _system(body: MessagesRequest) -> list[dict[str, Any]]:
    """The system prompt as one message: `system`, then the text of each system message in
    `messages`, in order (Claude Code's mid-conversation system messages)."""
    texts = [_text(body.system, "system")] if body.system else []
    for i, message in enumerate(body.messages):
        if message.role == "system":
            texts.append(_text(message.content, f"messages[{i}]"))
        elif message.role not in ("user", "assistant"):
            raise ApiError(400, f"messages[{i}]: Unexpected role \"{message.role[:40]}\". The "
                                f"input message role must be user or assistant; the system "
                                f"prompt is the top-level `system` parameter")
    texts = [t for t in texts if t]
    return [{"role": "system", "content": "\n\n".join(texts)}] if texts else []


def _messages(body: MessagesRequest) -> tuple[list[dict[str, Any]], list]:
    """Anthropic's turns as chat messages, and their images' files in order: tool_use
    blocks are the assistant's calls, tool_result blocks tool messages, thinking blocks the
    assistant's reasoning, image blocks a user turn's pictures where they stand; system
    messages join the system prompt (`_system`)."""
    out = _system(body)
    files: list[bytes | images.Remote] = []
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        if message.role == "system":
            continue
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        turn: dict[str, Any] = {"role": message.role, "content": ""}
        parts: list[dict[str, Any]] = []
        results = []
        for block in message.content:
            extra = block.model_extra or {}
            if block.type == "text":
                turn["content"] += block.text or ""
                parts.append({"type": "text", "text": block.text or ""})
            elif block.type == "image" and message.role == "user":
                files.append(_image(extra, f"{where}.image"))
                parts.append({"type": "image"})
            elif block.type == "tool_use" and message.role == "assistant":
                turn.setdefault("tool_calls", []).append({
                    "id": str(extra.get("id", "")), "type": "function",
                    "function": {"name": str(extra.get("name", "")),
                                 "arguments": extra.get("input") or {}}})
            elif block.type == "thinking" and message.role == "assistant":
                turn["reasoning_content"] = (turn.get("reasoning_content", "")
                                             + str(extra.get("thinking") or ""))
            elif block.type == "redacted_thinking":
                continue
            elif block.type == "tool_result" and message.role == "user":
                content = extra.get("content")
                results.append({"role": "tool", "tool_call_id": str(extra.get("tool_use_id", "")),
                                "content": content if isinstance(content, str) else _text(
                                    [Block.model_validate(b) for b in content or []],
                                    f"{where}.tool_result")})
            else:
                raise ApiError(400, f"{where}: {block.type!r} blocks are not supported in a "
                                    f"{message.role} turn — text, images (a user's) and tools "
                                    f"are; documents are not")
        out += results  # (a user turn's tool results answer the calls just before it)
        if any(part["type"] == "image" for part in parts):
            turn["content"] = parts
        if turn["content"] or turn.get("tool_calls") or not results:
            out.append(turn)
    last = body.messages[-1] if body.messages else None
    if last is not None and last.role == "assistant" and out[-1]["role"] == "assistant":
        out[-1] = {**out[-1], "prefix": True}  # the reply goes on from it, as Anthropic's
    return out, files


def _stop(stats: RequestStats, called: bool = False) -> tuple[str, str | None]:
    """Anthropic's stop_reason, and the stop sequence that ended the reply, if one did."""
    if stats.finish_reason == "length":  # (a call cut there is not whole: as Anthropic)
        return "max_tokens", None
    if called:
        return "tool_use", None
    if stats.stop_string is not None:
        return "stop_sequence", stats.stop_string
    return "end_turn", None


def _usage(stats: RequestStats, job: core.Job) -> dict[str, int]:
    return {"input_tokens": job.prompt_tokens, "output_tokens": stats.generated_tokens}


@router.post("/messages")
async def messages(body: MessagesRequest, request: Request):
    turns, files = _messages(body)
    job = await core.start(request.app.state.pool, body.model, body.params(),
                           messages=turns, tools=body.tool_spec(),
                           template_args=body.template_args(), images=files,
                           think_budget=body.think_budget())
    message_id = f"msg_{uuid.uuid4().hex}"
    if body.stream:
        return StreamingResponse(_stream(job, message_id), media_type="text/event-stream")
    reply, stats, _ = await job.read()
    observe(job, stats)
    content: list[dict[str, Any]] = []
    if reply.reasoning:
        content.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.content or not reply.calls:
        content.append({"type": "text", "text": reply.content})
    content += [{"type": "tool_use", "id": c["id"], "name": c["name"],
                 "input": arguments_object(c["arguments"])} for c in reply.calls]
    reason, sequence = _stop(stats, bool(reply.calls))
    return {"id": message_id, "type": "message", "role": "assistant", "model": job.model.name,
            "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": _usage(stats, job)}


class CountRequest(MessagesRequest):
    max_tokens: Optional[int] = Field(None, ge=1)  # (not asked for by count_tokens)


@router.post("/messages/count_tokens")
async def count_tokens(body: CountRequest, request: Request) -> dict[str, int]:
    """The tokens a request's prompt takes, rendered as /v1/messages renders it."""
    turns, files = _messages(body)
    return {"input_tokens": await core.count(request.app.state.pool, body.model, turns,
                                             body.tool_spec(), body.template_args(), files)}


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


class _Blocks:
    """The reply's content blocks as Anthropic streams them: each opened, its deltas, closed."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None
        self.called = False

    def add(self, piece: Piece) -> list[str]:
        kind = {"content": "text", "reasoning": "thinking", "call": "tool_use",
                "arguments": "tool_use"}.get(piece.kind)
        if kind is None:
            return []
        events = []
        if piece.kind == "call" or self.open != kind:
            events += self.close()
            self.index += 1
            self.open = kind
            block: dict[str, Any] = {"type": kind, kind: ""} if kind != "tool_use" else {
                "type": "tool_use", "id": piece.id, "name": piece.name, "input": {}}
            if kind == "thinking":
                block["signature"] = ""
            self.called |= kind == "tool_use"
            events.append(_event("content_block_start", {"index": self.index,
                                                         "content_block": block}))
        if piece.kind == "content":
            delta = {"type": "text_delta", "text": piece.text}
        elif piece.kind == "reasoning":
            delta = {"type": "thinking_delta", "thinking": piece.text}
        elif piece.kind == "arguments":
            delta = {"type": "input_json_delta", "partial_json": piece.text}
        else:
            return events
        events.append(_event("content_block_delta", {"index": self.index, "delta": delta}))
        return events

    def close(self) -> list[str]:
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":
            events.append(_event("content_block_delta", {
                "index": self.index, "delta": {"type": "signature_delta", "signature": ""}}))
        self.open = None
        return events + [_event("content_block_stop", {"index": self.index})]


async def _stream(job: core.Job, message_id: str) -> AsyncIterator[str]:
    """Anthropic's events: message_start, each block's start, deltas and stop, then
    message_delta (stop reason, usage) and message_stop; an error mid-stream is an `error`
    event."""
    yield _event("message_start", {"message": {
        "id": message_id, "type": "message", "role": "assistant", "model": job.model.name,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": job.prompt_tokens, "output_tokens": 0}}})
    reader = job.parser()
    blocks = _Blocks()
    async for event in job.events():
        if isinstance(event, ErrorEvent):
            yield _event("error", {"error": {"type": "api_error", "message": str(event.error)}})
            return
        if isinstance(event, DoneEvent):
            for piece in reader.close():
                for line in blocks.add(piece):
                    yield line
            observe(job, event.stats)  # (after the parser's last pieces: TTFT)
            if blocks.index < 0:  # an empty reply is one empty text block
                yield _event("content_block_start", {"index": 0, "content_block": {
                    "type": "text", "text": ""}})
                yield _event("content_block_stop", {"index": 0})
            for line in blocks.close():
                yield line
            reason, sequence = _stop(event.stats, blocks.called)
            yield _event("message_delta", {
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": {"output_tokens": event.stats.generated_tokens}})
            yield _event("message_stop", {})
            return
        for piece in reader.feed(event.text):
            for line in blocks.add(piece):
                yield line
