"""What a parent and its runner say to each other: every message, defined once.

One dataclass per call and per event, each the only place its fields and their order are
written; the child (`child.py`) and the parent (`link.py`, `process.py`) both read them from here.

    parent ──────────────────────────────────────────►  runner
      Load                 the model to load (the first message; after the runner's hello)
      Request(rid, call)   one of CALLS, e.g. Tokenize(text) or Start(params, messages, …)
      Cancel(gid), CancelAll, Close
    runner ──────────────────────────────────────────►  parent
      HELLO                the protocol it speaks: a plain tuple, the same in every version
      Ready(info) or LoadFailed(error)
      Reply(rid, value) or Refused(rid, error)          one per Request
      Events([Token | Done | Failed, …])                an engine pass's events, in one message
      Beat(steps)          every BEAT_SECONDS, for the parent's watchdog
      Closed               after a Close, once the model is freed

On the wire: an 8-byte length, then a pickle. Only our own two processes are at either end,
started from the same install, so pickle is safe; a runner that speaks another VERSION (the
package upgraded under a running server) is refused with `RunnerMismatch` by its hello,
before anything else crosses. Messages pickle as their class and a tuple of their fields
(`_message`), and are not frozen (a frozen dataclass's __init__ costs twice a plain one's,
and a Token is made for every token): an engine pass's events at 32 streams cost ~23 µs to
encode and ~26 µs to decode, against ~5 and ~24 µs as the plain tuples these replaced
(the best of 7 × 2,000 passes on a 2-core machine): under 1% of what a token costs a runner.

An error crosses as `WireError`: a stable name from ERRORS (the `localinfer.errors` tree and
the few others a runner raises), its text and plain attributes; the parent rebuilds it from
the registry, and a name it does not know arrives as an EngineError with the same text.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import struct
import threading
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any, ClassVar, TypeVar

from localinfer import errors
from localinfer.backends.base import (Backend, DoneEvent, ErrorEvent, Event, Generation,
                                     LoadOptions, Logprob, ModelInfo, SamplingParams,
                                     TokenEvent)
from localinfer.backends.metrics import EngineStats, RequestStats
from localinfer.backends.rpc.library import RpcUnavailable
from localinfer.backends.rpc.workers import WorkerUnusable
from localinfer.errors import EngineError, InvalidRequest, LocalinferError
from localinfer.settings import SettingsError

__all__ = [
    "CALLS", "ERRORS", "HELLO", "PIPE_BYTES", "VERSION", "ApplyChatTemplate", "Beat", "Call",
    "Cancel", "CancelAll", "Close", "Closed", "Detokenize", "Done", "Embed", "Events", "Failed",
    "FewestTokens", "Frames", "Generate", "InfillTokens", "Load", "LoadFailed", "Pipe",
    "PromptTokens", "Ready", "Refused", "Rerank", "Reply", "Request", "Start", "Stats", "Token",
    "Tokenize", "WireError", "grow", "outgoing",
]

# raised with every change to a message's fields or meaning
VERSION = 2
# the runner's first words, before it reads anything: a plain tuple, never changed, so that
# any two versions can tell each other apart
HELLO = "localinfer runner"

_QUICK_BYTES = 16 << 10  # a text this short tokenizes in well under a millisecond
_M = TypeVar("_M")


def _message(cls: type[_M]) -> type[_M]:
    """A dataclass with slots that pickles as its class and a tuple of its fields."""
    cls = dataclasses.dataclass(slots=True)(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    if not names:
        fields: Any = lambda self: ()
    elif len(names) == 1:
        one = attrgetter(names[0])
        fields = lambda self: (one(self),)
    else:
        fields = attrgetter(*names)

    def __reduce__(self: Any) -> tuple[type, tuple[Any, ...]]:
        return type(self), fields(self)

    cls.__reduce__ = __reduce__  # type: ignore[method-assign,assignment]
    return cls


# ---------------------------------------------------------------------------- errors
ERRORS: dict[str, type[LocalinferError]] = {
    name: getattr(errors, name) for name in errors.__all__
    if isinstance(getattr(errors, name), type)}
ERRORS.update({cls.__name__: cls for cls in (RpcUnavailable, WorkerUnusable, SettingsError)})


@_message
class WireError:
    """An error as it crosses: its name in ERRORS ("" for none: an EngineError), its text,
    and its plain attributes (a LocalinferError takes arguments of its own, so it is not
    pickled whole)."""

    kind: str
    message: str
    attrs: dict[str, Any]

    @classmethod
    def of(cls, exc: BaseException) -> WireError:
        if isinstance(exc, UnicodeError):  # JSON may spell a lone surrogate ("\ud800")
            exc = InvalidRequest(f"the text is not valid Unicode "
                                 f"({getattr(exc, 'reason', exc)}) — send UTF-8 text")
        if not isinstance(exc, LocalinferError):
            return cls("", f"{type(exc).__name__}: {exc}", {})
        plain = (str, int, float, bool, type(None))
        attrs = {k: v for k, v in vars(exc).items()
                 if isinstance(v, plain)
                 or (isinstance(v, list) and all(isinstance(x, plain) for x in v))}
        # its own type, or the nearest it is made from that ERRORS knows (HubError: ModelError)
        kind = next((k.__name__ for k in type(exc).__mro__
                     if k is not LocalinferError and ERRORS.get(k.__name__) is k), "")
        return cls(kind, str(exc), attrs)

    def error(self) -> LocalinferError:
        """The error again, of its own type where ERRORS knows it, else an EngineError."""
        known = ERRORS.get(self.kind)
        if known is None:
            return EngineError(self.message)
        exc = known.__new__(known)  # its own __init__ would write the message anew
        Exception.__init__(exc, self.message)
        exc.__dict__.update(self.attrs)
        return exc


# ---------------------------------------------------------------------------- calls
class Call:
    """A question to the runner's backend. `quick()`: answered on the runner's reading
    thread, for it is cheap and bounded (no grammar to build, no long text; a chat template
    is held to 2 s by its sandbox, and the engine sends its events meanwhile), else on a
    call thread — under load a call thread's wake-up costs more than a short prompt's
    template and tokens (1.7 ms against 0.3). `streams`: it queues a request whose events
    follow (`run` then returns the answer and the Generation). `watched`: the parent's
    watchdog counts its wait (an embedding shows no progress until it ends). `stops`: a
    Cancel of its request id stops it (`run` takes the event the Cancel sets)."""

    __slots__ = ()
    streams: ClassVar[bool] = False
    watched: ClassVar[bool] = True
    stops: ClassVar[bool] = False

    def run(self, backend: Backend) -> Any:
        raise NotImplementedError

    def quick(self) -> bool:
        return False


def _size(messages: Sequence[Mapping[str, Any]], template_args: Mapping[str, Any] | None
          ) -> int:
    """About how much text a template gets (tools count: their schemas are rendered)."""
    size = sum(len(str(m.get("content", ""))) + len(str(m.get("tool_calls") or ""))
               for m in messages)
    return size + (len(str(template_args)) if template_args else 0)


@_message
class Tokenize(Call):
    text: str
    add_special: bool = True

    def run(self, backend: Backend) -> list[int]:
        return backend.tokenize(self.text, add_special=self.add_special)

    def quick(self) -> bool:
        return len(self.text) <= _QUICK_BYTES


@_message
class Detokenize(Call):
    tokens: list[int]

    def run(self, backend: Backend) -> str:
        return backend.detokenize(self.tokens)

    def quick(self) -> bool:
        return len(self.tokens) <= _QUICK_BYTES


@_message
class ApplyChatTemplate(Call):
    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    template_args: dict[str, Any] | None = None

    def run(self, backend: Backend) -> str:
        return backend.apply_chat_template(self.messages, self.add_generation_prompt,
                                           self.template_args)


@_message
class PromptTokens(Call):
    messages: list[dict[str, Any]]
    template_args: dict[str, Any] | None = None
    images: tuple[Any, ...] = ()

    def run(self, backend: Backend) -> list[int]:
        return backend.prompt_tokens(self.messages, self.template_args, self.images)

    def quick(self) -> bool:
        return _size(self.messages, self.template_args) <= _QUICK_BYTES and not self.images


@_message
class Generate(Call):
    """A request of prompt tokens; answered with None once queued."""

    streams: ClassVar[bool] = True
    tokens: list[int]
    params: SamplingParams

    def run(self, backend: Backend) -> tuple[None, Generation]:
        return None, backend.generate(self.tokens, self.params)

    def quick(self) -> bool:
        return self.params.grammar is None and len(self.tokens) <= _QUICK_BYTES


@_message
class Start(Call):
    """A request from messages or a prompt; answered with its prompt tokens once queued."""

    streams: ClassVar[bool] = True
    params: SamplingParams
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[int] | None = None
    template_args: dict[str, Any] | None = None
    images: tuple[Any, ...] = ()

    def run(self, backend: Backend) -> tuple[list[int], Generation]:
        return backend.start(self.params, self.messages, self.prompt, self.template_args,
                             self.images)

    def quick(self) -> bool:
        size = (_size(self.messages, self.template_args) if self.messages is not None
                else len(self.prompt or ()))
        return self.params.grammar is None and size <= _QUICK_BYTES and not self.images


@_message
class Embed(Call):
    watched: ClassVar[bool] = False
    stops: ClassVar[bool] = True
    texts: list[str]
    truncate: bool = False

    def run(self, backend: Backend, stop: threading.Event | None = None
            ) -> tuple[list[list[float]], int]:
        return backend.embed_many(self.texts, stop, self.truncate)


@_message
class Rerank(Call):
    watched: ClassVar[bool] = False  # a few decodes that show no progress until they end
    stops: ClassVar[bool] = True
    query: str
    documents: list[str]

    def run(self, backend: Backend, stop: threading.Event | None = None
            ) -> tuple[list[float], int]:
        return backend.rerank(self.query, self.documents, stop)


@_message
class Stats(Call):
    def run(self, backend: Backend) -> EngineStats:
        return backend.stats()

    def quick(self) -> bool:
        return True


@_message
class FewestTokens(Call):
    text_bytes: int

    def run(self, backend: Backend) -> int:
        return backend.fewest_tokens(self.text_bytes)


@_message
class InfillTokens(Call):
    prefix: str
    suffix: str
    extra: list[tuple[str, str]]
    prompt: str = ""
    room: int | None = None

    def run(self, backend: Backend) -> list[int]:
        return backend.infill_tokens(self.prefix, self.suffix, self.extra, self.prompt,
                                     self.room)


# what a parent may ask of the runner's backend
CALLS: tuple[type[Call], ...] = (Tokenize, Detokenize, ApplyChatTemplate, PromptTokens,
                                 Generate, Start, Embed, Rerank, Stats, FewestTokens,
                                 InfillTokens)


# ---------------------------------------------------------------------------- parent → runner
@_message
class Load:
    version: int
    path: str
    options: LoadOptions
    name: str
    levels: dict[str, int]  # logger → level: the runner logs as its parent does


@_message
class Request:
    rid: int  # a Generate's or Start's is also its request's id in Cancel and the events
    call: Call


@_message
class Cancel:
    gid: int


@_message
class CancelAll:
    pass


@_message
class Close:
    pass


# ---------------------------------------------------------------------------- runner → parent
@_message
class Ready:
    info: ModelInfo


@_message
class LoadFailed:
    error: WireError


@_message
class Reply:
    rid: int
    value: Any


@_message
class Refused:
    rid: int
    error: WireError


@_message
class Token:
    gid: int
    text: str
    token: int
    index: int
    logprobs: tuple[Logprob, ...]

    def event(self) -> Event:
        return TokenEvent(self.text, self.token, self.index, self.logprobs)


@_message
class Done:
    gid: int
    stats: RequestStats

    def event(self) -> Event:
        return DoneEvent(self.stats)


@_message
class Failed:
    gid: int
    error: WireError

    def event(self) -> Event:
        return ErrorEvent(self.error.error())


def outgoing(gid: int, event: Event) -> Token | Done | Failed:
    """An engine's event as it crosses."""
    if isinstance(event, TokenEvent):
        return Token(gid, event.text, event.token, event.index, event.logprobs)
    if isinstance(event, DoneEvent):
        return Done(gid, event.stats)
    return Failed(gid, WireError.of(event.error))


@_message
class Events:
    batch: list[Token | Done | Failed]


@_message
class Beat:
    steps: int


@_message
class Closed:
    pass


# ---------------------------------------------------------------------------- the pipe
_LENGTH = struct.Struct("<Q")
PIPE_BYTES = 1 << 20  # what the runner's pipe holds (`grow`), and what the parent reads at once


class Pipe:
    """Messages over a pair of file descriptors: an 8-byte length, then a pickle.
    Unbuffered: what the parent's event loop reads straight off the descriptor is never
    held in a buffer of Python's."""

    def __init__(self, reader: int, writer: int):
        self.reader, self.writer = reader, writer
        self._send_lock = threading.Lock()
        self.closed = False  # its descriptors' numbers may belong to other files by now

    def shut(self) -> None:
        """No message goes out after this (the caller then closes the descriptors)."""
        with self._send_lock:
            self.closed = True

    def send(self, message: object) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(_LENGTH.pack(len(data)) + data)
        with self._send_lock:
            if self.closed:
                raise OSError("the runner's pipe is closed")
            while view:
                view = view[os.write(self.writer, view):]

    def recv(self) -> Any:
        size, = _LENGTH.unpack(self._exactly(_LENGTH.size))
        return pickle.loads(self._exactly(size))

    def _exactly(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = os.read(self.reader, n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return bytes(data)


class Frames:
    """Messages out of bytes as they come off a non-blocking descriptor."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes | memoryview) -> list[Any]:
        self._buffer += chunk
        messages, start = [], 0
        while len(self._buffer) - start >= _LENGTH.size:
            size, = _LENGTH.unpack_from(self._buffer, start)
            end = start + _LENGTH.size + size
            if end > len(self._buffer):
                break
            messages.append(pickle.loads(self._buffer[start + _LENGTH.size:end]))
            start = end
        del self._buffer[:start]
        return messages


def grow(fd: int) -> None:
    """A pipe that holds 1 MiB (Linux), not 64 KiB: the runner's engine writes its events
    itself and waits only when the parent falls that far behind."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass
