"""The one internal chat/generate path; the OpenAI and Ollama routes only convert shapes.

`start()` does everything that can fail with a 4xx — name check, load, template, queue —
before any byte of a response is sent, and hands back a `Job` whose events the route
streams or collects. Leaving the job's event stream early (a client that disconnects)
cancels the request in the engine, which frees its slot within one step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from localinfer.api.errors import ApiError
from localinfer.api.images import Remote, decode_all
from localinfer.api.tools import ToolSpec
from localinfer.backends.base import (SAMPLING_BOUNDS, Backend, DoneEvent, ErrorEvent, Event,
                                     Generation, Logprob, SamplingParams)
from localinfer.chat_formats.detect import ChatFormat, detect
from localinfer.chat_formats.parser import ReplyParser, parser
from localinfer.chat_formats.prompt import (newest_that_fit, opens_reasoning, think_limit,
                                            with_thinking)
from localinfer.chat_formats.reply import Piece, Reply
from localinfer.chat_formats.fim import Infill, infill_prompt
from localinfer.backends.metrics import RequestStats
from localinfer.backends.base import Image
from localinfer.errors import Cancelled, InvalidRequest, PromptTooLong
from localinfer.pool import LoadedModel, ModelPool

__all__ = ["Job", "Lenient", "OpenAISampling", "check_completes", "check_embeds",
           "check_model_name", "count", "logprob_entries", "read_while_there", "sampling_field",
           "shortened", "start"]

_T = TypeVar("_T")


class Lenient(BaseModel):
    """A request body of either dialect: clients send fields we do not use, and that is fine."""

    model_config = ConfigDict(extra="allow")


class NullsUnsent(Lenient):
    """A body where a field sent as null is as if unsent: OpenAI's spec marks its fields
    nullable, and Go's JSON reader leaves Ollama's at their defaults, so a client that sends
    its unset fields as null (LangChain's options) gets the defaults, not a 400 for each."""

    @model_validator(mode="before")
    @classmethod
    def _nulls_unsent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


def sampling_field(name: str, default: Any) -> Any:
    """A request's field for the sampling parameter `name`, under its one rule
    (`SAMPLING_BOUNDS`), the same in every dialect: out of it, a 400 naming the field."""
    bound = SAMPLING_BOUNDS[name]
    low = {"gt": bound.low} if bound.above else {"ge": bound.low}
    finite = {} if bound.whole else {"allow_inf_nan": False}
    return Field(default, le=bound.high, description=bound.means or None, **low, **finite)


class OpenAISampling(NullsUnsent):
    """The sampling fields of an OpenAI-shaped request (chat, completions, responses):
    OpenAI's own, and llama-server's that it takes in each of them (top_k, min_p,
    repeat_penalty, logit_bias, grammar)."""

    model: str = Field("", max_length=200)
    temperature: float = sampling_field("temperature", 1.0)
    top_p: float = sampling_field("top_p", 1.0)
    top_k: int = sampling_field("top_k", 40)
    min_p: float = sampling_field("min_p", 0.05)
    repeat_penalty: float = sampling_field("repeat_penalty", 1.0)
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = sampling_field("seed", None)
    presence_penalty: float = sampling_field("presence_penalty", 0.0)
    frequency_penalty: float = sampling_field("frequency_penalty", 0.0)
    logit_bias: Optional[dict[str, float]] = None
    # a GBNF grammar the reply must follow (bounded as any grammar is)
    grammar: Optional[str] = Field(None, max_length=512 * 1024)

    def params(self, max_tokens: int | None, grammar: str | None = None,
               logprobs: int | None = None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        bias = {}
        for token, value in (self.logit_bias or {}).items():
            if not token.lstrip("-").isdigit():
                raise ApiError(400, f"logit_bias keys must be token ids, not '{token[:40]}'")
            bias[int(token)] = value
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            min_p=self.min_p, repeat_penalty=self.repeat_penalty, seed=self.seed,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            max_tokens=max_tokens, stop=tuple(stop), logit_bias=bias, grammar=grammar,
            logprobs=logprobs,
        )


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-/:]{0,199}")


def check_model_name(name: str | None) -> str | None:
    """A model name from a request: never a filesystem path, never outside the store."""
    if not name:
        return None
    if not _NAME.fullmatch(name) or ".." in name or name.lower().endswith(".gguf"):
        raise ApiError(400, f"'{name[:80]}' is not a valid model name — use a name such as "
                            f"smollm2:135m (see /api/tags or /v1/models)")
    return name


@dataclass
class Job:
    model: LoadedModel
    generation: Generation
    prompt_tokens: int
    started: float  # when the request reached us, for Ollama's total_duration
    load_duration: float
    tools: ToolSpec | None = None
    _release: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    stats: RequestStats | None = None
    prompt_ids: list[int] = field(default_factory=list)  # (Ollama returns them: `context`)
    fmt: ChatFormat | None = None  # how the model writes calls and reasoning (a chat)
    reasoning: bool = False  # the prompt opened a reasoning block the reply continues
    continued: bool = False  # the reply goes on from a prefix the request gave (_prefix)
    # TTFT as the client sees it (backends/metrics.py): the token of the last event read,
    # and the first token whose text, or a piece parsed from it, went out
    _token: int = 0
    _shown: int | None = None
    # the written tokens' log probabilities so far, where the request asked for them
    logprobs: list[Logprob] = field(default_factory=list)

    def parser(self) -> ReplyParser | None:
        """A parser of this chat's reply into content, reasoning and calls (None for a
        plain completion, whose text is all content). What it gives out first marks the
        token the client was first shown."""
        if self.fmt is None:
            return None
        return _Shown(parser(self.fmt, self.tools.by_name if self.tools else None,
                             self.reasoning, self.continued), self)

    def shown(self) -> None:
        """The client is shown something of the reply now (the first time counts)."""
        if self._shown is None:
            self._shown = self._token
            if self.stats is not None:  # (shown only as the reply ended)
                self.stats.shown_from = self._shown

    async def events(self) -> AsyncIterator[Event]:
        finished = False
        try:
            async for event in self.generation.events():
                if isinstance(event, DoneEvent):
                    self.stats = event.stats
                    if self._shown is not None:
                        self.stats.shown_from = self._shown
                    finished = True
                elif isinstance(event, ErrorEvent):
                    finished = True
                else:
                    self.logprobs += event.logprobs
                    if event.index >= 0:
                        self._token = event.index
                        if self.fmt is None and event.text:  # a completion's text goes out
                            self.shown()  # as it is
                yield event
        finally:
            if not finished:
                self.generation.cancel()
            await self._release.aclose()

    async def cancel(self) -> None:
        """Give up on a job whose events nobody will read."""
        self.generation.cancel()
        await self._release.aclose()

    async def read(self) -> tuple[Reply, RequestStats, int]:
        """A whole chat reply, taken apart as it streamed: content, reasoning and calls, the
        numbers, and how many of its tokens were reasoning."""
        reader = self.parser()
        pieces: list[Piece] = []
        async for event in self.events():
            if isinstance(event, ErrorEvent):
                raise event.error
            if not isinstance(event, DoneEvent):
                pieces += reader.feed(event.text)
        pieces += reader.close()
        return Reply.of(pieces), self.stats, reader.reasoning_tokens

    async def collect(self) -> tuple[str, RequestStats]:
        pieces = []
        async for event in self.events():
            if isinstance(event, ErrorEvent):
                raise event.error
            if not isinstance(event, DoneEvent):
                pieces.append(event.text)
        return "".join(pieces), self.stats


async def start(
    pool: ModelPool,
    model: str | None,
    params: SamplingParams,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    prompt: str | Sequence[int] | None = None,
    keep_alive: str | float | None = None,
    tools: ToolSpec | None = None,
    plain_without_template: bool = False,
    n_ctx: int | None = None,
    context: Sequence[int] | None = None,
    template_args: Mapping[str, Any] | None = None,
    infill: Infill | None = None,
    images: Sequence[bytes | Remote] = (),
    think_budget: int | None = None,
    truncate: bool = False,
) -> Job:
    """Load (or wait for) the model, build the prompt, queue the request.
    truncate: a chat past the context loses its oldest messages rather than being refused
    (Ollama's default: _drop_oldest)
    think_budget: the most tokens its reasoning block may take (backends/engine/think_budget.py),
    for a family that marks reasoning with tags.
    A request that sets no limit gets the model's reply cap (in its engine: SamplingParams.
    capped); its reply still ends sooner if the context fills, as does one whose limit is
    past the context. plain_without_template:
    a model whose file has no chat template (a base model) gets the messages' text as it
    is, not wrapped in a family's turns (Ollama's /api/generate: a template of `{{ .Prompt }}`)."""
    began = time.monotonic()
    # (each bounded before it is decoded; those named by URL fetched if the settings say so:
    # api/images.py)
    pictures = await decode_all(images, pool.settings.image_urls)
    stack = contextlib.AsyncExitStack()
    try:
        was_loaded = pool.loaded()  # (the models themselves: one loaded again is new)
        loaded = await stack.enter_async_context(pool.use(check_model_name(model), keep_alive,
                                                          n_ctx))
        check_completes(loaded)
        backend = loaded.backend  # (a max_tokens past the context is taken, as llama-server
        # takes it: the reply ends when the context fills; agents ask for 32,000 or 64,000)
        if (messages is not None and plain_without_template and not pictures
                and not backend.info.has_chat_template):  # (images need the turn format's place)
            messages, prompt = None, "\n\n".join(m["content"] for m in messages)
        fmt = chat_format(backend) if messages is not None else None
        if infill is not None:
            if not backend.info.fim:
                raise ApiError(400, f"{loaded.name} has no fill-in-the-middle tokens, so it "
                                    f"cannot complete between a prefix and a suffix — use a "
                                    f"code model such as qwen2.5-coder")
            prompt = await asyncio.get_running_loop().run_in_executor(
                _STARTS, infill_prompt, backend, params, infill)
        # templating and tokenizing a long body takes seconds, and a runner answers over its
        # pipe: off the loop, which keeps serving every other stream meanwhile
        if pictures and not backend.info.vision:
            raise ApiError(400, f"{loaded.name} takes no images — send text only, or use a "
                                f"vision model")
        if think_budget is not None and fmt is not None:  # (its marks tokenized once a model)
            limit = await asyncio.get_running_loop().run_in_executor(
                _STARTS, think_limit, backend, fmt, think_budget)
            params = dataclasses.replace(params, think=limit) if limit else params
        prompt_ids, generation, reasoning = await _queue(backend, params, messages, prompt,
                                                         tools, context, fmt, template_args,
                                                         pictures, truncate)
        if pool.closing:  # a shutdown began as it was queued, after its engine was told
            generation.cancel()
            pool.check_open()
    except BaseException:
        await stack.aclose()
        raise
    load = 0.0 if any(m is loaded for m in was_loaded) else loaded.load_duration
    return Job(loaded, generation, len(prompt_ids), began, load, tools, stack,
               prompt_ids=prompt_ids, fmt=fmt, reasoning=reasoning,
               continued=_continues(messages, pictures, context))


def check_completes(loaded: LoadedModel) -> None:
    """A 400 for a model that only embeds or only scores documents: what it would write is
    not text (a BERT one has no output layer at all), so it takes no chat or completion."""
    info = loaded.info
    if info.rerank or info.embedding:
        kind, route = (("a reranker", "/v1/rerank") if info.rerank
                       else ("an embedding model", "/v1/embeddings or /api/embed"))
        raise ApiError(400, f'"{loaded.name}" does not support chat or completion: it is '
                            f"{kind} — send its requests to {route}")


def check_embeds(loaded: LoadedModel) -> None:
    """A 400 for a reranker asked to embed: it scores a query and a document together and
    has no embedding of a text alone (llama-server refuses it too)."""
    if loaded.info.rerank:
        raise ApiError(400, f'"{loaded.name}" does not support embeddings: it is a reranker '
                            f"— send its requests to /v1/rerank")


async def count(pool: ModelPool, model: str | None, messages: Sequence[Mapping[str, Any]],
                tools: ToolSpec | None = None, template_args: Mapping[str, Any] | None = None,
                images: Sequence[bytes | Remote] = ()) -> int:
    """How many tokens the messages take as a request's prompt: the same template, tools
    and pictures as `start` renders them (Anthropic's count_tokens, OpenAI's input_tokens)."""
    pictures = await decode_all(images, pool.settings.image_urls)
    async with pool.use(check_model_name(model)) as loaded:
        backend = loaded.backend
        if pictures and not backend.info.vision:
            raise ApiError(400, f"{loaded.name} takes no images — send text only, or use a "
                                f"vision model")
        return await asyncio.get_running_loop().run_in_executor(
            _STARTS, _prompt_length, backend, chat_format(backend), messages, tools,
            template_args, pictures)


def _prompt_length(backend: Backend, fmt: ChatFormat, messages: Sequence[Mapping[str, Any]],
                   tools: ToolSpec | None, template_args: Mapping[str, Any] | None,
                   pictures: Sequence[Image]) -> int:
    """The tokens of the messages as a request's prompt, with its tools and thinking switch,
    as `start` renders them (one trip to the runner; a prefilled reply, two)."""
    args = with_thinking(fmt, template_args) or {}
    if tools is not None:
        messages, _, more = tools.prepare(messages, SamplingParams(), fmt,
                                          bool(args.get("enable_thinking")))
        args.update(more)
    if _continues(messages, pictures):
        return len(backend.tokenize(_prefilled(backend, messages, args or None)))
    return len(backend.prompt_tokens(messages, args or None, pictures))


def _prefix(messages: Sequence[Mapping[str, Any]] | None) -> str | None:
    """The start of the reply, where the last message is the assistant's marked `prefix`
    (Mistral's and DeepSeek's word; the Anthropic and Ollama dialects mark a last assistant
    message so, as those services continue one): the reply goes on from its text."""
    last = messages[-1] if messages else None
    if (last is None or last.get("role") != "assistant" or not last.get("prefix")
            or last.get("tool_calls")):
        return None
    return "".join(_texts(last.get("content")))


def _continues(messages: Sequence[Mapping[str, Any]] | None, images: Sequence[Any],
               context: Sequence[int] | None = None) -> bool:
    """Whether the reply goes on from the last message's text (_prefilled): not with
    pictures, whose places only the template's own turns hold, nor after a `context`."""
    return not images and not context and _prefix(messages) is not None


def _prefilled(backend: Backend, messages: Sequence[Mapping[str, Any]],
               template_args: Mapping[str, Any] | None) -> str:
    """The prompt of a reply that goes on from its prefix: the turns before it in the
    template, the assistant's turn opened, then the prefix's text (as llama-server
    prefills one)."""
    return (backend.apply_chat_template(messages[:-1], True, template_args)
            + (_prefix(messages) or ""))


class _Shown:
    """A reply's parser that tells its job when it first gives something out."""

    def __init__(self, reader: ReplyParser, job: Job):
        self._reader, self._job = reader, job

    @property
    def reasoning_tokens(self) -> int:
        return self._reader.reasoning_tokens

    def feed(self, text: str) -> list[Piece]:
        return self._said(self._reader.feed(text))

    def close(self) -> list[Piece]:
        return self._said(self._reader.close())

    def _said(self, pieces: list[Piece]) -> list[Piece]:
        if pieces:
            self._job.shown()
        return pieces


def logprob_entries(written: Sequence[Logprob]) -> list[dict[str, Any]]:
    """Tokens' log probabilities as OpenAI's chat API gives them (Ollama's are the same):
    each token's text, its log probability and bytes, and the likeliest tokens'."""
    return [{"token": text.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(text),
             "top_logprobs": [{"token": t.decode("utf-8", "replace"), "logprob": lp,
                               "bytes": list(t)} for _, t, lp in top]}
            for _, text, logprob, top in written]


def sse(data: Mapping[str, Any] | str) -> str:
    """One server-sent event of JSON data (or a bare word such as OpenAI's [DONE])."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def unless_gone(request: Any, awaitable: Any) -> Any:
    """The awaitable's result, or None when the client hangs up first: then it is cancelled
    (a job's request leaves the engine within one step). Editors give up on most completions
    they ask for, one keystroke later."""
    task = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def shortened(vectors: list[list[float]], dimensions: int | None) -> list[list[float]]:
    """Each vector's first `dimensions` numbers, normalised again (OpenAI's `dimensions`,
    Ollama's: a Matryoshka-trained model's shorter embedding); a 400 past the model's own."""
    if dimensions is None:
        return vectors
    if vectors and dimensions > len(vectors[0]):
        raise ApiError(400, f"dimensions {dimensions} is more than this model's "
                            f"{len(vectors[0])} — ask for {len(vectors[0])} or fewer")
    out = []
    for vector in vectors:
        cut = vector[:dimensions]
        norm = math.sqrt(sum(x * x for x in cut)) or 1.0
        out.append([x / norm for x in cut])
    return out


async def read_while_there(request: Any, read: Callable[..., _T], *args: Any) -> _T:
    """`read(*args, stop)` on a thread (an embedding's or a ranking's reads): its result, or
    Cancelled once the client has hung up — then `stop` is set, and the runner ends the read
    at its next decode rather than keep the model's reads busy for nobody."""
    stop = threading.Event()
    done = await unless_gone(request, asyncio.to_thread(read, *args, stop))
    if done is None:
        stop.set()
        raise Cancelled("the client went away: the read stopped")
    return done


async def _disconnected(request: Any) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def chat_format(backend: Backend) -> ChatFormat:
    """How this model's template writes calls and reasoning."""
    return _detect(backend.info.chat_template)


@functools.lru_cache(maxsize=16)
def _detect(source: str | None) -> ChatFormat:
    return detect(source)


async def _queue(backend: Backend, params: SamplingParams,
                 messages: Sequence[Mapping[str, Any]] | None, prompt: str | Sequence[int] | None,
                 tools: ToolSpec | None, context: Sequence[int] | None,
                 fmt: ChatFormat | None, template_args: Mapping[str, Any] | None,
                 images: Sequence[Image] = (), truncate: bool = False
                 ) -> tuple[list[int], Generation, bool]:
    """The prompt's tokens, the request queued with it, and whether the prompt opened a
    reasoning block, in one trip off the loop. A caller cancelled meanwhile (a client gone)
    cancels the request once queued."""
    queued = asyncio.get_running_loop().run_in_executor(
        _STARTS, _start, backend, params, messages, prompt, tools, context, fmt, template_args,
        images, truncate)
    try:
        return await asyncio.shield(queued)
    except asyncio.CancelledError:
        queued.add_done_callback(_cancel_queued)
        raise


# threads of their own for the trips to the runners: a runner that hangs or restarts holds its
# requests' threads until its watchdog or its load ends, and the loop's default pool (a few
# threads) also plans loads and answers /metrics
_STARTS = ThreadPoolExecutor(64, thread_name_prefix="localinfer-start")


def _cancel_queued(queued: asyncio.Future[tuple[list[int], Generation, bool]]) -> None:
    if not queued.cancelled() and queued.exception() is None:
        queued.result()[1].cancel()


def _start(backend: Backend, params: SamplingParams,
           messages: Sequence[Mapping[str, Any]] | None, prompt: str | Sequence[int] | None,
           tools: ToolSpec | None, context: Sequence[int] | None = None,
           fmt: ChatFormat | None = None, template_args: Mapping[str, Any] | None = None,
           images: Sequence[Image] = (), truncate: bool = False
           ) -> tuple[list[int], Generation, bool]:
    try:
        tokens, generation = _begin(backend, params, messages, prompt, tools, context, fmt,
                                    template_args, images)
    except PromptTooLong as too_long:
        fitted = truncate and not context and _drop_oldest(
            too_long.n_ctx, backend, params, messages, tools, fmt, template_args, images)
        if not fitted:
            raise
        tokens, generation = fitted
    try:
        return tokens, generation, opens_reasoning(backend, fmt, tokens)
    except BaseException:
        generation.cancel()
        raise


def _begin(backend: Backend, params: SamplingParams,
           messages: Sequence[Mapping[str, Any]] | None, prompt: str | Sequence[int] | None,
           tools: ToolSpec | None, context: Sequence[int] | None,
           fmt: ChatFormat | None, template_args: Mapping[str, Any] | None,
           images: Sequence[Image] = ()) -> tuple[list[int], Generation]:
    _refuse_by_size(backend, messages, prompt)
    template_args = with_thinking(fmt, template_args) or {}
    if messages is not None and tools is not None:
        messages, params, more = tools.prepare(messages, params, fmt or chat_format(backend),
                                               bool(template_args.get("enable_thinking")))
        template_args.update(more)
    if _continues(messages, images, context):
        messages, prompt = None, _prefilled(backend, messages, template_args or None)
    if context:  # a conversation so far, as tokens (Ollama's /api/generate `context`): the
        # new text goes on after it without a beginning-of-text token
        if images:
            raise InvalidRequest("images cannot follow a `context` — send the conversation "
                                 "as /api/chat messages")
        if len(context) >= backend.info.n_ctx:  # (before a long list crosses to the runner)
            raise PromptTooLong(len(context), backend.info.n_ctx)
        text = (backend.apply_chat_template(messages, True, template_args or None)
                if messages is not None else prompt)
        more = (backend.tokenize(text, add_special=False) if isinstance(text, str)
                else list(text or ()))
        tokens = [*context, *more]
        return tokens, backend.generate(tokens, params)
    return backend.start(params, messages, prompt, template_args or None, images)


def _drop_oldest(n_ctx: int, backend: Backend, params: SamplingParams,
                 messages: Sequence[Mapping[str, Any]] | None, tools: ToolSpec | None,
                 fmt: ChatFormat | None, template_args: Mapping[str, Any] | None,
                 images: Sequence[Image]) -> tuple[list[int], Generation] | None:
    """A chat past the context with its oldest messages left out until it fits, as Ollama
    cuts one (newest_that_fit); the reply then goes on with the context shifting
    (SamplingParams.context_shift). Each try is a count of tokens, as count_tokens makes;
    only cuts whose text could fit by its bytes are tried (as _refuse_by_size bounds a
    prompt). None: not even the last message fits."""
    if messages is None or len(messages) < 2:
        return None
    pictures = _pictures_of(messages, images)
    sizes = [_bytes(m.get("content")) for m in messages]
    per = backend.fewest_tokens(1 << 30)  # (linear in the bytes: one trip for the rate)
    fmt = fmt or chat_format(backend)

    def fits(at: list[int]) -> bool:
        return _prompt_length(backend, fmt, [messages[i] for i in at], tools, template_args,
                              [p for i in at for p in pictures[i]]) < n_ctx

    at = newest_that_fit(messages, fits, sizes, (n_ctx << 30) // per if per else None)
    if at is None:
        return None
    return _begin(backend, params, [messages[i] for i in at], None, tools, None, fmt,
                  template_args, [p for i in at for p in pictures[i]])


def _pictures_of(messages: Sequence[Mapping[str, Any]], images: Sequence[Image]
                 ) -> list[list[Image]]:
    """Each message's pictures: `images` are in the order of the messages' image parts."""
    left = iter(images)
    return [[next(left) for part in m.get("content") or () if isinstance(m.get("content"), list)
             and isinstance(part, Mapping) and part.get("type") == "image"] for m in messages]


def _refuse_by_size(backend: Backend, messages: Sequence[Mapping[str, Any]] | None,
                    prompt: str | Sequence[int] | None) -> None:
    """A text too big for the context is refused before it is templated and tokenized: 100,000
    messages (2.4 MB) kept a thread tokenizing for minutes after the client had gone."""
    size = (_bytes(prompt) if isinstance(prompt, str) else
            sum(_bytes(m.get("content")) for m in messages or ()))
    n_ctx = backend.info.n_ctx
    if size > n_ctx:  # (fewest_tokens(size) <= size: a smaller text is never refused here)
        fewest = backend.fewest_tokens(size)
        if fewest > n_ctx:
            raise PromptTooLong(fewest, n_ctx, at_least=True)


def _bytes(content: Any) -> int:
    """A message's text (or a prompt) in UTF-8 bytes, what bounds its tokens from below."""
    return sum(len(t.encode("utf-8", "surrogatepass")) for t in _texts(content))


def _texts(content: Any) -> list[str]:
    """A message's text: its content, or its text parts (a message with images)."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p.get("text"), str)]
    return []

