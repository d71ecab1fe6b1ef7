"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import struct
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import Field

from localinfer.api import core, images
from localinfer.api.errors import ApiError
from localinfer.api.metrics import observe
from localinfer.api.tools import ToolSpec
from localinfer.backends.base import MAX_LOGPROBS, DoneEvent, ErrorEvent, Logprob, SamplingParams
from localinfer.chat_formats.prompt import EFFORT_BUDGETS
from localinfer.chat_formats.reply import Piece, Reply
from localinfer.chat_formats.fim import Infill
from localinfer.chat_formats.grammar import ANY_JSON, json_schema_grammar
from localinfer.backends.metrics import RequestStats
from localinfer.errors import ModelNotFound

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["openai"])


class ImageUrl(core.Lenient):
    url: str
    detail: Optional[str] = None


class ContentPart(core.Lenient):
    type: str
    text: Optional[str] = None
    image_url: Optional[ImageUrl] = None


class Message(core.Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None
    name: Optional[str] = None


class StreamOptions(core.Lenient):
    include_usage: bool = False


class ResponseFormat(core.Lenient):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: Optional[dict[str, Any]] = None


class _Sampling(core.OpenAISampling):
    max_tokens: Optional[int] = Field(None, ge=1)
    n: int = Field(1, ge=1, le=1, description="only 1 is supported")
    stream: bool = False
    stream_options: Optional[StreamOptions] = None

    def top_logprobs_asked(self) -> int | None:
        """How many likeliest tokens each written token's log probability comes with (None:
        no log probabilities)."""
        return None

    def params(self, max_tokens: int | None, grammar: str | None = None) -> SamplingParams:
        return super().params(max_tokens, grammar, self.top_logprobs_asked())


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    response_format: Optional[ResponseFormat] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    reasoning_effort: Optional[Literal["none", "minimal", "low", "medium", "high"]] = None
    # llama-server's: values the chat template reads (enable_thinking: false, …)
    chat_template_kwargs: Optional[dict[str, Union[str, int, float, bool, None]]] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)
    # llama-server's: the most tokens the reasoning block may take (-1: no limit)
    reasoning_budget_tokens: Optional[int] = Field(None, ge=-1)
    thinking_budget_tokens: Optional[int] = Field(None, ge=-1)

    def think_budget(self) -> int | None:
        """llama-server's budget where given, else what reasoning_effort allows."""
        budget = (self.reasoning_budget_tokens if self.reasoning_budget_tokens is not None
                  else self.thinking_budget_tokens)
        if budget is not None:
            return None if budget == -1 else budget
        return EFFORT_BUDGETS.get(self.reasoning_effort or "")

    def top_logprobs_asked(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs:  # (OpenAI's own words)
                raise ApiError(400, "logprobs must be set to true when top_logprobs is used")
            return None
        return self.top_logprobs or 0


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int]]
    max_tokens: Optional[int] = Field(16, ge=1)  # the completions API's own default
    # the text after the cursor: each prompt's reply fills the middle (a code model's FIM)
    suffix: Optional[str] = None
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=5)  # 0: the chosen tokens' alone

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs


class EmbeddingRequest(core.Lenient):
    model: str = Field("", max_length=200)
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(None, ge=1)  # the first N, normalised again


# ---------------------------------------------------------------------------- helpers
def _messages(messages: list[Message]
              ) -> tuple[list[dict[str, Any]], list[bytes | images.Remote]]:
    """The messages as the backend takes them, and their images' files in order."""
    files: list[bytes | images.Remote] = []
    return [_text(m, files) for m in messages], files


def _text(message: Message, files: list[bytes | images.Remote]) -> dict[str, Any]:
    content = message.content
    if isinstance(content, list):
        if any(p.type not in ("text", "image_url") for p in content):
            raise ApiError(400, "only text and image_url content parts are taken — no audio "
                                "or files")
        if any(p.type == "image_url" for p in content):
            if not all(p.image_url for p in content if p.type == "image_url"):
                raise ApiError(400, "an image_url part needs image_url.url")
            files += [images.from_url(p.image_url.url) for p in content if p.image_url]
            content = [{"type": "image"} if p.type == "image_url"
                       else {"type": "text", "text": p.text or ""} for p in content]
        else:
            content = "".join(p.text or "" for p in content)
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                           "content": content or ""}
    if message.tool_calls:
        out["tool_calls"] = message.tool_calls
    for key in ("tool_call_id", "name"):
        if getattr(message, key):
            out[key] = getattr(message, key)
    reasoning = (message.model_extra or {}).get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:  # templates decide whether it is rendered
        out["reasoning_content"] = reasoning
    if message.role == "assistant" and (message.model_extra or {}).get("prefix") is True:
        out["prefix"] = True  # (Mistral's and DeepSeek's: the reply goes on from it)
    return out


def _grammar(fmt: ResponseFormat | None) -> str | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ANY_JSON
    schema = (fmt.json_schema or {}).get("schema")
    if not isinstance(schema, dict):
        raise ApiError(400, "response_format json_schema needs json_schema.schema, an object")
    return json_schema_grammar(schema)


def usage(stats: RequestStats, prompt_tokens: int, reasoning: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def timings(stats: RequestStats, reasoning: int = 0) -> dict[str, Any]:
    """Our measurements, in an extra field that OpenAI clients ignore (Figures.to_timings)."""
    return dataclasses.replace(stats.figures(), reasoning_tokens=reasoning).to_timings()


def _finish(stats: RequestStats) -> str:
    return "length" if stats.finish_reason == "length" else "stop"


async def _stream(job: core.Job, shape) -> AsyncIterator[str]:
    """SSE: one chunk per token event, a closing chunk, then [DONE]."""
    try:
        async for event in job.events():
            if isinstance(event, ErrorEvent):
                yield core.sse({"error": {"message": str(event.error), "type": "server_error"}})
                break
            if isinstance(event, DoneEvent):
                chunks = shape.finish(event.stats)  # (the parser's last pieces first: TTFT)
                observe(job, event.stats)
                for chunk in chunks:
                    yield core.sse(chunk)
            elif event.text:  # (no chunk while a marker may be starting)
                for chunk in shape.deltas(event.text, event.logprobs):
                    yield core.sse(chunk)
    finally:
        yield core.sse("[DONE]")


# ---------------------------------------------------------------------------- routes
@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    now = int(time.time())
    return {"object": "list", "data": [_model(name, now) for name in request.app.state.catalog()]}


@router.get("/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> dict[str, Any]:
    """One of /v1/models by its id (hub names hold slashes), or a 404 naming the close ones."""
    names = request.app.state.catalog()
    if model not in names:
        raise ModelNotFound(model, known=names)
    return _model(model, int(time.time()))


def _model(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "localinfer"}


class _ChatShape:
    """A chat reply as SSE chunks: content and reasoning_content deltas as they come, and each
    tool call as OpenAI streams them — its index, id and name first, then its arguments in
    fragments — read in the model's own call syntax (app/chat_formats/parser.py)."""

    def __init__(self, job: core.Job, body: ChatCompletionRequest):
        self.job, self.body = job, body
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.sent_role = False
        self.parser = job.parser()
        self.called = False
        self.logprobs: list[Logprob] = []  # the tokens' whose text no chunk has carried yet

    def _chunk(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.job.model.name,
                "choices": [{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": finish}]}

    def deltas(self, text: str, logprobs: tuple[Logprob, ...] = ()) -> list[dict[str, Any]]:
        self.logprobs += logprobs
        return self._with_logprobs(self._pieces(self.parser.feed(text)))

    def _with_logprobs(self, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The first chunk carries the log probabilities of the tokens it and those held
        before it came from."""
        if chunks and self.body.logprobs:
            chunks[0]["choices"][0]["logprobs"] = {
                "content": core.logprob_entries(self.logprobs), "refusal": None}
            self.logprobs = []
        return chunks

    def _pieces(self, pieces: list[Piece]) -> list[dict[str, Any]]:
        chunks = []
        for piece in pieces:
            if piece.kind == "content":
                delta: dict[str, Any] = {"content": piece.text}
            elif piece.kind == "reasoning":
                delta = {"reasoning_content": piece.text}
            elif piece.kind == "call":
                self.called = True
                delta = {"tool_calls": [{"index": piece.index, "id": piece.id,
                                         "type": "function",
                                         "function": {"name": piece.name, "arguments": ""}}]}
            elif piece.kind == "arguments":
                delta = {"tool_calls": [{"index": piece.index,
                                         "function": {"arguments": piece.text}}]}
            else:
                continue
            if not self.sent_role:
                delta = {"role": "assistant", **delta}
                self.sent_role = True
            chunks.append(self._chunk(delta, None))
        return chunks

    def finish(self, stats: RequestStats) -> list[dict[str, Any]]:
        chunks = self._pieces(self.parser.close())
        last = self._chunk({} if self.sent_role else {"role": "assistant", "content": ""},
                           "tool_calls" if self.called and stats.finish_reason != "length"
                           else _finish(stats))
        chunks = self._with_logprobs(chunks + [last])
        reasoning = self.parser.reasoning_tokens
        last["timings"] = timings(stats, reasoning)
        if self.body.stream_options and self.body.stream_options.include_usage:
            tail = self._chunk({}, None)
            tail["choices"] = []
            tail["usage"] = usage(stats, self.job.prompt_tokens, reasoning)
            chunks.append(tail)
        return chunks


def _message(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant",
                               "content": reply.content if reply.content or not reply.calls
                               else None}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.calls:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                                 for c in reply.calls]
    return message


def _template_args(body: ChatCompletionRequest) -> dict[str, Any]:
    """What the template reads besides the messages: llama-server's chat_template_kwargs,
    and OpenAI's reasoning_effort (gpt-oss's templates read it by that name)."""
    args = dict(body.chat_template_kwargs or {})
    if body.reasoning_effort:
        args["reasoning_effort"] = body.reasoning_effort
        args.setdefault("enable_thinking", body.reasoning_effort not in ("none", "minimal"))
    return args


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    tools = ToolSpec.from_request(body.tools, body.tool_choice)
    grammar = _grammar(body.response_format) or body.grammar
    params = body.params(body.max_completion_tokens or body.max_tokens, grammar)
    messages, files = _messages(body.messages)
    job = await core.start(request.app.state.pool, body.model or None, params,
                           messages=messages, tools=tools, images=files,
                           template_args=_template_args(body),
                           think_budget=body.think_budget())
    if body.stream:
        return StreamingResponse(_stream(job, _ChatShape(job, body)),
                                 media_type="text/event-stream")
    reply, stats, reasoning = await job.read()
    observe(job, stats)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()), "model": job.model.name,
        "choices": [{"index": 0, "message": _message(reply),
                     "logprobs": {"content": core.logprob_entries(job.logprobs),
                                  "refusal": None} if body.logprobs else None,
                     "finish_reason": ("tool_calls" if reply.calls
                                       and stats.finish_reason != "length" else _finish(stats))}],
        "usage": usage(stats, job.prompt_tokens, reasoning),
        "timings": timings(stats, reasoning),
    }


def _legacy_logprobs(written: Sequence[Logprob], offset: int = 0) -> dict[str, Any]:
    """Log probabilities as the completions API gives them: tokens, theirs, a mapping of the
    likeliest to theirs, and where each token's text starts."""
    tokens, offsets = [], []
    for _, text, _, _ in written:
        offsets.append(offset)
        tokens.append(text.decode("utf-8", "replace"))
        offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [lp for _, _, lp, _ in written],
            "top_logprobs": [{t.decode("utf-8", "replace"): lp for _, t, lp in top}
                             for _, _, _, top in written],
            "text_offset": offsets}


class _CompletionShape:
    def __init__(self, job: core.Job, body: CompletionRequest):
        self.job, self.body = job, body
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.offset = 0  # characters written so far (the legacy logprobs' text_offset)

    def _chunk(self, text: str, finish: str | None,
               logprobs: tuple[Logprob, ...] = ()) -> dict[str, Any]:
        legacy = (_legacy_logprobs(logprobs, self.offset) if self.body.logprobs is not None
                  else None)
        self.offset += len(text)
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.job.model.name,
                "choices": [{"index": 0, "text": text, "logprobs": legacy,
                             "finish_reason": finish}]}

    def deltas(self, text: str, logprobs: tuple[Logprob, ...] = ()) -> list[dict[str, Any]]:
        return [self._chunk(text, None, logprobs)]

    def finish(self, stats: RequestStats) -> list[dict[str, Any]]:
        last = self._chunk("", _finish(stats))
        last["timings"] = timings(stats)
        chunks = [last]
        if self.body.stream_options and self.body.stream_options.include_usage:
            tail = {**self._chunk("", None), "choices": [],
                    "usage": usage(stats, self.job.prompt_tokens)}
            chunks.append(tail)
        return chunks


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request):
    pool = request.app.state.pool
    params = body.params(body.max_tokens, body.grammar)
    prompts: list[Any]
    if isinstance(body.prompt, str) or (body.prompt and isinstance(body.prompt[0], int)):
        prompts = [body.prompt]
    else:
        prompts = list(body.prompt)
    if not prompts:
        raise ApiError(400, "prompt is empty")
    if body.suffix is not None and not all(isinstance(p, str) for p in prompts):
        raise ApiError(400, "with a suffix, each prompt is the text before it — send text, "
                            "not tokens")

    def begin(prompt: Any):
        if body.suffix is not None:
            return core.start(pool, body.model or None, params,
                              infill=Infill(prompt, body.suffix))
        return core.start(pool, body.model or None, params, prompt=prompt)

    if body.stream:
        if len(prompts) != 1:
            raise ApiError(400, "streaming takes one prompt at a time")
        job = await begin(prompts[0])
        return StreamingResponse(_stream(job, _CompletionShape(job, body)),
                                 media_type="text/event-stream")
    jobs: list[core.Job] = []
    try:
        for prompt in prompts:
            jobs.append(await begin(prompt))
    except BaseException:  # one bad prompt: the ones already queued must not run on
        for job in jobs:
            await job.cancel()
        raise
    results = await core.unless_gone(request, asyncio.gather(*(j.collect() for j in jobs)))
    if results is None:  # the client has gone: its requests were cancelled
        return Response(status_code=499)
    choices, prompt_n, completion_n, cached_n = [], 0, 0, 0
    for i, (job, (text, stats), prompt) in enumerate(zip(jobs, results, prompts)):
        observe(job, stats)
        echo = (prompt if isinstance(prompt, str) else "") if body.echo else ""
        choices.append({"index": i, "text": echo + text,
                        "logprobs": _legacy_logprobs(job.logprobs, len(echo))
                        if body.logprobs is not None else None,
                        "finish_reason": _finish(stats)})
        prompt_n += job.prompt_tokens
        completion_n += stats.generated_tokens
        cached_n += stats.cached_tokens
    return {
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
        "created": int(time.time()), "model": jobs[0].model.name, "choices": choices,
        "usage": {"prompt_tokens": prompt_n, "completion_tokens": completion_n,
                  "total_tokens": prompt_n + completion_n,
                  "prompt_tokens_details": {"cached_tokens": cached_n}},
        "timings": timings(results[0][1]) if len(results) == 1 else None,
    }


@router.post("/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
    inputs = body.input
    if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
        inputs = [inputs]
    if not inputs:
        raise ApiError(400, "input is empty")
    async with request.app.state.pool.use(core.check_model_name(body.model or None)) as loaded:
        core.check_embeds(loaded)
        texts = [item if isinstance(item, str) else await asyncio.to_thread(
            loaded.backend.detokenize, item) for item in inputs]
        # one call for them all: short inputs share a decode
        vectors, n_tokens = await core.read_while_there(request, loaded.backend.embed_many, texts)
        vectors = core.shortened(vectors, body.dimensions)
        data = []
        for i, vector in enumerate(vectors):
            encoded: Any = vector
            if body.encoding_format == "base64":
                encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": encoded})
    return {"object": "list", "data": data, "model": loaded.name,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
