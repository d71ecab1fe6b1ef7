"""The runner process: one model's `LlamaCppBackend`, answering its parent over a pipe.

Started as `python -m localinfer.backends.runner.child` (or the bundled app's own executable
with `__runner__`). Its stdin and stdout carry the messages of `protocol.py`; whatever
llama.cpp prints goes to stderr. It says HELLO at once, loads llama.cpp while its parent
plans (a spare runner), then waits for `Load`.

    reading thread   Request: a quick call answered here, the rest on a call thread;
                     Cancel, CancelAll, Close
    call threads     Start / Generate: the request queued, then its events attached
    engine thread    after each pass, the pass's events in one Events message (`_flush`)
    heartbeat        from the load on: whether the parent has gone, every BEAT_SECONDS;
                     once loaded, Beat(steps) as well

A runner told to close frees in the reverse order of its load, with nothing else touching
llama.cpp meanwhile: its heartbeat stops first (it read the engine's figures, and once read
the context's size after the context was freed: a segfault in libllama as runners closed),
then the engine's thread, then the model's parts (`LlamaCppBackend.close`); llama.cpp's log
goes back to stderr before the interpreter tears down (`ggml_backends.route_llama_log`). It
then exits with status 0. A runner whose parent has gone exits at once: its pipe reads
end-of-file, or, while it loads (it reads no pipe then), its heartbeat finds it orphaned.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

from localinfer.backends.base import Event, Generation, LoadOptions
from localinfer.backends.runner import protocol as p
from localinfer.errors import EngineError, LocalinferError, ModelLoadFailed, RunnerMismatch

__all__ = ["BEAT_SECONDS", "runner_main"]

BEAT_SECONDS = 0.5


def runner_main() -> None:
    """The runner process: its stdin and stdout carry the messages."""
    # Ctrl-C in a terminal reaches the whole process group: the parent decides what ends
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.dup(1)
    os.dup2(2, 1)  # whatever llama.cpp prints must not land in the messages
    pipe = p.Pipe(0, out)
    try:
        pipe.send((p.HELLO, p.VERSION))
    except OSError:
        return
    # llama.cpp loads before the model is named, while the parent plans (a spare runner);
    # a failure here is the load's to report
    with contextlib.suppress(Exception):
        importlib.import_module("localinfer.backends.llamacpp")
    try:
        load = pipe.recv()
    except Exception:  # noqa: BLE001 - its parent has gone, or speaks another version (it
        return  # reads our hello and says so)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    for logger, level in load.levels.items():  # as the parent logs: llama.cpp's log with --verbose
        logging.getLogger(logger).setLevel(level)
    _Runner(pipe).serve(load)


class _Runner:
    def __init__(self, pipe: p.Pipe):
        self.pipe = pipe
        self.parent = os.getppid()
        self._outbox: list[p.Token | p.Done | p.Failed] = []
        self._outbox_lock = threading.Lock()
        self._live: dict[int, Generation] = {}
        self._pending: set[int] = set()  # Start / Generate read, not yet answered
        self._cancelled: set[int] = set()  # of those, the ones cancelled before they queued
        self._stops: dict[int, threading.Event] = {}  # calls that stop: set by their Cancel
        self._live_lock = threading.Lock()
        self._calls = ThreadPoolExecutor(4, thread_name_prefix="localinfer-runner-call")
        self._fault = os.environ.get("LOCALINFER_RUNNER_FAULT")  # tests only: see _check_fault
        # tests only: a faster heartbeat (every millisecond, it met every close)
        self._beat_seconds = float(os.environ.get("LOCALINFER_RUNNER_BEAT") or BEAT_SECONDS)
        self._closing = threading.Event()  # the heartbeat stops
        self._loaded = threading.Event()  # Ready sent: beats may follow

    def send(self, message: object) -> None:
        try:
            self.pipe.send(message)
        except (OSError, ValueError):
            os._exit(0)  # the parent has gone

    def serve(self, load: p.Load) -> None:
        # from the load on: a parent killed while a big model loads (SIGKILL, SIGTERM to
        # `run`) reads nothing of it, and its runner must not load on for minutes
        beat = threading.Thread(target=self._beat, daemon=True, name="runner-beat")
        beat.start()
        try:
            if self._fault:
                self._check_fault()  # (tests: `hang` here is a load that never ends)
            if not self._load(load.version, load.path, load.options, load.name):
                return
            self.backend.engine.after_pass = self._flush
            self.send(p.Ready(self.backend.info))  # before any Beat: the parent reads it first
            self._loaded.set()
            self._read()
        finally:
            self._closing.set()
            beat.join()  # (it may be sending: it touches llama.cpp no more once it has stopped)
        self._calls.shutdown(wait=True, cancel_futures=True)  # none still uses the model
        self.backend.close()  # the engine's last pass flushes its events
        self._flush()
        self.send(p.Closed())

    def _load(self, version: int, path: str, options: LoadOptions, name: str) -> bool:
        try:
            if version != p.VERSION:
                raise RunnerMismatch(f"the runner speaks protocol {p.VERSION}, its parent "
                                        f"{version} — restart localinfer")
            from localinfer.backends.llamacpp import LlamaCppBackend  # loads llama.cpp

            self.backend = LlamaCppBackend(path, options, name=name)
            return True
        except BaseException as exc:  # noqa: BLE001 - the parent says it in one line
            if not isinstance(exc, LocalinferError):
                exc = ModelLoadFailed(f"llama.cpp could not load {name}: {exc}")
            self.send(p.LoadFailed(p.WireError.of(exc)))
            return False

    def _read(self) -> None:
        """The parent's messages, until it says Close."""
        while True:
            try:
                message = self.pipe.recv()
            except (EOFError, OSError):
                os._exit(0)  # the parent has gone: nobody is left to answer
            if isinstance(message, p.Request):
                call = message.call
                if call.streams:
                    with self._live_lock:
                        self._pending.add(message.rid)  # a cancel may come before it queues
                elif call.stops:
                    with self._live_lock:
                        self._stops[message.rid] = threading.Event()
                if call.quick():
                    self._call(message.rid, call)  # here: a wake-up costs more than the call
                else:
                    self._calls.submit(self._call, message.rid, call)
            elif isinstance(message, p.Cancel):
                self._cancel(message.gid)
            elif isinstance(message, p.CancelAll):
                self.backend.cancel_all()
            elif isinstance(message, p.Close):
                return

    def _call(self, rid: int, call: p.Call) -> None:
        reply: p.Reply | p.Refused
        try:
            if not isinstance(call, p.CALLS):
                raise EngineError(f"a runner has no call {type(call).__name__}")
            if call.streams:
                value, generation = call.run(self.backend)
                self._attach(rid, generation)
            elif call.stops:
                with self._live_lock:
                    stop = self._stops[rid]
                value = call.run(self.backend, stop)
            else:
                value = call.run(self.backend)
            reply = p.Reply(rid, value)
        except BaseException as exc:  # noqa: BLE001 - every error goes back to the caller
            reply = p.Refused(rid, p.WireError.of(exc))
        with self._live_lock:
            self._pending.discard(rid)
            self._cancelled.discard(rid)
            self._stops.pop(rid, None)
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
            if gid in self._stops:  # a call that stops (an embedding's reads)
                self._stops[gid].set()
        if generation is not None:
            generation.cancel()

    def _post(self, gid: int, event: Event) -> None:
        """An event for the parent; sent with the rest of its engine pass."""
        item = p.outgoing(gid, event)
        if not isinstance(item, p.Token):
            with self._live_lock:
                self._live.pop(gid, None)
        with self._outbox_lock:
            self._outbox.append(item)

    def _flush(self) -> None:
        """After each engine pass (and where events are put outside one): send what the
        pass put, in one message. On the engine thread itself: a thread of its own to send
        would cost a wake-up per step, and its CPU, which llama.cpp's threads feel on a
        small machine (bench/results/runner_cost.md). A parent too slow to read holds the
        engine back only once the pipe's buffer is full.

        Where all cores are busy, the write wakes the parent, which preempts this thread: at
        the fast-step model's rate on 2 cores with 2 llama.cpp threads, the write took 188 µs
        on average against 15 µs to pickle — most of what a runner costs there. Tried and
        left out: the parent's reading thread as SCHED_BATCH (no preemption on wake-up; one
        stream 1.15x in-process, but the parent's work moved into the decode, stalled
        llama.cpp's barriers, and the thread tuner fell to 1 thread at 8 clients: 151-194
        against 221-241 tok/s), and events held for up to 1 ms (+11%, noisier steps)."""
        if self._fault:
            self._check_fault()
        with self._outbox_lock:
            batch, self._outbox = self._outbox, []
            if batch:  # sent under the lock: batches leave in the order they were made
                self.send(p.Events(batch))

    def _beat(self) -> None:
        """Progress for the parent's watchdog, once loaded: the engine's step count, a
        counter of its own (its full figures ask llama.cpp, which this thread must not,
        racing a close). From the load on, an orphaned runner exits (the pipe's end-of-file
        is the usual sign, but a loading runner reads no pipe)."""
        while not self._closing.wait(self._beat_seconds):
            if os.getppid() != self.parent:
                os._exit(0)
            if self._loaded.is_set():
                self.send(p.Beat(self.backend.engine.steps))

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


if __name__ == "__main__":
    runner_main()
