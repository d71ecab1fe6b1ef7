"""The `Backend` interface and the dataclasses that cross the engine boundary."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import queue
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from localinfer.backends.metrics import EngineStats, RequestStats
from localinfer.chat_formats.think import ThinkLimit
from localinfer.errors import Cancelled, InvalidRequest, LocalinferError
from localinfer.settings import KvType, Settings

__all__ = [
    "MAX_LOGPROBS",
    "SAMPLING_BOUNDS",
    "Backend",
    "Bound",
    "DoneEvent",
    "ErrorEvent",
    "Logprob",
    "Event",
    "Generation",
    "Image",
    "LoadOptions",
    "ModelInfo",
    "SamplingParams",
    "TokenEvent",
    "is_image",
    "stopped",
]


_INT32 = 2**31 - 1
_FLOAT32 = 3.4028234663852886e38  # llama.cpp reads the samplers' numbers as 32-bit floats


def stopped(stop: threading.Event | None) -> None:
    """Cancelled once `stop` is set: the caller of a long read (embeddings, a ranking) has
    gone, and the requests behind it should not wait for what nobody will read."""
    if stop is not None and stop.is_set():
        raise Cancelled("the caller went away: the read stopped")


@dataclass(frozen=True)
class Image:
    """A decoded picture: RGB bytes, row by row (what the server hands a runner); in a
    prompt, a run of its placeholder id (native/vision.py)."""

    rgb: bytes = field(repr=False)
    width: int
    height: int

    def __post_init__(self) -> None:
        if self.width <= 0 or self.height <= 0 or len(self.rgb) != self.width * self.height * 3:
            raise InvalidRequest("an image's pixels do not match its size")

    @property
    def placeholder(self) -> int:
        """Its ids in a prompt: negative, from its pixels (the same picture, the same ids)."""
        digest = hashlib.blake2b(self.rgb, digest_size=8,
                                 person=f"{self.width}x{self.height}".encode()[:16]).digest()
        return -1 - (int.from_bytes(digest, "little") >> 34)  # in [-2^30, -1]


def is_image(token: int) -> bool:
    """A prompt's id that stands for part of an image, not a vocabulary token."""
    return token < 0


@dataclass(frozen=True)
class Bound:
    """The values one sampling parameter may take: from `low` (itself excluded where
    `above`) to `high`, finite; `whole` for an integer. `means` says what edge values do."""

    low: float
    high: float
    above: bool = False
    whole: bool = False
    means: str = ""

    def holds(self, value: float) -> bool:
        """(NaN holds nowhere: every comparison with it is false.)"""
        return (value > self.low if self.above else value >= self.low) and value <= self.high

    def rule(self, name: str) -> str:
        low = f"more than {self.low:g}" if self.above else f"{self.low:g} or more"
        high = f"at most {self.high:g}" if self.high < _FLOAT32 else "finite"
        return f"{name} must be {low} and {high}" + (f" ({self.means})" if self.means else "")


# Each sampling parameter's one rule, for every dialect of the API (their request fields are
# made from it: api/core.py `sampling_field`), the command line and the chat app alike. Edge
# values as llama.cpp reads them: a top_k of 0 or less is no cut (-1 is vLLM's and
# llama-server's spelling), a seed of -1 a random one (Ollama's default).
SAMPLING_BOUNDS: dict[str, Bound] = {
    "temperature": Bound(0, 2, means="0 is greedy"),
    "top_k": Bound(-_INT32 - 1, _INT32, whole=True, means="0 or less is no cut"),
    "top_p": Bound(0, 1, above=True),
    "min_p": Bound(0, 1),
    "repeat_penalty": Bound(0, _FLOAT32, above=True, means="1 is none"),
    "presence_penalty": Bound(-2, 2),
    "frequency_penalty": Bound(-2, 2),
    "seed": Bound(-1, 2**32 - 1, whole=True, means="-1 is a random one"),
}


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each token and when to stop. temperature 0 means greedy."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    # token id → added to its logit; -100 or less bans it, as in OpenAI's logit_bias
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: str | None = None  # GBNF; the reply must match it (see app/chat_formats/grammar.py)
    # with these, the grammar is lazy: it holds the reply from the first text that matches
    # one of these patterns (its first group on; regular expressions), free before that
    grammar_triggers: tuple[str, ...] = ()
    # when the context fills up: drop the older half (after the first n_keep prompt tokens)
    # and go on, as Ollama does, instead of ending with "length" — only for a request with
    # max_tokens, so no reply can run for ever
    context_shift: bool = False
    n_keep: int = 0
    # code completion (llama-server's n_indent and t_max_predict_ms): a line after the first
    # indented less than this ends the reply before it; past this many seconds since the
    # first token, the reply ends once it has written a newline
    min_indent: int = 0
    line_time_limit: float | None = None
    ignore_eos: bool = False  # the model's end tokens are banned: the reply runs to its limit
    # no max_tokens and capped: the model's reply cap applies (LoadOptions.reply_cap, from
    # LOCALINFER_MAX_TOKENS), and no context shift; not capped: none (Ollama's num_predict
    # -1, `run --max-tokens 0`) — the reply ends with its end token or a full context
    capped: bool = True
    # each written token's log probability, and this many of the likeliest tokens with
    # theirs (OpenAI's top_logprobs, 0 to 20), from the logits it was drawn from, before
    # bias, penalties and temperature: the model's own distribution; None: none (nothing
    # computed, nothing sent)
    logprobs: int | None = None
    # a reasoning budget: the reasoning block is closed after so many tokens (backends/
    # think_budget.py); None: it runs as long as the model writes it
    think: ThinkLimit | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, Mapping) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in bias))
        for name, bound in SAMPLING_BOUNDS.items():
            value = getattr(self, name)
            if value is not None and not bound.holds(value):
                raise InvalidRequest(bound.rule(name))
        object.__setattr__(self, "top_k", max(0, self.top_k))  # 0 or less: no cut
        object.__setattr__(self, "seed", None if self.seed == -1 else self.seed)  # random
        checks = [
            (all(-100 <= b <= 100 for _, b in self.logit_bias),
             "logit_bias values must be in [-100, 100]"),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens must be 1 or more"),
            (self.n_keep >= 0, "n_keep must be 0 or more"),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
             f"top_logprobs must be 0 to {MAX_LOGPROBS}"),
            (self.min_indent >= 0, "n_indent must be 0 or more"),
            (self.line_time_limit is None or self.line_time_limit > 0,
             "t_max_predict_ms must be more than 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequest(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model. n_ctx is per slot; the context holds n_ctx × n_slots tokens."""

    n_ctx: int | None = None
    n_slots: int = 1
    n_batch: int = 512
    prefill_chunk: int | None = None  # prompt tokens per slot per step; None: n_batch
    # while streams generate, a step may take this many decode-only steps' time (prompt
    # tokens are held back to fit); None or 0: prompts go in whole chunks. Off by default:
    # it keeps running streams smooth while a long prompt is read (P99 ITL 3x their median
    # at 2, against 79x) but slows that prompt and, under load, short prompts' TTFT
    # (measured in the issue notes; bench/results/engine_mixed.md)
    step_budget: float | None = None
    # while streams generate, a step may take about this many milliseconds (the longest
    # pause a running stream sees while a prompt is read; step_budget.py); 0: off; None:
    # step_budget.DEFAULT_STEP_MS (250). Where a whole chunk is read faster (a GPU) it
    # never cuts
    step_ms: int | None = None
    # speculative decoding for a lone stream: decode up to this many prompt-lookup guesses
    # with each token and keep those the sampler agrees with (same output); 0 turns it off
    draft_tokens: int = 0
    # guess with this small model of the same family (a GGUF path; names are resolved by the
    # service) instead of prompt lookup; draft_tokens 0 then means 8
    draft_model: str | None = None
    # a vision projector (an mmproj GGUF) that turns images into this model's embeddings
    projector: str | None = None
    # one pool of n_ctx × n_slots cells shared by every request instead of a fixed share
    # each: one long chat may use what idle slots do not need (up to the trained context);
    # requests are admitted by free cells, and when streams outgrow the pool the newest
    # yields its cells and is rebuilt later. Decode is slower with many long contexts (each
    # stream attends over the whole pool), so off by default (measured in the issue notes)
    kv_unified: bool = False
    # past a request's cached prefix, cached runs of at least this many tokens that the
    # prompt repeats after text it dropped are moved into place instead of read again
    # (llama-server's --cache-reuse; an editor's window over a file moving down); 0: off
    cache_reuse: int = 256
    # a hybrid or recurrent model's slot saves its recurrent state at up to this many points
    # of its prompts (near each one's end), and a prompt that leaves the cached sequence
    # before its end goes back to the newest one before it (llama-server's
    # --ctx-checkpoints); 0: off, such a prompt is read again whole
    ctx_checkpoints: int = 32
    # and at most this many MiB of them a slot, in RAM; None: 256, or room for two where one
    # is larger (model_store.shape.checkpoint_cap)
    ctx_checkpoint_mib: int | None = None
    # a slot's sequence is saved in RAM before another request overwrites it, and put back
    # for a prompt that shares more with it than with any slot (llama-server's --cache-ram):
    # at most this many MiB per model, never leaving the machine under 1 GiB free; 0: off
    cache_ram: int = 8192
    # a sliding-window model's windowed layers keep a cell for every token (llama.cpp's
    # swa_full); off: only their window and a micro-batch per slot, and a prompt that leaves
    # the cached one further back than that goes back to a context checkpoint
    swa_full: bool = False
    n_threads: int | None = None
    # without n_threads: a step's threads also leave the cores that other localinfer
    # processes' steps hold now (engine/threads.py's CoreShare)
    core_share: bool = True
    n_gpu_layers: int | None = None  # None: as the fit planner says for this machine
    kv_type: KvType = KvType.F16  # (a plain name such as "q8_0" is taken and made a KvType)
    # the longest reply of a request that sets no limit (SamplingParams.capped); 0: none.
    # None until service.prepare fills in the settings' (LOCALINFER_MAX_TOKENS)
    reply_cap: int | None = None
    flash_attn: bool | None = None  # None: llama.cpp decides; a quantised V cache needs it
    # on several GPUs (the plan's, filled in by service.prepare): "none" puts the offloaded
    # layers on main_gpu alone; "layer" deals them out by tensor_split (a share per GPU
    # index), "row" splits each layer's rows across them
    split_mode: str = "none"
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    # RPC workers whose devices join llama.cpp's before the load (host:port; the plan's
    # tensor_split counts their devices after the GPUs here), and the key they take
    workers: tuple[str, ...] = ()
    worker_key: str | None = field(default=None, repr=False)
    worker_head: str | None = None  # the head's id, for the workers (workers.HEAD)
    # a mixture of experts on a GPU short of memory (the plan's): the layers whose expert
    # tensors (ffn_*_exps) stay in RAM while the rest of each layer is on the GPU
    cpu_experts: tuple[int, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings, n_ctx: int | None = None,
                      n_slots: int = 1) -> LoadOptions:
        """The load options the settings say. n_ctx: a context asked for on the command line;
        None: the setting's, within what the model was trained on (service.prepare)."""
        return cls(n_ctx=n_ctx, n_slots=n_slots, n_threads=settings.threads,
                   core_share=settings.core_share, kv_type=settings.kv_type,
                   flash_attn=settings.flash_attn,
                   prefill_chunk=settings.prefill_chunk, step_budget=settings.step_budget,
                   step_ms=settings.step_ms, draft_tokens=settings.draft,
                   draft_model=settings.draft_model,
                   kv_unified=settings.kv_unified, reply_cap=settings.max_tokens,
                   cache_reuse=settings.cache_reuse, ctx_checkpoints=settings.ctx_checkpoints,
                   ctx_checkpoint_mib=settings.ctx_checkpoint_mib,
                   cache_ram=settings.cache_ram,
                   swa_full=settings.swa_full, split_mode=str(settings.split_mode))

    @property
    def guesses(self) -> int:
        """Guesses a lone stream decodes per step: draft_tokens, 8 with a draft model."""
        return self.draft_tokens or (8 if self.draft_model else 0)

    @property
    def n_outputs(self) -> int:
        """Logits one step asks for at most: one per slot, or a lone stream's token and its
        guesses: the rows of llama.cpp's output buffer. Its compute buffer is reserved for
        this many, not for a whole batch (gemma3, 262k vocabulary: 21 MiB instead of 514),
        and without flash attention for at least PLAIN_ATTENTION_OUTPUTS
        (model_store.planner.reserved_outputs)."""
        return max(self.n_slots, 1 + self.guesses)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kv_type", KvType(self.kv_type))
        except ValueError:
            *others, last = KvType
            raise InvalidRequest(f"KV cache type must be {', '.join(others)} or {last}, not "
                                 f"{self.kv_type!r}") from None
        if self.step_budget is not None and self.step_budget != 0 and self.step_budget <= 1:
            raise InvalidRequest("the step budget is a multiple of a decode step: more than 1 "
                                 "(or 0 to turn it off)")
        if self.cache_reuse < 0:
            raise InvalidRequest("cache reuse is a count of tokens: 0 (off) or more")
        if self.ctx_checkpoints < 0:
            raise InvalidRequest("context checkpoints are a count per slot: 0 (off) or more")
        if self.ctx_checkpoint_mib is not None and self.ctx_checkpoint_mib < 1:
            raise InvalidRequest("the context checkpoints' cap is MiB per slot: 1 or more")
        if self.cache_ram < 0:
            raise InvalidRequest("the saved prompts' cap is MiB: 0 (off) or more")
        if not 0 <= self.draft_tokens <= 64:
            raise InvalidRequest("draft tokens must be between 0 (off) and 64")
        if self.split_mode not in ("none", "layer", "row"):
            raise InvalidRequest(f"split mode must be layer or row, not {self.split_mode!r}")
        if self.kv_type != "f16" and self.flash_attn is False:
            raise InvalidRequest("a quantised KV cache needs flash attention — drop --no-flash-attn")


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: str
    architecture: str
    quant: str
    n_ctx: int
    n_ctx_train: int
    n_slots: int
    n_params: int
    size_bytes: int
    # the file carries its own chat template (else a family's turn format stands in: a base
    # model, whose plain completions must not be wrapped in turns it never learned)
    has_chat_template: bool = True
    reply_cap: int | None = None  # the longest reply of a request that sets no limit
    # the chat template in use (the file's, or the family's stand-in): how its family writes
    # tool calls and reasoning is read from it (chat_formats/detect.py)
    chat_template: str | None = None
    fim: bool = False  # the vocabulary has fill-in-the-middle tokens (app/chat_formats/fim.py)
    vision: bool = False  # a projector beside it takes images (backends/native/vision.py)


MAX_LOGPROBS = 20  # likeliest tokens a request may ask for at each step (OpenAI's limit)

# one written token's log probability: (its id, its bytes, its logprob, the likeliest tokens
# as (id, bytes, logprob), best first); plain tuples, cheap over a runner's pipe
Logprob = tuple[int, bytes, float, tuple[tuple[int, bytes, float], ...]]


@dataclass(frozen=True)
class TokenEvent:
    text: str
    token: int
    # the reply's token it came with: its place in RequestStats.token_times (text held back
    # a while, by a stop string's first characters, comes with a later token); -1: unknown
    index: int = -1
    # the log probabilities of the tokens whose text this is (SamplingParams.logprobs), in
    # order; () where none were asked for
    logprobs: tuple[Logprob, ...] = ()


@dataclass(frozen=True)
class DoneEvent:
    stats: RequestStats


@dataclass(frozen=True)
class ErrorEvent:
    error: LocalinferError


Event = Union[TokenEvent, DoneEvent, ErrorEvent]


@dataclass
class Generation:
    """A running request: iterate it for events; `cancel()` stops it within one step."""

    id: int
    _events: queue.SimpleQueue[Event] = field(default_factory=queue.SimpleQueue, repr=False)
    _on_cancel: Callable[[], None] = field(default=lambda: None, repr=False)
    cancelled: bool = False
    stats: RequestStats | None = None
    _sink_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _async_sink: Callable[[Event], None] | None = field(default=None, repr=False)

    def put(self, event: Event) -> None:
        with self._sink_lock:
            if self._async_sink is not None:
                self._async_sink(event)
            else:
                self._events.put(event)

    def cancel(self) -> None:
        self.cancelled = True
        self._on_cancel()

    def __iter__(self) -> Iterator[Event]:
        while True:
            try:  # a short timeout keeps Ctrl-C responsive in the consuming thread
                event = self._events.get(timeout=0.1)
            except queue.Empty:
                continue
            yield event
            if isinstance(event, DoneEvent):
                self.stats = event.stats
                return
            if isinstance(event, ErrorEvent):
                return

    async def events(self) -> AsyncIterator[Event]:
        """The same events for asyncio code, without holding a thread per request."""
        inbox: asyncio.Queue[Event] = asyncio.Queue()
        post = _LoopPost.of(asyncio.get_running_loop())

        def sink(event: Event) -> None:
            post(inbox, event)

        with self._sink_lock:
            while not self._events.empty():
                inbox.put_nowait(self._events.get_nowait())
            self._async_sink = sink
        while True:
            event = await inbox.get()
            if isinstance(event, DoneEvent):
                self.stats = event.stats
            yield event
            if isinstance(event, (DoneEvent, ErrorEvent)):
                return

    def text(self) -> str:
        """Run to the end and return the whole reply; raise the engine's error if any."""
        pieces = []
        for event in self:
            if isinstance(event, TokenEvent):
                pieces.append(event.text)
            elif isinstance(event, ErrorEvent):
                raise event.error
        return "".join(pieces)


class _LoopPost:
    """Hands events from the engine thread to one asyncio loop, one wake-up for many.

    A wake-up per event (call_soon_threadsafe: a lock and a write to the loop's pipe, then
    the loop's turn) costs the engine thread on every token of every stream. Here the first
    event after a delivery schedules one; the rest of a step's events (one per stream) join
    the pending batch, delivered in order by that one call.
    """

    _by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopPost] = (
        weakref.WeakKeyDictionary())
    _create = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._thread = threading.get_ident()  # made by the loop's own thread (events())
        self._pending: collections.deque[tuple[asyncio.Queue[Event], Event]] = (
            collections.deque())
        self._lock = threading.Lock()
        self._scheduled = False

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _LoopPost:
        with cls._create:
            post = cls._by_loop.get(loop)
            if post is None:
                post = cls._by_loop[loop] = cls(loop)
            return post

    def __call__(self, inbox: asyncio.Queue[Event], event: Event) -> None:
        if threading.get_ident() == self._thread:  # put on the loop (a runner's events)
            inbox.put_nowait(event)
            return
        with self._lock:
            self._pending.append((inbox, event))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop has closed: nobody listens
            pass

    def _deliver(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, collections.deque()
            self._scheduled = False
        for inbox, event in batch:
            inbox.put_nowait(event)


class Backend(ABC):
    """A loaded model that can tokenize, template and generate."""

    info: ModelInfo

    @abstractmethod
    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]: ...

    @abstractmethod
    def detokenize(self, tokens: Sequence[int]) -> str: ...

    @abstractmethod
    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True,
        template_args: Mapping[str, Any] | None = None,
    ) -> str:
        """The messages in the model's chat template; template_args are the other values a
        template reads (`tools`, `enable_thinking`, `reasoning_effort`)."""

    @abstractmethod
    def generate(self, prompt: str | Sequence[int], params: SamplingParams) -> Generation:
        """Queue a request; raises PromptTooLong or EngineBusy before queueing."""

    @abstractmethod
    def embed(self, text: str) -> tuple[list[float], int]:
        """An L2-normalised embedding of `text`, and how many tokens it took."""

    def embed_many(self, texts: Sequence[str], stop: threading.Event | None = None,
                   truncate: bool = False) -> tuple[list[list[float]], int]:
        """Each text's embedding, in order, and the tokens they took: one call for a
        request's inputs (a backend may read several in one decode). Once `stop` is set (the
        client has gone), Cancelled: no more are read. `truncate`: a text past the context
        is cut to it (Ollama's default), not refused."""
        vectors, n_tokens = [], 0
        for text in texts:
            stopped(stop)
            vector, n = self.embed(text)
            vectors.append(vector)
            n_tokens += n
        return vectors, n_tokens

    def rerank(self, query: str, documents: Sequence[str], stop: threading.Event | None = None
               ) -> tuple[list[float], int]:
        """Each document's relevance to `query`, in order, scored by a reranker (a
        cross-encoder with rank pooling), and how many tokens the pairs took; Cancelled once
        `stop` is set."""
        raise InvalidRequest("this model is not a reranker")

    @abstractmethod
    def stats(self) -> EngineStats:
        """A snapshot of the engine: slots in use, queue, KV cells, counters."""

    def infill_tokens(self, prefix: str, suffix: str, extra: Sequence[tuple[str, str]] = (),
                      prompt: str = "", room: int | None = None) -> list[int]:
        """A fill-in-the-middle prompt in the model's own FIM tokens (app/chat_formats/fim.py), at
        most `room` tokens (the context by default); InvalidRequest for a model without."""
        raise InvalidRequest("this model has no fill-in-the-middle tokens")

    def fewest_tokens(self, text_bytes: int) -> int:
        """The fewest tokens a text of this many UTF-8 bytes can become: a prompt can be
        refused by its size before it is templated and tokenized. 0 where unknown."""
        return 0

    def cancel_all(self) -> None:
        """End every running and waiting request now, each with its DoneEvent."""

    @property
    def ended(self) -> bool:
        """Whether the process that held the model is gone (a runner that died): its
        memory is free, its calls raise RunnerDied, and its owner loads the model again
        through the plan (the model pool; `run`'s loop)."""
        return False

    def memory_bytes(self) -> int:
        """The resident memory of the process that holds the model."""
        import psutil

        return psutil.Process().memory_info().rss

    @abstractmethod
    def close(self) -> None: ...

    def prompt_tokens(self, messages: Sequence[Mapping[str, Any]],
                      template_args: Mapping[str, Any] | None = None,
                      images: Sequence[Any] = ()) -> list[int]:
        """The messages in the model's chat template, as tokens (one call to a runner); with
        `images` (as `start` takes them), each image as the tokens it will take."""
        if images:
            raise InvalidRequest("this model takes no images — send text only")
        return self.tokenize(self.apply_chat_template(messages, True, template_args))

    def start_tokens(self, messages: Sequence[Mapping[str, Any]] | None,
                     prompt: str | Sequence[int] | None,
                     template_args: Mapping[str, Any] | None = None) -> list[int]:
        """A request's prompt as tokens: messages in the chat template, or the prompt."""
        if messages is not None:
            return self.prompt_tokens(messages, template_args)
        return self.tokenize(prompt) if isinstance(prompt, str) else list(prompt or ())

    def start(self, params: SamplingParams, messages: Sequence[Mapping[str, Any]] | None = None,
              prompt: str | Sequence[int] | None = None,
              template_args: Mapping[str, Any] | None = None,
              images: Sequence[Any] = ()) -> tuple[list[int], Generation]:
        """Template, tokens and queue in one (one trip to a runner): the prompt's tokens and
        the running request. `images` (vision.Image, in the order of the messages' image
        parts): only a model with a projector takes them."""
        if images:
            raise InvalidRequest("this model takes no images — send text only")
        tokens = self.start_tokens(messages, prompt, template_args)
        return tokens, self.generate(tokens, params)

    def chat(self, messages: Sequence[Mapping[str, str]], params: SamplingParams) -> Generation:
        return self.start(params, messages)[1]

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
