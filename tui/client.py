"""Where the chat app's replies come from: the engine in this process, or a running
`localinfer serve` (`--url`). Both speak the same small interface, so the screens never
know which one they talk to.

A reply streams as text pieces followed by its `Figures` — the engine's own in-process, the
server's `timings` read back into them remotely — so the status bar and the saved
conversation read one type, measured by the engine that produced the tokens. A thinking
model's reasoning comes as `Thought` pieces, apart from its answer.

A user's message may carry pictures (tui/pictures.Picture) under "pictures": in-process they
go to the backend as its images, to a server as OpenAI `image_url` data URLs of the kept
files. Whether the model takes any is `ModelStatus.vision`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import httpx

from localinfer.backends.base import (Backend, DoneEvent, ErrorEvent, LoadOptions, SamplingParams,
                                      TokenEvent)
from localinfer.chat_formats.prompt import start_chat
from localinfer.backends.metrics import Figures
from localinfer.errors import LocalinferError, user_message
from localinfer.model_rows import ModelRow, local_rows
from localinfer.settings import DEFAULT_MODEL, Settings

if TYPE_CHECKING:  # (the service loads the store and the hub: the app imports it when it loads)
    from localinfer.service import Hardware

__all__ = ["ChatClient", "LocalClient", "ModelRow", "ModelStatus", "RemoteClient", "Thought"]

Messages = Sequence[Mapping[str, Any]]  # role, content; "pictures" on a user's message


class Thought(str):
    """A piece of a reply's reasoning (the answer's pieces are plain `str`)."""


Piece = str | Figures  # text (a Thought: reasoning), then the figures of the finished reply


@dataclass(frozen=True)
class ModelStatus:
    """What the app knows about the loaded model (the status bar shows it); None where it
    is not known."""

    name: str
    quant: str
    device: str  # "CPU", "CUDA 33/33 layers", "Metal", "server"
    n_ctx: int
    kv_bytes: int | None = None  # the whole KV cache allocated for the chat
    kv_cells_used: int | None = None
    kv_cells_total: int | None = None
    memory_bytes: int | None = None  # resident memory of the process holding the model
    vision: bool | None = None  # it takes pictures (a projector beside it)


PullProgress = Callable[[int, "int | None"], None]


class ChatClient(ABC):
    where: str  # shown in the title: "in-process" or the server's URL

    @abstractmethod
    async def load(self, model: str, n_ctx: int | None = None) -> ModelStatus: ...

    @abstractmethod
    def stream(self, messages: Messages, params: SamplingParams) -> AsyncIterator[Piece]: ...

    @abstractmethod
    async def status(self) -> ModelStatus | None: ...

    @abstractmethod
    async def check_context(self, model: str, n_ctx: int) -> str | None:
        """Why `model` cannot run with a context of `n_ctx` tokens, or None if it can."""

    def stop(self) -> bool:
        """End the reply being written where it is. True: its stream ends by itself, with
        the engine's figures; False: the caller must cancel the stream."""
        return False

    @abstractmethod
    async def models(self) -> list[ModelRow]: ...

    @abstractmethod
    async def pull(self, name: str, progress: PullProgress) -> str: ...

    @abstractmethod
    async def delete(self, name: str) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...


# ---------------------------------------------------------------------------- in-process
class LocalClient(ChatClient):
    """A model of this machine, in a runner process, one at a time: the server's model
    manager (`pool.ModelPool`) keeping one model; switching models unloads the last."""

    where = "this machine"

    def __init__(self, settings: Settings | None = None, options: LoadOptions | None = None,
                 hardware: Callable[[], Hardware] | None = None,
                 process_memory: Callable[[], int] | None = None):
        from localinfer.pool import ModelPool

        self.settings = settings or Settings()
        self.options = options or LoadOptions()
        self._memory = process_memory
        # one model, kept until another is chosen (no keep-alive)
        self.pool = ModelPool(self.settings, self.options, max_loaded=1,
                              default_keep_alive=None, probe=hardware, paths=True)
        self._model: Any = None  # the pool's LoadedModel in use
        self._static: ModelStatus | None = None
        self._load_lock = asyncio.Lock()
        self._generation: Any = None  # the reply being written

    @property
    def backend(self) -> Backend | None:
        return self._model.backend if self._model is not None else None

    def hardware(self) -> Hardware:
        return self.pool.hardware()

    async def load(self, model: str, n_ctx: int | None = None) -> ModelStatus:
        async with self._load_lock:
            self.pool.options = replace(self.options, n_ctx=n_ctx or self.options.n_ctx)
            # planned before anything is unloaded: a model or context that cannot run leaves
            # the current model in use
            prepared = await self.pool.plan(model)
            from localinfer.service import check_writes_text  # (loaded by the plan)

            check_writes_text(prepared.info, prepared.model.name)
            current = self._model
            if current is not None and current.name == prepared.model.name:
                if current.options.n_ctx == prepared.options.n_ctx:
                    return await self.status()
                await self.pool.unload(current.name)  # the same model, another context
            try:
                self._model = await self.pool.get(model, prepared)
            except LocalinferError:
                # llama.cpp refused it: the chat goes on with the previous model
                self._model = None
                if current is not None:
                    self.pool.options = current.options
                    with contextlib.suppress(LocalinferError):
                        self._model = await self.pool.get(current.name)
                raise
            self._static = self._describe(self._model)
            return await self.status()

    def _describe(self, model: Any) -> ModelStatus:
        from localinfer.service import kv_cache_bytes

        info, options = model.info, model.options
        layers = options.n_gpu_layers or 0
        gpu = next(iter(self.hardware().gpus), None)
        device = "CPU" if not layers else (
            f"{gpu.backend.upper() if gpu else 'GPU'} {min(layers, info.n_layer)}/{info.n_layer} "
            f"layers")
        kv = kv_cache_bytes(info, options)
        return ModelStatus(model.name, info.quant, device, options.n_ctx or 0, kv_bytes=kv,
                           vision=model.backend.info.vision)

    async def check_context(self, model: str, n_ctx: int) -> str | None:
        async with self._load_lock:  # (the pool's options are the load's meanwhile)
            options, self.pool.options = self.pool.options, replace(self.options, n_ctx=n_ctx)
            try:
                await self.pool.plan(model)
            except (LocalinferError, OSError) as exc:
                return user_message(exc)
            finally:
                self.pool.options = options
        return None

    def stop(self) -> bool:
        if self._generation is None:
            return False
        self._generation.cancel()  # the engine ends it within one step, with its figures
        return True

    def _with_usage(self) -> ModelStatus:
        assert self._static is not None and self.backend is not None
        stats = self.backend.stats()
        return replace(self._static, kv_cells_used=stats.kv_cells_used,
                       kv_cells_total=stats.kv_cells_total,
                       memory_bytes=(self._memory or self.backend.memory_bytes)())

    async def status(self) -> ModelStatus | None:
        return await asyncio.to_thread(self._with_usage) if self.backend is not None else None

    async def stream(self, messages: Messages, params: SamplingParams) -> AsyncIterator[Piece]:
        if self.backend is None:
            raise LocalinferError("no model is loaded yet")
        if self._model.backend.ended:  # its runner died: the pool loads it again, planned
            async with self._load_lock:
                self._model = await self.pool.get(self._model.name)
        generation, reader = await asyncio.to_thread(_chat_within_context, self.backend,
                                                     messages, params)
        self._generation = generation
        finished = False
        try:
            async for event in generation.events():
                if isinstance(event, TokenEvent):
                    for piece in reader.feed(event.text):
                        yield Thought(piece.text) if piece.kind == "reasoning" else piece.text
                elif isinstance(event, DoneEvent):
                    finished = True
                    for piece in reader.close():
                        yield Thought(piece.text) if piece.kind == "reasoning" else piece.text
                    yield replace(event.stats.figures(), reasoning_tokens=reader.reasoning_tokens)
                elif isinstance(event, ErrorEvent):
                    finished = True
                    raise event.error
        finally:
            self._generation = None
            if not finished:  # the worker was cancelled: free the slot within one step
                generation.cancel()

    async def models(self) -> list[ModelRow]:
        return await asyncio.to_thread(local_rows, self.settings, self.hardware(),
                                       self.options.n_ctx or self.settings.ctx)

    async def pull(self, name: str, progress: PullProgress) -> str:
        from localinfer.service import pull_model

        got = await asyncio.to_thread(pull_model, name, self.settings, progress)
        return got.name

    async def delete(self, name: str) -> None:
        from localinfer.installed import delete_model, is_embedded

        if not is_embedded(name) and self._model is not None and self._model.name == name:
            raise LocalinferError(f"{name} is in use — switch to another model first")
        await asyncio.to_thread(delete_model, self.settings.models_dir, name)

    async def close(self) -> None:
        self._model = None
        await self.pool.close()


def _chat_within_context(backend: Backend, messages: Messages, params: SamplingParams):
    """A conversation longer than the context leaves its oldest turns out (the system
    prompt stays; a turn's pictures go with it), as `localinfer run` does. The generation
    and its reply's parser."""
    from localinfer.repl import fit_to_context, reply_room, split_pictures, user_message

    turns = [user_message(m["content"], [p.image() for p in m["pictures"]])
             if m.get("pictures") else {k: v for k, v in m.items() if k != "pictures"}
             for m in messages]
    fitted, _ = fit_to_context(backend, turns, reply_room(backend, params))
    plain, images = split_pictures(fitted)
    return start_chat(backend, params, plain, None, images)


# ---------------------------------------------------------------------------- remote
class RemoteClient(ChatClient):
    """A running `localinfer serve`, through its OpenAI and Ollama routes."""

    def __init__(self, url: str, api_key: str | None = None):
        self.where = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=self.where, headers=headers,
                                      timeout=httpx.Timeout(10.0, read=None))
        self.model: str | None = None
        self._static: ModelStatus | None = None

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise LocalinferError(f"no answer from {self.where} ({exc.__class__.__name__}) — "
                                  f"start one with `localinfer serve`") from None
        if response.status_code >= 400:
            raise LocalinferError(_error_text(response))
        return response

    async def load(self, model: str, n_ctx: int | None = None) -> ModelStatus:
        model = model or await self._server_model()
        await self._call("POST", "/api/generate", json={"model": model, "prompt": "",
                                                        "stream": False})
        ps = (await self._call("GET", "/api/ps")).json().get("models", [])
        entry = next((m for m in ps if m["name"] == model), None) or next(
            (m for m in ps if m["name"].startswith(model + ":")), ps[0] if ps else {})
        self.model = entry.get("name", model)
        self._static = ModelStatus(
            self.model, entry.get("details", {}).get("quantization_level", "?"),
            "GPU" if entry.get("size_vram") else "CPU", entry.get("context_length") or 0,
            vision=await self._vision(self.model))
        return await self.status() or self._static

    async def _vision(self, model: str) -> bool | None:
        """Whether the server's /api/show lists "vision" for the model (None: no answer)."""
        try:
            shown = (await self._call("POST", "/api/show", json={"model": model})).json()
        except (LocalinferError, ValueError):
            return None
        capabilities = shown.get("capabilities") if isinstance(shown, dict) else None
        return "vision" in capabilities if isinstance(capabilities, list) else None

    async def _server_model(self) -> str:
        """No model named (`localinfer chat --url URL`): the one the server has loaded, else
        the default model if it offers it, else the first it offers."""
        loaded = (await self._call("GET", "/api/ps")).json().get("models", [])
        if loaded:
            return loaded[0]["name"]
        tags = (await self._call("GET", "/api/tags")).json().get("models", [])
        offered = [m["name"] for m in tags]
        if not offered:
            raise LocalinferError(f"{self.where} offers no model — pull one there first")
        return DEFAULT_MODEL if DEFAULT_MODEL in offered else offered[0]

    async def status(self) -> ModelStatus | None:
        if self._static is None:
            return None
        from prometheus_client.parser import text_string_to_metric_families

        try:
            text = (await self._call("GET", "/metrics")).text
        except LocalinferError:
            return self._static
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels.get("model") == self.model:
                    found[sample.name] = sample.value
        used, total = found.get("localinfer_kv_cells_used"), found.get("localinfer_kv_cells")
        return replace(self._static, kv_cells_used=None if used is None else int(used),
                       kv_cells_total=None if total is None else int(total))

    async def check_context(self, model: str, n_ctx: int) -> str | None:
        served = self._static.n_ctx if self._static else None
        if served and n_ctx != served:
            return (f"the server gives each chat {served} tokens; change it with "
                    f"`localinfer serve --ctx N`")
        return None

    async def stream(self, messages: Messages, params: SamplingParams) -> AsyncIterator[Piece]:
        body = {"model": self.model, "messages": [_openai(m) for m in messages], "stream": True,
                "temperature": params.temperature, "top_p": params.top_p,
                "max_tokens": params.max_tokens, "seed": params.seed}
        try:
            async with self.http.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise LocalinferError(_error_text(response))
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    for choice in chunk.get("choices", []):
                        delta = choice.get("delta", {})
                        if delta.get("reasoning_content"):
                            yield Thought(delta["reasoning_content"])
                        if delta.get("content"):
                            yield delta["content"]
                    if "timings" in chunk:
                        finish = (chunk.get("choices") or [{}])[0].get("finish_reason")
                        yield Figures.from_timings(chunk["timings"], finish)
        except httpx.HTTPError as exc:
            raise LocalinferError(f"the server stopped answering ({exc.__class__.__name__})") \
                from None

    async def models(self) -> list[ModelRow]:
        tags = (await self._call("GET", "/api/tags")).json().get("models", [])
        return [ModelRow(m["name"], True, m.get("details", {}).get("quantization_level", ""),
                         m.get("size"), "server", "runs on the server") for m in tags]

    async def pull(self, name: str, progress: PullProgress) -> str:
        async with self.http.stream("POST", "/api/pull", json={"model": name}) as response:
            if response.status_code >= 400:
                await response.aread()
                raise LocalinferError(_error_text(response))
            async for line in response.aiter_lines():
                status = json.loads(line) if line.strip() else {}
                if "error" in status:
                    raise LocalinferError(status["error"])
                progress(status.get("completed", 0), status.get("total"))
        return name

    async def delete(self, name: str) -> None:
        await self._call("DELETE", "/api/delete", json={"model": name})

    async def close(self) -> None:
        await self.http.aclose()


def _openai(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as OpenAI's chat takes it: pictures as `image_url` parts before the text
    (data URLs of the kept files: the server decodes the same pixels)."""
    out = {k: v for k, v in message.items() if k != "pictures"}
    if message.get("pictures"):
        out["content"] = [*({"type": "image_url", "image_url": {"url": p.data_url()}}
                            for p in message["pictures"]),
                          {"type": "text", "text": message["content"]}]
    return out


def _error_text(response: httpx.Response) -> str:
    with contextlib.suppress(ValueError):
        body = response.json()
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("message", error))
        if error:
            return str(error)
    return f"the server answered {response.status_code}"
