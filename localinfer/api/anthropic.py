"""The Anthropic Messages API (`POST /v1/messages`), as a thin converter onto the one generate
path (`core.start`): text in, text out, streamed as Anthropic's events.

What it takes: `system` (a string or text blocks), `messages` whose content is a string or
text blocks, `max_tokens` (required, as Anthropic requires it), `temperature`, `top_p`,
`top_k`, `stop_sequences`, `stream`. Images, documents and tool blocks are refused with a 400
naming them (tools: not yet). Errors have Anthropic's shape (`errors.error_response`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from localinfer.api import core
from localinfer.api.errors import ApiError
from localinfer.api.metrics import observe
from localinfer.backends.base import DoneEvent, ErrorEvent, RequestStats, SamplingParams

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["anthropic"])


class Block(core.Lenient):
    type: str
    text: Optional[str] = None


class Message(core.Lenient):
    role: Literal["user", "assistant"]
    content: Union[str, list[Block]]


class MessagesRequest(core.Lenient):
    model: str = Field(min_length=1, max_length=200)
    messages: list[Message] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: Union[str, list[Block], None] = None
    temperature: float = Field(1.0, ge=0, le=1)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    stop_sequences: Optional[list[str]] = Field(None, max_length=64)
    stream: bool = False
    tools: Optional[list[dict[str, Any]]] = None

    def params(self) -> SamplingParams:
        if self.tools:
            raise ApiError(400, "tools are not supported on /v1/messages yet — use "
                                "/v1/chat/completions or /api/chat for tool calls")
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              min_p=0.0, max_tokens=self.max_tokens,
                              stop=tuple(self.stop_sequences or ()))


def _text(content: Union[str, list[Block], None], where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for block in content:
        if block.type != "text":
            raise ApiError(400, f"{where}: only text blocks are supported, not "
                                f"{block.type!r} — this model takes no images or documents, "
                                f"and tools are not supported here yet")
    return "".join(block.text or "" for block in content)


def _messages(body: MessagesRequest) -> list[dict[str, str]]:
    out = [{"role": "system", "content": _text(body.system, "system")}] if body.system else []
    return out + [{"role": m.role, "content": _text(m.content, f"messages[{i}]")}
                  for i, m in enumerate(body.messages)]


def _stop(stats: RequestStats) -> tuple[str, str | None]:
    """Anthropic's stop_reason, and the stop sequence that ended the reply, if one did."""
    if stats.finish_reason == "length":
        return "max_tokens", None
    if stats.stop_string is not None:
        return "stop_sequence", stats.stop_string
    return "end_turn", None


def _usage(stats: RequestStats, job: core.Job) -> dict[str, int]:
    return {"input_tokens": job.prompt_tokens, "output_tokens": stats.generated_tokens}


@router.post("/messages")
async def messages(body: MessagesRequest, request: Request):
    params = body.params()
    job = await core.start(request.app.state.pool, body.model, params,
                           messages=_messages(body))
    message_id = f"msg_{uuid.uuid4().hex}"
    if body.stream:
        return StreamingResponse(_stream(job, message_id), media_type="text/event-stream")
    text, stats = await job.collect()
    observe(job, stats)
    reason, sequence = _stop(stats)
    return {"id": message_id, "type": "message", "role": "assistant", "model": job.model.name,
            "content": [{"type": "text", "text": text}], "stop_reason": reason,
            "stop_sequence": sequence, "usage": _usage(stats, job)}


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


async def _stream(job: core.Job, message_id: str) -> AsyncIterator[str]:
    """Anthropic's events: message_start, a text block's start, deltas and stop, then
    message_delta (stop reason, usage) and message_stop; an error mid-stream is an `error`
    event."""
    yield _event("message_start", {"message": {
        "id": message_id, "type": "message", "role": "assistant", "model": job.model.name,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": job.prompt_tokens, "output_tokens": 0}}})
    yield _event("content_block_start", {"index": 0,
                                         "content_block": {"type": "text", "text": ""}})
    async for event in job.events():
        if isinstance(event, ErrorEvent):
            yield _event("error", {"error": {"type": "api_error", "message": str(event.error)}})
            return
        if isinstance(event, DoneEvent):
            observe(job, event.stats)
            reason, sequence = _stop(event.stats)
            yield _event("content_block_stop", {"index": 0})
            yield _event("message_delta", {
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": {"output_tokens": event.stats.generated_tokens}})
            yield _event("message_stop", {})
            return
        if event.text:
            yield _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta",
                                                                       "text": event.text}})
