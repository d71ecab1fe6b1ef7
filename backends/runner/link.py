"""The parent's side of one runner process: the pipe, its reader, the cancels, the watchdog.

`Link` loads the model in the runner it is given (the protocol's hello checked first), sends
calls as `Request`s and matches each `Reply` or `Refused` to its caller, hands each engine
pass's `Events` to the generations they belong to, and, when the runner ends, ends every
open request and call with why. Messages are read on a server's event loop where one is
given (one wake-up a step fewer), else on a reader thread. The watchdog kills a runner that
has work and shows no progress for its hang limit; a load past `load_seconds` is stopped, and
so is one whose owner says `stop` (it is shutting down).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from typing import Any

from localinfer.backends.base import ErrorEvent, Generation, LoadOptions, ModelInfo
from localinfer.backends.runner import protocol as p
from localinfer.backends.runner.spawn import how, take
from localinfer.errors import (EngineClosed, EngineError, LocalinferError, ModelLoadFailed,
                               RunnerDied, RunnerMismatch)
from localinfer.settings import Settings

__all__ = ["Link", "load_seconds"]

log = logging.getLogger("localinfer.runner")


_STOP_POLL_S = 0.1  # how often a call that may be stopped looks whether its caller has gone


def load_seconds() -> float:
    """How long a runner may take to load: the load_timeout setting (300 s, as Ollama's
    OLLAMA_LOAD_TIMEOUT): a GPU driver, an RPC worker that froze."""
    return Settings().load_timeout


# ---------------------------------------------------------------------------- the parent
class Waiting:
    """A call sent to the runner, waiting for its reply."""

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


class _LoadGuard:
    """Kills a loading runner once its owner's `stop` is set or `limit` seconds have passed
    (a thread of its own, until `end`). `end` says why it killed it, if it did: after `end`,
    it kills nothing (a load that has just ended is not killed after the fact)."""

    def __init__(self, process: subprocess.Popen[bytes], limit: float,
                 stop: threading.Event | None):
        self._process, self._stop = process, stop
        self._deadline = time.monotonic() + limit
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._why: str | None = None
        threading.Thread(target=self._watch, daemon=True, name="runner-load").start()

    def _watch(self) -> None:
        while True:
            left = self._deadline - time.monotonic()
            # (with no owner to say stop, long waits: an hour at most, as Event.wait refuses
            # an endless limit)
            if self._ended.wait(max(0.0, min(left, 3600.0 if self._stop is None
                                             else _STOP_POLL_S))):
                return
            why = ("closing" if self._stop is not None and self._stop.is_set()
                   else "slow" if time.monotonic() >= self._deadline else None)
            if why is None:
                continue
            with self._lock:
                if self._ended.is_set():
                    return
                self._why = why
                self._process.kill()
                return

    def end(self) -> str | None:
        """The load has ended: why the guard killed its runner (`closing`, `slow`), or None."""
        with self._lock:
            self._ended.set()
            return self._why


class Link:
    """The parent's side of one runner process: started loaded, or an error."""

    def __init__(self, path: str, options: LoadOptions, name: str, hang: float,
                 loop: asyncio.AbstractEventLoop | None = None,
                 stop: threading.Event | None = None):
        """loop: read the runner's messages on this event loop (a server's) instead of a
        thread of our own: one wake-up a step fewer. stop: set, the load ends at once (its
        runner killed) with EngineClosed: its owner is shutting down."""
        self.name = name
        self.hang_seconds = hang
        self.process = take()
        p.grow(self.process.stdout.fileno())
        p.grow(self.process.stdin.fileno())
        self._pipe = p.Pipe(self.process.stdout.fileno(), self.process.stdin.fileno())
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._live: dict[int, Generation] = {}
        self._calls: dict[int, Waiting] = {}
        self._ended: LocalinferError | None = None
        self._closing = False
        self._hung = False
        self.info = self._load(path, options, stop)
        self._steps = -1
        self._progress = time.monotonic()
        self._wake = threading.Event()
        # cancels come from an event loop or a signal handler, which must never wait on a
        # full pipe: a thread of their own writes them
        self._notes: queue.SimpleQueue[p.Cancel | p.CancelAll | None] = queue.SimpleQueue()
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

    def _load(self, path: str, options: LoadOptions,
              stop: threading.Event | None) -> ModelInfo:
        """The runner's hello checked, the model loaded: its facts, or the load's error."""
        limit = load_seconds()
        # a crash reads as end-of-file; so does a load stopped for taking too long, or
        # because its owner is shutting down (a big model's load takes minutes: Ctrl-C
        # must not wait for it)
        guard = _LoadGuard(self.process, limit, stop)
        try:
            levels = {logger: logging.getLogger(logger).getEffectiveLevel()
                      for logger in ("localinfer", "localinfer.llama_cpp")}
            self._pipe.send(p.Load(p.VERSION, path, options, self.name, levels))
            self._check_hello(self._pipe.recv())
            message = self._pipe.recv()
        except BaseException as exc:
            stopped = guard.end()  # (before the waits below: a crash is not a stop)
            if not isinstance(exc, (EOFError, OSError)):  # not what a runner says: stop it
                self.process.kill()
                self._close_pipes()
                self._exit_code()
                raise
            self._close_pipes()
            ended = how(self._exit_code())
            self._check_stopped(stopped, limit)
            raise ModelLoadFailed(
                f"llama.cpp ended while loading {self.name} ({ended}) "
                f"— the file may be damaged, or too big for this machine") from None
        stopped = guard.end()
        if stopped:  # (killed just after it answered: stopped all the same)
            self._close_pipes()
            self._exit_code()
            self._check_stopped(stopped, limit)
        if not isinstance(message, p.Ready):
            self._close_pipes()
            self._exit_code()
            raise message.error.error()
        return message.info

    def _check_stopped(self, stopped: str | None, limit: float) -> None:
        """The error of a load its guard stopped (`stopped`: why), if it did."""
        if stopped == "closing":
            raise EngineClosed(f"the load of {self.name} was stopped: localinfer is "
                               f"shutting down") from None
        if stopped == "slow":
            raise ModelLoadFailed(
                f"{self.name} did not finish loading within {limit:g} s, so it was "
                f"stopped — LOCALINFER_LOAD_TIMEOUT gives it longer") from None

    def _check_hello(self, hello: object) -> None:
        """RunnerMismatch unless the runner speaks our protocol's version."""
        if hello != (p.HELLO, p.VERSION):
            theirs = (hello[1] if isinstance(hello, tuple) and len(hello) == 2
                      and hello[0] == p.HELLO else "an unknown one")
            raise RunnerMismatch(
                f"the runner of {self.name} speaks protocol {theirs}, this process "
                f"{p.VERSION}: localinfer was changed on disk while it ran — restart it")

    @property
    def alive(self) -> bool:
        return self._ended is None and not self._closing

    def generate(self, call: p.Generate | p.Start) -> tuple[Any, Generation]:
        """A request queued by Generate or Start: the call's answer, and its events."""
        gid = next(self._ids)
        generation = Generation(id=gid, _on_cancel=lambda: self._notes.put(p.Cancel(gid)))
        with self._lock:  # listed first: its events may arrive right behind the reply
            self._busy()
            self._live[gid] = generation
        try:
            value = self.call(call, rid=gid)
        except BaseException:
            with self._lock:
                self._live.pop(gid, None)
            self._notes.put(p.Cancel(gid))  # accepted after all (an interrupted wait)?
            raise
        return value, generation

    def _busy(self) -> None:
        """(Under the lock.) Idle until now: the hang clock starts with this work."""
        if not self._live and not any(c.watched for c in self._calls.values()):
            self._progress = time.monotonic()

    def cancel_all(self) -> None:
        # called from a signal handler: never wait for the send lock on this thread
        self._notes.put(p.CancelAll())

    def close(self) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._post_quietly(p.Close())
        try:
            self.process.wait(30)  # the engine ends what runs, then frees the model
        except subprocess.TimeoutExpired:
            log.warning("the runner of %s did not close within 30 s; killing it", self.name)
            self.process.kill()
        code = self._exit_code()
        if code and code < 0 and code != -signal.SIGKILL:
            log.warning("the runner of %s ended as it closed (%s)", self.name, how(code))
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
    def call(self, call: p.Call, rid: int | None = None, stop: threading.Event | None = None
             ) -> Any:
        """The runner's answer to `call`, or the error it answered with. Once `stop` is set
        (its caller has gone), the runner is told to cancel it (a call that stops: an
        embedding's or a ranking's reads end at the next decode, with Cancelled)."""
        if self._loop_thread == threading.get_ident():
            raise EngineError("a runner's reply is read on this event loop: call it from a "
                              "thread (asyncio.to_thread), never on the loop itself")
        waiting = Waiting(watched=call.watched)
        rid = rid or next(self._ids)
        with self._lock:
            if self._ended is not None or self._closing:
                raise self._ended or EngineClosed(f"{self.name} has been unloaded")
            if waiting.watched:
                self._busy()
            self._calls[rid] = waiting
        try:
            self._post(p.Request(rid, call))
            if stop is None:
                waiting.done.wait()
            else:  # (looked at a few times a second: an embedding's decode takes that long)
                while not waiting.done.wait(_STOP_POLL_S):
                    if stop.is_set():
                        self._notes.put(p.Cancel(rid))
                        waiting.done.wait()
        finally:
            with self._lock:
                self._calls.pop(rid, None)
        if waiting.ok:
            return waiting.value
        raise waiting.value

    def _post(self, message: object) -> None:
        try:
            self._pipe.send(message)
        except (OSError, ValueError):  # the runner has gone; the reader says why
            self._wake.wait(5)
            raise self._ended or EngineClosed(f"{self.name} has been unloaded") from None

    def _send_notes(self) -> None:
        while (note := self._notes.get()) is not None:
            self._post_quietly(note)

    def _post_quietly(self, message: object) -> None:
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
        frames = p.Frames()
        fd = self._pipe.reader
        # one buffer the pipe's size, read into again and again: os.read(fd, 1 MiB) mapped
        # and unmapped a fresh MiB for each step's 100 bytes (a message sent and read: 17.5
        # µs against 5.5; the server's CPU per streamed token, fast-step model: 83 → 63 µs)
        buffer = bytearray(p.PIPE_BYTES)
        view = memoryview(buffer)

        def readable() -> None:
            try:
                n = os.readv(fd, [buffer])
            except BlockingIOError:
                return
            except OSError:
                n = 0
            if n and not any([self._handle(m) for m in frames.feed(view[:n])]):
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

    def _handle(self, message: object) -> bool:
        """One message from the runner; True once it has closed."""
        kind = type(message)
        if kind is p.Events:
            self._progress = time.monotonic()
            self._deliver(message.batch)
        elif kind is p.Reply or kind is p.Refused:
            self._progress = time.monotonic()
            waiting = self._calls.get(message.rid)
            if waiting is not None:
                ok = kind is p.Reply
                waiting.finish(ok, message.value if ok else message.error.error())
        elif kind is p.Beat:
            if message.steps != self._steps:
                self._steps, self._progress = message.steps, time.monotonic()
        return kind is p.Closed

    def _deliver(self, batch: list[p.Token | p.Done | p.Failed]) -> None:
        for item in batch:
            if type(item) is p.Token:
                generation = self._live.get(item.gid)
                if generation is not None:
                    generation.put(item.event())
                continue
            with self._lock:
                generation = self._live.pop(item.gid, None)
            if generation is not None:
                generation.put(item.event())

    def _end(self) -> None:
        """The runner has exited: every request and call still open ends with why."""
        ended = how(self._exit_code())
        with self._lock:
            if self._closing and not self._live:
                self._ended = EngineClosed(f"{self.name} has been unloaded")
            elif self._hung:
                self._ended = RunnerDied(
                    f"{self.name} made no progress for {self.hang_seconds:g} s and was stopped "
                    f"(LOCALINFER_RUNNER_TIMEOUT) — send the request again to reload it")
            else:
                self._ended = RunnerDied(
                    f"the runner of {self.name} ended ({ended}) — send the request again "
                    f"to reload it")
            live, self._live = self._live, {}
            calls = list(self._calls.values())
        self._wake.set()
        self._notes.put(None)  # the notes thread ends
        if not self._closing:
            log.error("the runner of %s ended (%s%s); requests stopped: %d", self.name, ended,
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

