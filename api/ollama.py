"""Ollama-compatible routes: /api/chat, /api/generate, /api/tags, /api/show, /api/ps, ...

Streaming is NDJSON and on by default, durations are nanoseconds, and the sampling
defaults are Ollama's own (temperature 0.8, top_p 0.9, repeat_penalty 1.1), so a client
written for Ollama gets the replies it expects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import Field

from localinfer import __version__
from localinfer.api import core, images
from localinfer.api.errors import ApiError
from localinfer.api.metrics import observe
from localinfer.api.pulling import PullJob
from localinfer.api.tools import ToolSpec
from localinfer.backends.base import MAX_LOGPROBS, DoneEvent, ErrorEvent, Logprob, SamplingParams
from localinfer.chat_formats.detect import detect
from localinfer.chat_formats.prompt import EFFORT_BUDGETS
from localinfer.chat_formats.reply import Piece, arguments_object
from localinfer.chat_formats.template import fallback_template
from localinfer.chat_formats.fim import Infill
from localinfer.chat_formats.grammar import ANY_JSON, json_schema_grammar
from localinfer.backends.metrics import RequestStats
from localinfer.errors import InvalidRequest, LocalinferError, user_message
from localinfer.installed import (Manifest, capabilities, delete_model, digest, header,
                                  installed_models, is_pulled, listed_header)
from localinfer.service import pull_model
from localinfer.pool import LoadedModel

__all__ = ["router"]

router = APIRouter(prefix="/api", tags=["ollama"])
NDJSON = "application/x-ndjson"


class _Body(core.NullsUnsent):
    """A part of a request as Ollama reads it (a null: the field's default)."""


class Options(_Body):
    temperature: float = core.sampling_field("temperature", 0.8)
    top_k: int = core.sampling_field("top_k", 40)
    top_p: float = core.sampling_field("top_p", 0.9)
    min_p: float = core.sampling_field("min_p", 0.0)
    repeat_penalty: float = core.sampling_field("repeat_penalty", 1.1)
    presence_penalty: float = core.sampling_field("presence_penalty", 0.0)
    frequency_penalty: float = core.sampling_field("frequency_penalty", 0.0)
    seed: Optional[int] = core.sampling_field("seed", None)
    num_predict: Optional[int] = Field(None, ge=-2)
    num_keep: int = Field(4, ge=0)
    stop: Optional[list[str]] = None
    # the context per request: the model is loaded again with it where it differs (Ollama)
    num_ctx: Optional[int] = Field(None, ge=16, le=1 << 24)


    def params(self, grammar: str | None) -> SamplingParams:
        if self.num_predict == 0:
            raise ApiError(400, "num_predict must be a positive number of tokens, or -1 for "
                                "no limit")
        max_tokens = self.num_predict if self.num_predict and self.num_predict > 0 else None
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
            repeat_penalty=self.repeat_penalty, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, seed=self.seed, max_tokens=max_tokens,
            stop=tuple(self.stop or ()), grammar=grammar,
            # as Ollama: a full context drops its older half and a reply with num_predict
            # goes on (without one, or with -2 "fill the context", it ends there)
            context_shift=True, n_keep=self.num_keep,
            # num_predict set, -1 ("no limit, the context ends it") included: no reply cap
            capped=self.num_predict is None,
        )


class ChatMessage(_Body):
    role: str
    content: str = ""
    images: Optional[list[str]] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    thinking: Optional[str] = None
    tool_name: Optional[str] = None


def _message(m: ChatMessage, files: list[bytes]) -> dict[str, Any]:
    """A message as templates read it: earlier thinking under both names templates use
    (Qwen's reasoning_content, gpt-oss's thinking); each template decides whether it goes
    back into the prompt. Its images (their files go on `files`) come before its text, as
    Ollama places them."""
    out = m.model_dump(include={"role", "content", "tool_calls", "thinking"}, exclude_none=True)
    if m.images:
        files += [images.from_base64(i) for i in m.images]
        out["content"] = [*({"type": "image"} for _ in m.images),
                          {"type": "text", "text": m.content}]
    if m.thinking:
        out["reasoning_content"] = m.thinking
    if m.tool_name:
        out["name"] = m.tool_name
    return out


class _Base(_Body):
    model: str = Field(min_length=1, max_length=200)
    stream: bool = True
    format: Union[str, dict[str, Any], None] = None
    options: Options = Field(default_factory=Options)
    keep_alive: Union[str, float, None] = None
    think: Union[bool, Literal["low", "medium", "high"], None] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS)

    def params(self) -> SamplingParams:
        """The options' sampling, with the log probabilities asked for."""
        params = self.options.params(self.grammar())
        if not self.logprobs:
            return params
        return dataclasses.replace(params, logprobs=self.top_logprobs or 0)

    def grammar(self) -> str | None:
        if self.format in (None, ""):
            # llama-server's GBNF `grammar`, taken among the options (bounded as any grammar)
            grammar = self.options.model_extra.get("grammar") if self.options.model_extra else None
            if grammar is not None and (not isinstance(grammar, str) or len(grammar) > 1 << 19):
                raise ApiError(400, "options.grammar must be a GBNF grammar of at most 512 KB")
            return grammar
        if self.format == "json":
            return ANY_JSON
        if isinstance(self.format, dict):
            return json_schema_grammar(self.format)
        raise ApiError(400, f"format must be \"json\" or a JSON schema, not {self.format!r}")


class ChatRequest(_Base):
    messages: list[ChatMessage] = Field(default_factory=list)
    tools: Optional[list[dict[str, Any]]] = None
    # as Ollama: a chat past the context loses its oldest messages (false: a 400)
    truncate: bool = True


class GenerateRequest(_Base):
    prompt: str = ""
    system: Optional[str] = None
    raw: bool = False
    images: Optional[list[str]] = None
    # the conversation so far, as the `context` of a previous reply returned it: tokens
    context: Optional[list[Annotated[int, Field(ge=0)]]] = Field(None, max_length=1 << 20)
    # the text after the cursor: the reply fills the middle (a code model's FIM tokens)
    suffix: Optional[str] = None


class NameRequest(_Body):
    model: Optional[str] = Field(None, max_length=200)
    name: Optional[str] = Field(None, max_length=200)  # the older spelling

    @property
    def which(self) -> str:
        value = self.model or self.name
        if not value:
            raise ApiError(400, "model is required")
        return value


class EmbedRequest(_Body):
    model: str = Field(min_length=1, max_length=200)
    input: Union[str, list[str], None] = None
    prompt: Optional[str] = None  # /api/embeddings, the older route
    keep_alive: Union[str, float, None] = None
    options: Optional[Options] = None  # (num_ctx is what counts here)
    # as Ollama: an input past the context is cut to it unless told not to (then a 400)
    truncate: bool = True
    dimensions: Optional[int] = Field(None, ge=1)  # the first N, normalised again


# ---------------------------------------------------------------------------- helpers
def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _ns(seconds: float | None) -> int:
    return int((seconds or 0) * 1e9)


def _final(job: core.Job, stats: RequestStats) -> dict[str, Any]:
    return {
        "done": True,
        "done_reason": stats.finish_reason if stats.finish_reason == "length" else "stop",
        "total_duration": _ns(time.monotonic() - job.started),
        "load_duration": _ns(job.load_duration),
        "prompt_eval_count": job.prompt_tokens,
        **stats.figures().ollama_durations(),
    }




async def _ndjson(lines: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    async for line in lines:
        yield json.dumps(line, ensure_ascii=False) + "\n"


def _details(model_name: str, info=None, quant: str | None = None) -> dict[str, Any]:
    family = info.architecture if info else model_name.split(":")[0]
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family],
            "parameter_size": _param_size(info),
            "quantization_level": info.quant if info else quant or ""}


def _param_size(info) -> str:
    n = getattr(info, "n_params", 0) or 0
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n else ""


# ---------------------------------------------------------------------------- chat / generate
async def _load_only(request: Request, body: _Base, key: str) -> dict[str, Any]:
    """An empty chat or prompt loads the model, or unloads it with keep_alive 0."""
    pool = request.app.state.pool
    began = time.monotonic()
    reason = "load"
    if body.keep_alive is not None and str(body.keep_alive) in ("0", "0s", "0m", "0.0"):
        name = await pool.canonical(core.check_model_name(body.model))
        await pool.unload(name)
        reason = "unload"
    else:
        async with pool.use(core.check_model_name(body.model), body.keep_alive,
                            body.options.num_ctx) as loaded:
            name = loaded.name
    empty: Any = {"role": "assistant", "content": ""} if key == "message" else ""
    return {"model": name, "created_at": _now(), key: empty, "done": True,
            "done_reason": reason, "total_duration": _ns(time.monotonic() - began)}


async def _run(job: core.Job, body: _Base, key: str) -> AsyncIterator[dict[str, Any]]:
    """The reply as Ollama streams it: a line per piece — content, `thinking`, and each tool
    call once its arguments are complete — then the line with the numbers."""
    reply_ids: list[int] = []
    reader = job.parser()
    calls: dict[int, dict[str, Any]] = {}
    written: list[Logprob] = []  # log probabilities of tokens no line has carried yet

    def carried(line: dict[str, Any]) -> dict[str, Any]:
        """The line with the log probabilities of the tokens it, and those held before it,
        came from (Ollama's `logprobs`, where asked)."""
        if body.logprobs:
            line["logprobs"] = core.logprob_entries(written)
            written.clear()
        return line

    def lines(pieces: list[Piece]) -> Iterator[dict[str, Any]]:
        for piece in pieces:
            if piece.kind == "call":
                calls[piece.index] = {"name": piece.name, "arguments": ""}
                continue
            if piece.kind == "arguments":
                calls[piece.index]["arguments"] += piece.text
                continue
            if piece.kind == "reasoning" and body.think is False:
                continue  # thinking asked off, and the model thought anyway: not shown
            if piece.kind == "done":
                call = calls[piece.index]
                line: dict[str, Any] = {"tool_calls": [{"function": {
                    "index": piece.index, "name": call["name"],
                    "arguments": arguments_object(call["arguments"])}}]}
            elif piece.kind == "reasoning":
                line = {"thinking": piece.text}
            else:
                line = {"content": piece.text}
            if key == "message":
                yield carried({"model": job.model.name, "created_at": _now(),
                               "message": {"role": "assistant", "content": "", **line},
                               "done": False})
            elif "tool_calls" not in line:  # (/api/generate takes no tools)
                yield carried({"model": job.model.name, "created_at": _now(),
                               "response": line.get("content", ""),
                               **({"thinking": line["thinking"]} if "thinking" in line else {}),
                               "done": False})

    async for event in job.events():
        if isinstance(event, ErrorEvent):
            yield {"error": str(event.error)}
            return
        if isinstance(event, DoneEvent):
            if reader is not None:
                for line in lines(reader.close()):
                    yield line
            observe(job, event.stats)  # (after the parser's last pieces: TTFT)
            final = {"model": job.model.name, "created_at": _now(), **_final(job, event.stats)}
            if key == "response":  # the conversation as tokens, to send back as `context`
                final["context"] = [*job.prompt_ids, *reply_ids]
                final["response"] = ""
            else:
                final["message"] = {"role": "assistant", "content": ""}
            yield carried(final) if written else final
            return
        if event.token >= 0:  # (-1: text held back and let go at the end, no token of its own)
            reply_ids.append(event.token)
        written += event.logprobs
        if reader is None:
            yield carried({"model": job.model.name, "created_at": _now(), key: event.text,
                           "done": False})
            continue
        for line in lines(reader.feed(event.text)):
            yield line


async def _respond(job: core.Job, body: _Base, key: str):
    if body.stream:
        return StreamingResponse(_ndjson(_run(job, body, key)), media_type=NDJSON)
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    logprobs: list[dict[str, Any]] = []
    async for line in _run(job, body, key):
        if "error" in line:
            raise ApiError(500, line["error"], "server_error")
        logprobs += line.pop("logprobs", ())
        if line.get("done"):
            final = line
            continue
        part = line[key] if key == "message" else line
        text.append(part["content"] if key == "message" else part["response"])
        if part.get("thinking"):
            thinking.append(part["thinking"])
        calls.extend(part.get("tool_calls") or ())
    if key == "message":
        final["message"]["content"] = "".join(text)
        if thinking:
            final["message"]["thinking"] = "".join(thinking)
        if calls:
            final["message"]["tool_calls"] = calls
    else:
        final["response"] = "".join(text)
        if thinking:
            final["thinking"] = "".join(thinking)
    if body.logprobs:
        final["logprobs"] = logprobs
    return final


def _think_budget(body: _Base) -> int | None:
    """`think` "low", "medium" or "high": how long a family that tags its reasoning may
    think (chat_format.EFFORT_BUDGETS); gpt-oss reads the level in its own template."""
    return EFFORT_BUDGETS.get(body.think) if isinstance(body.think, str) else None


async def _check_thinks(request: Request, body: _Base) -> None:
    """`think` asked of a model whose template marks no reasoning: a 400 in Ollama's words
    (its clients learn from it that the model does not think), as /api/show lists no
    `thinking` for it. (think false, or a level on such a model, as Ollama: taken.)"""
    if body.think is not True:
        return
    _, info = await asyncio.to_thread(request.app.state.pool.describe,
                                      core.check_model_name(body.model))
    if not info.embedding and not info.rerank and not detect(info.chat_template).think:
        raise ApiError(400, f'"{body.model}" does not support thinking')


def _template_args(body: _Base) -> dict[str, Any]:
    """Ollama's `think`: true or false turns a template's thinking on or off; "low",
    "medium" or "high" (gpt-oss) is its reasoning effort."""
    if body.think is None:
        return {}
    if isinstance(body.think, str):
        return {"enable_thinking": True, "reasoning_effort": body.think}
    return {"enable_thinking": body.think}


@router.post("/chat")
async def chat(body: ChatRequest, request: Request):
    if not body.messages:
        return await _load_only(request, body, "message")
    await _check_thinks(request, body)
    files: list[bytes] = []
    messages = [_message(m, files) for m in body.messages]
    if messages[-1]["role"] == "assistant":  # the reply goes on from it, as Ollama's
        messages[-1]["prefix"] = True
    tools = ToolSpec.from_request(body.tools, "auto")
    job = await core.start(request.app.state.pool, body.model, body.params(),
                           messages=messages, keep_alive=body.keep_alive, tools=tools,
                           images=files,
                           n_ctx=body.options.num_ctx, template_args=_template_args(body),
                           think_budget=_think_budget(body), truncate=body.truncate)
    return await _respond(job, body, "message")


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request):
    if not body.prompt and not body.suffix:
        return await _load_only(request, body, "response")
    if body.images and (body.suffix or body.raw or body.context):
        raise ApiError(400, "images go with a prompt in the model's template — not with raw, "
                            "suffix or context")
    await _check_thinks(request, body)
    params = body.params()
    pool = request.app.state.pool
    if body.suffix:  # fill in the middle, as Ollama's `suffix` asks (editors' completion)
        job = await core.start(pool, body.model, params, keep_alive=body.keep_alive,
                               n_ctx=body.options.num_ctx,
                               infill=Infill(body.prompt, body.suffix))
        if not body.stream:
            answered = await core.unless_gone(request, _respond(job, body, "response"))
            return answered if answered is not None else Response(status_code=499)
    elif body.raw:
        job = await core.start(pool, body.model, params, prompt=body.prompt,
                               keep_alive=body.keep_alive, n_ctx=body.options.num_ctx,
                               context=body.context)
    else:
        messages = ([{"role": "system", "content": body.system}] if body.system else []) + [
            {"role": "user", "content": body.prompt}]
        files = [images.from_base64(i) for i in body.images or ()]
        if files:
            messages[-1]["content"] = [*({"type": "image"} for _ in files),
                                       {"type": "text", "text": body.prompt}]
        job = await core.start(pool, body.model, params, messages=messages,
                               keep_alive=body.keep_alive, plain_without_template=True,
                               n_ctx=body.options.num_ctx, context=body.context,
                               template_args=_template_args(body), images=files,
                               think_budget=_think_budget(body))
    return await _respond(job, body, "response")


# ---------------------------------------------------------------------------- models
@router.get("/tags")
async def tags(request: Request) -> dict[str, Any]:
    models_dir = request.app.state.settings.models_dir
    loaded = {m.name: m for m in request.app.state.pool.loaded()}
    installed = {m.name: m for m in await asyncio.to_thread(installed_models, models_dir)}
    models = []
    for name in request.app.state.catalog():
        known = installed.get(name)
        path = loaded[name].resolved.path if name in loaded else known and known.path
        stat = path.stat() if path and path.exists() else None
        # the file's own header, loaded or not, so a model's family does not change on load;
        # an embedded one not unpacked yet: its package's (header, size and sha256 as the
        # file will have them), so it lists the same before its first use and after
        info = (loaded[name].info if name in loaded else
                await asyncio.to_thread(header, path) if stat else
                await asyncio.to_thread(listed_header, name, models_dir) if known else None)
        models.append({
            "name": name, "model": name,
            "modified_at": datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat()
            if stat else _now(),
            "size": stat.st_size if stat else known and known.size or 0,  # (not unpacked yet)
            "digest": await asyncio.to_thread(digest, path, models_dir, known and known.sha256)
            if stat else known and known.sha256 or "",
            "details": _details(name, info, known and known.quant),
        })
    return {"models": models}


@router.post("/show")
async def show(body: NameRequest, request: Request) -> dict[str, Any]:
    """What the file's header says: describing a model does not load it (as Ollama)."""
    resolved, info = await asyncio.to_thread(request.app.state.pool.describe,
                                             core.check_model_name(body.which))
    return {
        "modelfile": f"FROM {resolved.path.name}\n",
        "parameters": "temperature 0.8\ntop_k 40\ntop_p 0.9\nrepeat_penalty 1.1",
        "template": info.chat_template or fallback_template(info.architecture),
        "details": _details(resolved.name, info),
        "model_info": {
            "general.architecture": info.architecture,
            "general.parameter_count": info.n_params,
            f"{info.architecture}.block_count": info.n_layer,
            f"{info.architecture}.context_length": info.n_ctx_train,
            f"{info.architecture}.attention.head_count": info.n_head,
            f"{info.architecture}.attention.head_count_kv": info.n_head_kv,
        },
        "capabilities": capabilities(info) + (["vision"] if resolved.projector else []),
        "modified_at": _now(),
    }


def _ps_entry(m: LoadedModel, sha256: str) -> dict[str, Any]:
    expires = m.expires_in
    until = (datetime.now(timezone.utc) + timedelta(seconds=expires) if expires is not None
             else datetime(2318, 1, 1, tzinfo=timezone.utc))  # Ollama's "forever"
    return {"name": m.name, "model": m.name, "size": m.memory_bytes, "digest": sha256,
            "details": _details(m.name, m.backend.info),
            "expires_at": until.isoformat().replace("+00:00", "Z"),
            "size_vram": m.gpu_bytes,
            "context_length": m.backend.info.n_ctx}


@router.get("/ps")
async def ps(request: Request) -> dict[str, Any]:
    models_dir = request.app.state.settings.models_dir
    loaded = request.app.state.pool.loaded()
    return {"models": [_ps_entry(m, await asyncio.to_thread(_digest_of, m, models_dir))
                       for m in loaded]}


def _digest_of(model: LoadedModel, models_dir: Path) -> str:
    """A loaded model's digest, as /api/tags gives it (a pulled one's from its manifest)."""
    known = next((m.sha256 for m in installed_models(models_dir) if m.name == model.name), None)
    try:
        return digest(model.resolved.path, models_dir, known)
    except OSError:  # the file went away under a loaded model
        return ""


@router.post("/pull")
async def pull(body: NameRequest, request: Request):
    """Embedded models come from their packages; hub models are downloaded and verified.
    Streamed (the default), the download's bytes are reported as Ollama does: `total` and
    `completed` on "pulling …" lines."""
    name = core.check_model_name(body.which)
    settings = request.app.state.settings
    job = PullJob(lambda progress: pull_model(name, settings, progress, False))
    if getattr(body, "stream", True) is False:
        await _unless_gone(job, request)
        return {"status": "success"}
    await job.started()  # a pull that fails before any byte is a 4xx/502, not a stream
    return StreamingResponse(_ndjson(_pull_lines(name, job)), media_type=NDJSON)


async def _unless_gone(job: PullJob, request: Request) -> None:
    """Wait for a pull whose answer is one JSON; a client that goes away meanwhile cancels it."""
    while not job.task.done():
        await asyncio.wait({job.task}, timeout=0.5)
        if not job.task.done() and await request.is_disconnected():
            job.cancel()
    job.task.result()


async def _pull_lines(name: str, job: PullJob) -> AsyncIterator[dict[str, Any]]:
    try:
        yield {"status": "pulling manifest"}
        async for done, total in job.progress():
            yield {"status": f"pulling {name}", "total": total, "completed": done}
    finally:  # the client went away (the stream was cancelled): so does the download
        if not job.task.done():
            job.cancel()
    try:
        got = job.task.result()
    except (LocalinferError, OSError) as exc:  # mid-download: the stream is under way
        yield {"error": user_message(exc)}
        return
    yield {"status": f"using {got.file} ({got.quant}), sha256 verified"
           if isinstance(got, Manifest) else f"using {got.path.name}"}
    yield {"status": "success"}


@router.delete("/delete")
async def delete(body: NameRequest, request: Request):
    name = core.check_model_name(body.which)
    models_dir = request.app.state.settings.models_dir
    if is_pulled(models_dir, name):
        await request.app.state.pool.unload(name)  # as Ollama does: a deleted model stops
    await asyncio.to_thread(delete_model, models_dir, name)
    return Response(status_code=200)


@router.post("/embed")
async def embed(body: EmbedRequest, request: Request) -> dict[str, Any]:
    inputs = [body.input] if body.input and isinstance(body.input, str) else list(
        body.input or [])
    began = time.monotonic()  # (no input: the model loaded, as Ollama's empty request)
    vectors, n_tokens = await _embed_all(request, body, inputs)
    return {"model": body.model, "embeddings": vectors, "prompt_eval_count": n_tokens,
            "total_duration": _ns(time.monotonic() - began), "load_duration": 0}


@router.post("/embeddings")
async def embeddings(body: EmbedRequest, request: Request) -> dict[str, Any]:
    vectors, _ = await _embed_all(request, body, [body.prompt] if body.prompt else [])
    return {"embedding": vectors[0] if vectors else []}  # (none: the model loaded)


async def _embed_all(request: Request, body: EmbedRequest, inputs: list[str]):
    pool = request.app.state.pool
    async with pool.use(core.check_model_name(body.model), body.keep_alive,
                        body.options.num_ctx if body.options else None) as loaded:
        core.check_embeds(loaded)
        if not inputs:
            return [], 0
        try:  # one call for them all: short inputs share a decode
            vectors, n_tokens = await core.read_while_there(
                request, partial(loaded.backend.embed_many, truncate=body.truncate), inputs)
        except InvalidRequest as exc:
            raise ApiError(400, str(exc)) from None
        return core.shortened(vectors, body.dimensions), n_tokens


# the Ollama whose API this serves, by its version: clients check it before they connect
# (VS Code's Copilot wants 0.6.4 or later; Codex's --oss 0.13.4, Ollama's first with
# /v1/responses) and by it know what they may send (`think` since 0.9, embeddings'
# `dimensions`); 0.14.0 was Ollama's first with Anthropic's /v1/messages, which is served
# here too. localinfer's own version is beside it
OLLAMA_API = "0.14.0"


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": OLLAMA_API, "localinfer": __version__}


root = APIRouter(tags=["ollama"])


@root.head("/")  # GET / is the web app's: the page for a browser, this text for the rest
async def alive_head() -> Response:
    return Response(media_type="text/plain")
