"""Each loaded model in a process of its own: a crash inside llama.cpp costs one runner.

llama.cpp ends its process on conditions Python cannot catch (`abort()`, `GGML_ASSERT`, a failed
device allocation, an RPC worker that goes away). `RunnerBackend` is a `Backend` whose model
lives in a child process (`python -m localinfer.backends.runner.process`, or the bundled app's own
executable with `__runner__`). The parent holds no weights: it sends calls down the runner's
stdin and receives each engine pass's events in one message on its stdout (length-prefixed
pickles; whatever llama.cpp prints goes to stderr).

    parent                                         runner (child process)
    RunnerBackend.generate ─ ("call", …) ───────►  a call thread: LlamaCppBackend.generate
                           ◄─ ("reply", …) ──────  accepted, or the error to answer with
    reader thread          ◄─ ("events", […]) ───  the engine's pass, sent by an outbox thread
    watchdog thread        ◄─ ("beat", steps) ───  every BEAT_SECONDS

A runner that ends (a signal, an exit) ends each of its requests with `RunnerDied`; one that
has work and makes no progress for `hang_seconds` (LOCALINFER_RUNNER_TIMEOUT) is killed and
treated the same (an embedding, one llama.cpp call that shows no progress until it ends, is
not watched). A runner whose parent has gone (its pipe reads end-of-file) exits at once.

A runner told to close frees in the reverse order of its load, with nothing else touching
llama.cpp meanwhile: its heartbeat stops first (it read the engine's figures, and once read
the context's size after the context was freed: a segfault in libllama as runners closed),
then the engine's thread, then the model's parts (`LlamaCppBackend.close`); llama.cpp's log
goes back to stderr before the interpreter tears down (`ggml_backends.route_llama_log`). It
then exits with status 0; a closed runner that ends by a signal is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import logging
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from localinfer.backends.base import (Backend, DoneEvent, ErrorEvent, Event, Generation,
                                     LoadOptions, SamplingParams, TokenEvent)
from localinfer.backends.metrics import EngineStats
from localinfer.errors import (EngineClosed, EngineError, InvalidRequest, LocalinferError,
                               ModelLoadFailed, RunnerDied)
from localinfer.settings import Settings, debug

__all__ = ["BEAT_SECONDS", "RunnerBackend", "hang_seconds",
           "load_seconds", "runner_main", "warm_spare"]

log = logging.getLogger("localinfer.runner")

# a runner with work that shows no progress (an engine step, a reply) for runner_timeout
# (120 s) is killed: a hang inside llama.cpp — generous, since one prompt chunk of a big model
# on a slow CPU takes tens of seconds; a load that takes longer than load_timeout (300 s, as
# Ollama's OLLAMA_LOAD_TIMEOUT) is stopped (a GPU driver, an RPC worker that froze)
BEAT_SECONDS = 0.5
# what a parent may ask of the runner's backend
_CALLS = frozenset({"generate", "start", "tokenize", "detokenize", "apply_chat_template",
                    "prompt_tokens", "embed", "rerank", "stats", "fewest_tokens",
                    "infill_tokens"})
_QUICK_BYTES = 16 << 10  # a text this short tokenizes in well under a millisecond
_TOKEN, _DONE, _ERROR = 0, 1, 2


def _quick(method: str, args: tuple[Any, ...]) -> bool:
    """A call the runner answers on its reading thread: cheap and bounded (no grammar to
    build, no long text; a chat template is held to 2 s by its sandbox, and the engine sends
    its events meanwhile); the rest go to its call threads. Under load a call thread's
    wake-up costs more than a short prompt's template and tokens (1.7 ms against 0.3)."""
    if method == "stats":
        return True
    if method in ("tokenize", "detokenize"):
        return len(args[0]) <= _QUICK_BYTES
    if method == "prompt_tokens":
        return _size(args[0], args[1]) <= _QUICK_BYTES and not args[2]
    if method == "generate":
        return args[1].grammar is None and len(args[0]) <= _QUICK_BYTES
    if method == "start":
        params, messages, prompt, template_args, images = args
        size = _size(messages, template_args) if messages is not None else len(prompt or ())
        return params.grammar is None and size <= _QUICK_BYTES and not images
    return False


def _size(messages: Sequence[Mapping[str, Any]], template_args: Mapping[str, Any] | None
          ) -> int:
    """About how much text a template gets (tools count: their schemas are rendered)."""
    size = sum(len(str(m.get("content", ""))) + len(str(m.get("tool_calls") or ""))
               for m in messages)
    return size + (len(str(template_args)) if template_args else 0)


def hang_seconds() -> float:
    """How long a runner with work may show no progress: the runner_timeout setting."""
    return Settings().runner_timeout


def load_seconds() -> float:
    """How long a runner may take to load: the load_timeout setting."""
    return Settings().load_timeout


# ---------------------------------------------------------------------------- the wire
_LENGTH = struct.Struct("<Q")


class _Pipe:
    """Messages over a pair of file descriptors: an 8-byte length, then a pickle. Only our
    own two processes are at either end. Unbuffered: what the parent's event loop reads
    straight off the descriptor is never held in a buffer of Python's."""

    def __init__(self, reader: int, writer: int):
        self.reader, self.writer = reader, writer
        self._send_lock = threading.Lock()
        self.closed = False  # its descriptors' numbers may belong to other files by now

    def shut(self) -> None:
        """No message goes out after this (the caller then closes the descriptors)."""
        with self._send_lock:
            self.closed = True

    def send(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(_LENGTH.pack(len(data)) + data)
        with self._send_lock:
            if self.closed:
                raise OSError("the runner's pipe is closed")
            while view:
                view = view[os.write(self.writer, view):]

    def recv(self) -> tuple[Any, ...]:
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



class _Frames:
    """Messages out of bytes as they come off a non-blocking descriptor."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[tuple[Any, ...]]:
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


def _grow(fd: int) -> None:
    """A pipe that holds 1 MiB (Linux), not 64 KiB: the runner's engine writes its events
    itself and waits only when the parent falls that far behind."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError):
        pass


def _wire_error(exc: BaseException) -> tuple[str, str, str, dict[str, Any]]:
    """An error as it crosses the pipe: its class by name, its text and plain attributes
    (LocalinferErrors take arguments of their own, so they are not pickled as they are)."""
    if isinstance(exc, UnicodeError):  # JSON may spell a lone surrogate ("\ud800")
        exc = InvalidRequest(f"the text is not valid Unicode ({getattr(exc, 'reason', exc)}) "
                             f"— send UTF-8 text")
    if not isinstance(exc, LocalinferError):
        return "", "", f"{type(exc).__name__}: {exc}", {}
    plain = (str, int, float, bool, type(None))
    attrs = {k: v for k, v in vars(exc).items()
             if isinstance(v, plain) or (isinstance(v, list) and all(isinstance(x, plain) for x in v))}
    return type(exc).__module__, type(exc).__qualname__, str(exc), attrs


def _error(wire: tuple[str, str, str, dict[str, Any]]) -> LocalinferError:
    module, name, message, attrs = wire
    try:
        cls = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, LocalinferError)):
        return EngineError(message)
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.__dict__.update(attrs)
    return exc


def _how(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


# ---------------------------------------------------------------------------- the child
def runner_main() -> None:
    """The runner process: its stdin and stdout carry the messages."""
    # Ctrl-C in a terminal reaches the whole process group: the parent decides what ends
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.dup(1)
    os.dup2(2, 1)  # whatever llama.cpp prints must not land in the messages
    pipe = _Pipe(0, out)
    # llama.cpp loads before the model is named, while the parent plans (a spare runner);
    # a failure here is the load's to report
    with contextlib.suppress(Exception):
        importlib.import_module("localinfer.backends.llamacpp")
    try:
        _, path, options, name, levels = pipe.recv()
    except EOFError:
        return
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    for logger, level in levels.items():  # as the parent logs: llama.cpp's log with --verbose
        logging.getLogger(logger).setLevel(level)
    _Runner(pipe).serve(path, options, name)


class _Runner:
    def __init__(self, pipe: _Pipe):
        self.pipe = pipe
        self.parent = os.getppid()
        self._outbox: list[tuple[Any, ...]] = []
        self._outbox_lock = threading.Lock()
        self._live: dict[int, Generation] = {}
        self._pending: set[int] = set()  # generate / start calls read, not yet answered
        self._cancelled: set[int] = set()  # of those, the ones cancelled before they queued
        self._live_lock = threading.Lock()
        self._calls = ThreadPoolExecutor(4, thread_name_prefix="localinfer-runner-call")
        self._fault = os.environ.get("LOCALINFER_RUNNER_FAULT")  # tests only: see _check_fault
        # tests only: a faster heartbeat (every millisecond, it met every close)
        self._beat_seconds = float(os.environ.get("LOCALINFER_RUNNER_BEAT") or BEAT_SECONDS)
        self._closing = threading.Event()  # the heartbeat stops

    def send(self, message: tuple[Any, ...]) -> None:
        try:
            self.pipe.send(message)
        except (OSError, ValueError):
            os._exit(0)  # the parent has gone

    def serve(self, path: str, options: LoadOptions, name: str) -> None:
        if self._fault:
            self._check_fault()  # (tests: `hang` here is a load that never ends)
        try:
            from localinfer.backends.llamacpp import LlamaCppBackend  # loads llama.cpp

            self.backend = LlamaCppBackend(path, options, name=name)
        except BaseException as exc:  # noqa: BLE001 - the parent says it in one line
            if not isinstance(exc, LocalinferError):
                exc = ModelLoadFailed(f"llama.cpp could not load {name}: {exc}")
            self.send(("failed", _wire_error(exc)))
            return
        self.backend.engine.after_pass = self._flush
        beat = threading.Thread(target=self._beat, daemon=True, name="runner-beat")
        beat.start()
        self.send(("ready", self.backend.info))
        while True:
            try:
                message = self.pipe.recv()
            except (EOFError, OSError):
                os._exit(0)  # the parent has gone: nobody is left to answer
            kind = message[0]
            if kind == "call" and message[2] in ("generate", "start"):
                with self._live_lock:
                    self._pending.add(message[1])  # a cancel may come before it is queued
            if kind == "call" and _quick(message[2], message[3]):
                self._call(*message[1:])  # here: a thread's wake-up costs more than the call
            elif kind == "call":
                self._calls.submit(self._call, *message[1:])
            elif kind == "cancel":
                self._cancel(message[1])
            elif kind == "cancel_all":
                self.backend.cancel_all()
            elif kind == "close":
                break
        self._closing.set()
        beat.join()  # (it may be sending: it touches llama.cpp no more once it has stopped)
        self._calls.shutdown(wait=True, cancel_futures=True)  # none still uses the model
        self.backend.close()  # the engine's last pass flushes its events
        self._flush()
        self.send(("closed",))

    def _call(self, rid: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            if method not in _CALLS:
                raise EngineError(f"a runner has no call {method!r}")
            if method == "generate":
                value = self._attach(rid, self.backend.generate(*args))
            elif method == "start":
                value, generation = self.backend.start(*args)
                self._attach(rid, generation)
            else:
                value = getattr(self.backend, method)(*args, **kwargs)
            reply = ("reply", rid, True, value)
        except BaseException as exc:  # noqa: BLE001 - every error goes back to the caller
            reply = ("reply", rid, False, _wire_error(exc))
        with self._live_lock:
            self._pending.discard(rid)
            self._cancelled.discard(rid)
        self.send(reply)

    def _attach(self, gid: int, generation: Generation) -> None:
        """A request now in the engine: its events go to the parent as they come."""
        with self._live_lock:
            self._live[gid] = generation
            cancelled = gid in self._cancelled
            self._cancelled.discard(gid)
        with generation._sink_lock:  # events the engine put before this: first, in order
            while not generation._events.empty():
                self._post(gid, generation._events.get_nowait())
            generation._async_sink = lambda event: self._post(gid, event)
        if cancelled:
            generation.cancel()
        self._flush()

    def _cancel(self, gid: int) -> None:
        with self._live_lock:
            generation = self._live.get(gid)
            if generation is None and gid in self._pending:  # else it has ended already
                self._cancelled.add(gid)
        if generation is not None:
            generation.cancel()

    def _post(self, gid: int, event: Event) -> None:
        """An event for the parent; sent with the rest of its engine pass."""
        if isinstance(event, TokenEvent):
            item: tuple[Any, ...] = (gid, _TOKEN, event.text, event.token, event.index,
                                     event.logprobs)
        else:
            with self._live_lock:
                self._live.pop(gid, None)
            item = ((gid, _DONE, event.stats) if isinstance(event, DoneEvent)
                    else (gid, _ERROR, _wire_error(event.error)))
        with self._outbox_lock:
            self._outbox.append(item)

    def _flush(self) -> None:
        """After each engine pass (and where events are put outside one): send what the
        pass put, in one message. On the engine thread itself: a thread of its own to send
        would cost a wake-up per step, and its CPU, which llama.cpp's threads feel on a
        small machine (bench/results/runner_cost.md). A parent too slow to read holds the
        engine back only once the pipe's buffer is full."""
        if self._fault:
            self._check_fault()
        with self._outbox_lock:
            batch, self._outbox = self._outbox, []
            if batch:  # sent under the lock: batches leave in the order they were made
                self.send(("events", batch))

    def _beat(self) -> None:
        """Progress for the parent's watchdog: the engine's step count, a counter of its
        own (its full figures ask llama.cpp, which this thread must not, racing a close)."""
        while not self._closing.wait(self._beat_seconds):
            if os.getppid() != self.parent:  # orphaned (the pipe's end-of-file is the usual sign)
                os._exit(0)
            self.send(("beat", self.backend.engine.steps))

    def _check_fault(self) -> None:
        """Tests: the file named by LOCALINFER_RUNNER_FAULT, once it exists, says what goes
        wrong on the engine thread: `abort` (llama.cpp's own GGML_ABORT, what a failed
        assertion calls) or `hang` (the engine stops making progress)."""
        try:
            with open(self._fault) as f:
                what = f.read().strip()
            if not what:  # caught between its creation and its write: read it next time
                return
            os.remove(self._fault)
        except OSError:
            return
        if what == "abort":
            import llama_cpp._ggml as ggml

            ggml.libggml.ggml_abort(b"runner.py", 0, b"fault injected by a test")
        elif what == "hang":
            threading.Event().wait()


# ---------------------------------------------------------------------------- the parent
class _Call:
    __slots__ = ("done", "ok", "value", "started", "watched")

    def __init__(self, watched: bool = True) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None
        self.started = time.monotonic()
        # an embedding is one llama_decode of up to a context of tokens, which shows no
        # progress until it ends and may take minutes on a slow CPU: the watchdog leaves it
        # (and a reranking, a few such decodes)
        self.watched = watched

    def finish(self, ok: bool, value: Any) -> None:
        self.ok, self.value = ok, value
        self.done.set()


def _spawn() -> subprocess.Popen[bytes]:
    command = ([sys.executable, "__runner__"] if getattr(sys, "frozen", False)
               else [sys.executable, "-m", "localinfer.backends.runner.process"])
    # when llama.cpp aborts it (a worker lost), it ends at once with a line on stderr rather
    # than attaching a debugger for a backtrace (seconds, and pages in the server's log)
    env = os.environ if debug() else {**os.environ, "GGML_NO_BACKTRACE": "1"}
    # its own session: a Ctrl-C or a terminal's hang-up goes to us, not to it
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                            start_new_session=os.name == "posix", env=env)


_spare: tuple[subprocess.Popen[bytes], dict[str, str]] | None = None
_spare_lock = threading.Lock()


def warm_spare() -> None:
    """Start the next load's runner now: its interpreter and llama.cpp (~0.25 s) load while
    the caller reads the model's header and plans. It waits for a model to be named, and
    ends with its parent (its pipe reads end-of-file)."""
    global _spare
    with _spare_lock:
        if _spare is None or _spare[0].poll() is not None:
            _spare = _spawn(), dict(os.environ)


def _runner_process() -> subprocess.Popen[bytes]:
    """The spare runner if it is waiting and started with the environment of now (tests set
    variables a runner reads), else a new one."""
    global _spare
    with _spare_lock:
        spare, _spare = _spare, None
    if spare is not None:
        process, environ = spare
        if process.poll() is None and environ == os.environ:
            return process
        _dismiss(process)
    return _spawn()


def _dismiss(process: subprocess.Popen[bytes]) -> None:
    for stream in (process.stdin, process.stdout):
        with contextlib.suppress(OSError):
            stream.close()  # end-of-file: it exits
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)


class _Link:
    """The parent's side of one runner process: started loaded, or an error."""

    def __init__(self, path: str, options: LoadOptions, name: str, hang: float,
                 loop: asyncio.AbstractEventLoop | None = None):
        """loop: read the runner's messages on this event loop (a server's) instead of a
        thread of our own: one wake-up a step fewer."""
        self.name = name
        self.hang_seconds = hang
        self.process = _runner_process()
        _grow(self.process.stdout.fileno())
        _grow(self.process.stdin.fileno())
        self._pipe = _Pipe(self.process.stdout.fileno(), self.process.stdin.fileno())
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._live: dict[int, Generation] = {}
        self._calls: dict[int, _Call] = {}
        self._ended: LocalinferError | None = None
        self._closing = False
        self._hung = False
        limit = load_seconds()
        # a crash reads as end-of-file; so does a load stopped for taking too long
        too_long = threading.Timer(limit, self.process.kill)
        too_long.daemon = True
        too_long.start()
        try:
            levels = {logger: logging.getLogger(logger).getEffectiveLevel()
                      for logger in ("localinfer", "localinfer.llama_cpp")}
            self._pipe.send(("load", path, options, name, levels))
            message = self._pipe.recv()
        except BaseException as exc:
            if not isinstance(exc, (EOFError, OSError)):  # not what a runner says: stop it
                self.process.kill()
                self._close_pipes()
                self._exit_code()
                raise
            self._close_pipes()
            how = _how(self._exit_code())
            if too_long.finished.is_set():
                raise ModelLoadFailed(
                    f"{self.name} did not finish loading within {limit:g} s, so it was "
                    f"stopped — LOCALINFER_LOAD_TIMEOUT gives it longer") from None
            raise ModelLoadFailed(
                f"llama.cpp ended while loading {self.name} ({how}) "
                f"— the file may be damaged, or too big for this machine") from None
        finally:
            too_long.cancel()
        if message[0] != "ready":
            self._close_pipes()
            self._exit_code()
            raise _error(message[1])
        self.info = message[1]
        self._steps = -1
        self._progress = time.monotonic()
        self._wake = threading.Event()
        # cancels come from an event loop or a signal handler, which must never wait on a
        # full pipe: a thread of their own writes them
        self._notes: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        threading.Thread(target=self._send_notes, daemon=True,
                         name=f"runner-notes {self.name}").start()
        self._loop = loop
        self._loop_thread: int | None = None
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"runner-reader {self.name}")
        if loop is None:
            self._reader.start()
        else:
            loop.call_soon_threadsafe(self._attach)
        threading.Thread(target=self._watch, daemon=True, name=f"runner-watch {self.name}").start()

    @property
    def alive(self) -> bool:
        return self._ended is None and not self._closing

    def generate(self, method: str, args: tuple[Any, ...]) -> tuple[Any, Generation]:
        """A request queued by `generate` or `start`: the call's answer, and its events."""
        gid = next(self._ids)
        generation = Generation(id=gid, _on_cancel=lambda: self._notes.put(("cancel", gid)))
        with self._lock:  # listed first: its events may arrive right behind the reply
            self._busy()
            self._live[gid] = generation
        try:
            value = self.call(method, args, rid=gid)
        except BaseException:
            with self._lock:
                self._live.pop(gid, None)
            self._notes.put(("cancel", gid))  # accepted after all (an interrupted wait)?
            raise
        return value, generation

    def _busy(self) -> None:
        """(Under the lock.) Idle until now: the hang clock starts with this work."""
        if not self._live and not any(c.watched for c in self._calls.values()):
            self._progress = time.monotonic()

    def cancel_all(self) -> None:
        # called from a signal handler: never wait for the send lock on this thread
        self._notes.put(("cancel_all",))

    def close(self) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._post_quietly(("close",))
        try:
            self.process.wait(30)  # the engine ends what runs, then frees the model
        except subprocess.TimeoutExpired:
            log.warning("the runner of %s did not close within 30 s; killing it", self.name)
            self.process.kill()
        code = self._exit_code()
        if code and code < 0 and code != -signal.SIGKILL:
            log.warning("the runner of %s ended as it closed (%s)", self.name, _how(code))
        self._wake.wait(5)  # the reader has said how it ended
        self._close_pipes()

    def _close_pipes(self) -> None:
        self._pipe.shut()
        loop = getattr(self, "_loop", None)
        if loop is not None and threading.get_ident() != self._loop_thread:
            removed = threading.Event()  # off the loop's selector before the number is free

            def remove() -> None:
                with contextlib.suppress(Exception):
                    loop.remove_reader(self._pipe.reader)
                removed.set()

            with contextlib.suppress(RuntimeError):  # a closed loop has nothing to remove
                loop.call_soon_threadsafe(remove)
                removed.wait(5)
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def _exit_code(self) -> int | None:
        try:
            return self.process.wait(5)
        except subprocess.TimeoutExpired:
            return None

    # ------------------------------------------------------------------ the pipe
    def call(self, method: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
             rid: int | None = None) -> Any:
        if self._loop_thread == threading.get_ident():
            raise EngineError("a runner's reply is read on this event loop: call it from a "
                              "thread (asyncio.to_thread), never on the loop itself")
        call = _Call(watched=method not in ("embed", "rerank"))
        rid = rid or next(self._ids)
        with self._lock:
            if self._ended is not None or self._closing:
                raise self._ended or EngineClosed(f"{self.name} has been unloaded")
            if call.watched:
                self._busy()
            self._calls[rid] = call
        try:
            self._post(("call", rid, method, args, kwargs or {}))
            call.done.wait()
        finally:
            with self._lock:
                self._calls.pop(rid, None)
        if call.ok:
            return call.value
        raise call.value

    def _post(self, message: tuple[Any, ...]) -> None:
        try:
            self._pipe.send(message)
        except (OSError, ValueError):  # the runner has gone; the reader says why
            self._wake.wait(5)
            raise self._ended or EngineClosed(f"{self.name} has been unloaded") from None

    def _send_notes(self) -> None:
        while (note := self._notes.get()) is not None:
            self._post_quietly(note)

    def _post_quietly(self, message: tuple[Any, ...]) -> None:
        try:
            self._pipe.send(message)
        except (OSError, ValueError):
            pass

    def _read(self) -> None:
        """The reader thread (no event loop to read on)."""
        try:
            while not self._handle(self._pipe.recv()):
                pass
        except (EOFError, OSError):
            pass
        self._end()

    def _attach(self) -> None:
        """On the loop: read the runner's messages as they come."""
        self._loop_thread = threading.get_ident()
        frames = _Frames()
        fd = self._pipe.reader

        def readable() -> None:
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if chunk and not any([self._handle(m) for m in frames.feed(chunk)]):
                return
            self._loop.remove_reader(fd)  # the runner has ended or closed: say so, off the loop
            threading.Thread(target=self._end, daemon=True, name=f"runner-end {self.name}").start()

        try:
            os.set_blocking(fd, False)
            self._loop.add_reader(fd, readable)
        except (AttributeError, OSError, RuntimeError, NotImplementedError):  # e.g. on Windows
            self._loop, self._loop_thread = None, None
            with contextlib.suppress(AttributeError, OSError):
                os.set_blocking(fd, True)
            self._reader.start()

    def _handle(self, message: tuple[Any, ...]) -> bool:
        """One message from the runner; True once it has closed."""
        kind = message[0]
        if kind == "events":
            self._progress = time.monotonic()
            self._deliver(message[1])
        elif kind == "reply":
            self._progress = time.monotonic()
            _, rid, ok, value = message
            call = self._calls.get(rid)
            if call is not None:
                call.finish(ok, value if ok else _error(value))
        elif kind == "beat":
            if message[1] != self._steps:
                self._steps, self._progress = message[1], time.monotonic()
        return kind == "closed"

    def _deliver(self, batch: list[tuple[Any, ...]]) -> None:
        for gid, kind, *rest in batch:
            if kind == _TOKEN:
                generation = self._live.get(gid)
                if generation is not None:
                    generation.put(TokenEvent(*rest))
                continue
            with self._lock:
                generation = self._live.pop(gid, None)
            if generation is not None:
                generation.put(DoneEvent(rest[0]) if kind == _DONE
                               else ErrorEvent(_error(rest[0])))

    def _end(self) -> None:
        """The runner has exited: every request and call still open ends with why."""
        how = _how(self._exit_code())
        with self._lock:
            if self._closing and not self._live:
                self._ended = EngineClosed(f"{self.name} has been unloaded")
            elif self._hung:
                self._ended = RunnerDied(
                    f"{self.name} made no progress for {self.hang_seconds:g} s and was stopped "
                    f"(LOCALINFER_RUNNER_TIMEOUT) — send the request again to reload it")
            else:
                self._ended = RunnerDied(
                    f"the runner of {self.name} ended ({how}) — send the request again "
                    f"to reload it")
            live, self._live = self._live, {}
            calls = list(self._calls.values())
        self._wake.set()
        self._notes.put(None)  # the notes thread ends
        if not self._closing:
            log.error("the runner of %s ended (%s%s); requests stopped: %d", self.name, how,
                      ", after no progress" if self._hung else "", len(live) + len(calls))
        for generation in live.values():
            generation.put(ErrorEvent(self._ended))
        for call in calls:
            call.finish(False, self._ended)

    def _watch(self) -> None:
        """Kill a runner that has work and shows no progress for hang_seconds."""
        while not self._wake.wait(min(1.0, self.hang_seconds / 4)):
            now = time.monotonic()
            with self._lock:
                watched = [c.started for c in self._calls.values() if c.watched]
                busy = bool(self._live or watched)
                oldest = min(watched, default=now)
            stalled = now - self._progress > self.hang_seconds or now - oldest > self.hang_seconds
            if busy and stalled and self._ended is None:
                self._hung = True
                self.process.kill()
                return


class RunnerBackend(Backend):
    """A model loaded in a runner process; the same interface as the in-process backend.
    A runner that has ended is started again by the next call (a new request)."""

    def __init__(self, path: str | os.PathLike[str], options: LoadOptions,
                 name: str | None = None, *, hang: float | None = None,
                 loop: asyncio.AbstractEventLoop | None = None):
        """loop: the event loop of a server that uses this model, to read on (see _Link)."""
        self.name = name or Path(path).stem
        self._start = lambda: _Link(str(path), options, self.name, hang or hang_seconds(), loop)
        self._link = self._start()
        self.info = self._link.info
        self._restart = threading.Lock()
        self._closed = False

    @property
    def pid(self) -> int:
        return self._link.process.pid

    @property
    def exit_code(self) -> int | None:
        """How its runner process ended (negative: by that signal); None while it runs."""
        return self._link.process.returncode

    @property
    def ended(self) -> bool:
        return not self._closed and not self._link.alive

    def _runner(self) -> _Link:
        link = self._link
        if link.alive or self._closed:
            return link
        with self._restart:
            if not self._link.alive and not self._closed:
                self._link.close()  # reaped
                log.info("starting the runner of %s again", self.name)
                self._link = self._start()
            return self._link

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self._runner().call("tokenize", (text,), {"add_special": add_special})

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._runner().call("detokenize", (list(tokens),))

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]],
                            add_generation_prompt: bool = True,
                            template_args: Mapping[str, Any] | None = None) -> str:
        return self._runner().call("apply_chat_template", ([dict(m) for m in messages],
                                                           add_generation_prompt,
                                                           _plain(template_args)))

    def prompt_tokens(self, messages: Sequence[Mapping[str, Any]],
                      template_args: Mapping[str, Any] | None = None,
                      images: Sequence[Any] = ()) -> list[int]:
        return self._runner().call("prompt_tokens", ([dict(m) for m in messages],
                                                     _plain(template_args), tuple(images)))

    def generate(self, prompt: str | Sequence[int], params: SamplingParams) -> Generation:
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        return self._runner().generate("generate", (tokens, params))[1]

    def start(self, params: SamplingParams, messages: Sequence[Mapping[str, Any]] | None = None,
              prompt: str | Sequence[int] | None = None,
              template_args: Mapping[str, Any] | None = None,
              images: Sequence[Any] = ()) -> tuple[list[int], Generation]:
        if messages is not None:
            messages = [dict(m) for m in messages]
        elif prompt is not None and not isinstance(prompt, str):
            prompt = list(prompt)
        return self._runner().generate("start", (params, messages, prompt,
                                                 _plain(template_args), tuple(images)))

    def embed(self, text: str) -> tuple[list[float], int]:
        return self._runner().call("embed", (text,))

    def rerank(self, query: str, documents: Sequence[str]) -> tuple[list[float], int]:
        return self._runner().call("rerank", (query, list(documents)))

    def stats(self) -> EngineStats:
        """Figures only: never starts a runner, and a runner gone reads as an idle one."""
        link = self._link
        with contextlib.suppress(RunnerDied, EngineClosed):
            if link.alive:
                return link.call("stats")
        return EngineStats(n_slots=self.info.n_slots, active=0, waiting=0, kv_cells_used=0,
                           kv_cells_total=0, steps=0, tokens_evaluated=0, tokens_generated=0,
                           requests_finished=0, preemptions=0, decode_seconds=0.0,
                           step_seconds=0.0, threads=0)

    def fewest_tokens(self, text_bytes: int) -> int:
        return self._runner().call("fewest_tokens", (text_bytes,))

    def infill_tokens(self, prefix: str, suffix: str, extra: Sequence[tuple[str, str]] = (),
                      prompt: str = "", room: int | None = None) -> list[int]:
        return self._runner().call("infill_tokens", (prefix, suffix, [tuple(e) for e in extra],
                                                     prompt, room))

    def memory_bytes(self) -> int:
        """The runner's resident memory (0 while none runs)."""
        try:
            return psutil.Process(self._link.process.pid).memory_info().rss
        except psutil.Error:
            return 0

    def cancel_all(self) -> None:
        self._link.cancel_all()

    def close(self) -> None:
        self._closed = True
        with self._restart:
            self._link.close()


def _plain(template_args: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return dict(template_args) if template_args else None


if __name__ == "__main__":
    runner_main()
