"""How many CPU threads llama.cpp gets: the cores that are free, re-chosen as the load changes.

llama.cpp's threads meet at a barrier after every operation of a step, so one thread that
another process keeps off its core holds all the others up: with one busy neighbour on two
cores, two threads decode at a third of their idle speed, one thread at two thirds
(measured: 39 against 71-77 tok/s, idle 108-139). One thread per core, the default of
llama.cpp and Ollama, is right only on an idle machine.

- At load: as many threads as the physical cores other processes leave free (`free_cores`).
- While running (`ThreadTuner`): decode-only steps are timed per thread count and per number
  of streams (moving averages), each from its start to the next step's: what runs between
  steps (sampling, the events, the server's parent and its clients) slows down beside a
  llama.cpp thread that spins on the other core. Timed by their own length, 1 thread and 2
  looked alike on bench/random_gguf.py's fast-step model through a runner on 2 cores,
  where timing the whole cycle took one stream from 1,784-2,660 tok/s to 2,608-3,039
  (4 alternating rounds, bench/clients.py's load). When the steps of the current count slow
  down by a third against what its last probe measured (before one, the best it has shown)
  — a neighbour started — or every `period` steps, the tuner runs a few steps with another
  count, then as many back at its own, and keeps the other count where its median step is
  faster by 8% (`_BETTER`): the two, taken in turn, see the same load (`_probing`). The
  other count is the cores other processes leave now (`OthersLoad`, since the last probe)
  where that differs from the current count by more than one — a neighbour started, or one
  busy at load stopped — else one thread fewer.
- The count is chosen per number of streams (1, 2-3, 4-7, 8-15, ...), each first probed a
  few steps after it appears: one stream on 2 cores decodes faster with 1 thread (the other
  core runs what comes between steps), 8 streams with 2. One count for all carried the
  solo choice into the next burst of clients: on bench/serve_speed.py's load (2-core EPYC),
  8 clients ran at 147-149 tok/s in 2 of 4 rounds against 232-258 at a fixed 2 threads.
- A step that reads prompt tokens runs with the count chosen at load (or the tuned one where
  it is higher): its matrix products keep every thread busy between barriers, so the light
  load of the server's own parent and clients costs it little, while one thread fewer
  halves it. Tuned on decode steps alone, a 3,000-token prompt read beside a running stream
  took 2.1x as long as alone (1 thread); with the count at load, 1.0x
  (bench/results/long_prompt_gap.md).
  A user's explicit --threads is never changed.
- Between steps, llama.cpp's idle OpenMP threads spin for ~70 µs, not libgomp's ~7 ms, and
  then sleep, leaving the core to what runs between steps (the runner's environment,
  `runner/spawn.py`; bench/results/omp_wait.md).
- Between localinfer's processes (`CoreShare`): each step claims its threads in a small
  shared file before it runs, waits while the other processes' running steps hold every
  core, and takes no more than the cores their claims leave. Two teams of llama.cpp threads
  on the same cores wait at each other's barriers, every operation of every step. Two
  models' runners, 2 streams each on 2 cores (bench/results/two_models.md): counting alone,
  the longest TTFT was 5.4-5.6 s and the streams took 9.5-10.3 s to end; sharing, 0.78-0.95
  s and 7.1-7.5 s; a fixed 2 threads each (llama.cpp's one per core), 2.5-7.9 s and 50-145
  s. The tuner sees such a neighbour only after some slow steps; the claims are seen
  before the first. Embedding and ranking reads claim their cores as prompt steps do
  (`ThreadTuner.begin_pooled`): a read that took what the claims left but claimed nothing
  let the next step of another process take every core beside it.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import mmap
import os
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil
from filelock import FileLock

__all__ = ["CoreShare", "OthersLoad", "ThreadTuner", "free_cores", "physical_cores"]

log = logging.getLogger(__name__)

_ALPHA = 0.25  # weight of the newest step in a moving average
_SLOWDOWN = 1.35  # steps this much slower than the count's best: the load changed, probe
_PROBE_STEPS = 5  # decode-only steps timed at the other count (the first is not counted)
_BETTER = 0.92  # a count must be this much faster to replace the current one
_FIRST_PROBE = 8  # decode-only steps of a number of streams not yet probed before its probe
_RECHECK_S = 5.0  # how often a prompt step may raise its count to the cores free now


def _bucket(streams: int) -> int:
    """Numbers of streams that share a thread count: 1, 2-3, 4-7, 8-15, ... (counted as a
    step's decode tokens, so a lone stream's speculative guesses count as streams)."""
    return streams.bit_length()


def physical_cores() -> int:
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def free_cores(sample_s: float = 0.1, ours: Iterable[int] = ()) -> int:
    """Physical cores left over by other processes, measured over `sample_s`: at least one.
    Not counted as others: this process and `ours`, the localinfer process that started a
    runner. A runner loads while that process still starts (`serve` imports its web stack
    meanwhile, `run` its chat), which is not a neighbour's load: counted, one of 2 cores
    looked taken, and the model read its first prompts with 1 thread and began decoding
    with it (measured: 1 thread at load in every `serve` start on a 2-core EPYC)."""
    load = OthersLoad(ours)
    time.sleep(sample_s)
    return load()


class OthersLoad:
    """The physical cores other processes leave free, over the time since the last call: the
    machine's busy time less this process's own (its llama.cpp threads spin while they wait)
    and that of `ours` (process ids)."""

    def __init__(self, ours: Iterable[int] = ()) -> None:
        self._processes = [psutil.Process()]
        for pid in set(ours) - {os.getpid()}:
            with contextlib.suppress(psutil.Error):  # (one not read now is not counted later)
                process = psutil.Process(pid)
                process.cpu_times()
                self._processes.append(process)
        self._seen = [0.0] * len(self._processes)  # each one's CPU seconds when last read
        # (asked once: psutil reads the physical count from /sys at each call, 3% of the
        # engine's thread at a GPU's step rate, where the tuner probes often)
        self._cores = physical_cores()
        self._logical = psutil.cpu_count() or self._cores
        self._last = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        times = psutil.cpu_times()
        busy = sum(times) - times.idle - sum(getattr(times, name, 0.0) for name in (
            "iowait", "guest", "guest_nice"))  # (Linux counts a guest's time in user too)
        for i, process in enumerate(self._processes):
            with contextlib.suppress(psutil.Error):  # (one that has ended keeps its figure)
                own = process.cpu_times()
                self._seen[i] = own.user + own.system
        return time.monotonic(), busy, sum(self._seen)

    def __call__(self) -> int:
        then, self._last = self._last, self._sample()
        elapsed = self._last[0] - then[0]
        cores = self._cores
        if elapsed <= 0:
            return cores
        others = max(0.0, (self._last[1] - then[1]) - (self._last[2] - then[2])) / elapsed
        return max(1, min(cores, round(cores - others * cores / self._logical)))


# pid, its start time (a pid the system gave again is not the same process), threads (< 0:
# waiting for them), when the step began, when it ended (time.monotonic, the machine's)
_SLOT = struct.Struct("<qdqdd")
_SLOTS = 64  # localinfer processes on one machine that can claim cores at once
_LINGER_S = 0.25  # a claim still counts this long after its step ended: the next step
# of a process that is generating comes within milliseconds, and its cores are not free
_WAIT_S = 30.0  # the longest a step waits for another process's step to free a core
_POLL_S = 0.001


def _started(pid: int) -> float | None:
    """When a process started, None if there is none: on Linux its clock ticks since boot
    (exact, whatever the wall clock does), elsewhere its creation time."""
    try:
        if sys.platform.startswith("linux"):
            with open(f"/proc/{pid}/stat", "rb") as f:  # (its name may hold spaces and ")")
                return float(f.read().rpartition(b")")[2].split()[19])
        return psutil.Process(pid).create_time()
    except (OSError, psutil.Error, IndexError, ValueError):
        return None


def _alive(pid: int, born: float) -> bool:
    started = _started(pid)
    return started is not None and abs(started - born) < 1.0


def share_path() -> Path:
    """The machine's file of claims, one per user (the cores are the machine's, whichever
    LOCALINFER_HOME each process runs under)."""
    try:
        user = getpass.getuser()
    except Exception:  # (no name for this uid in a container)
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"localinfer-cores-{user}-v1"


class CoreShare:
    """The cores this process's llama.cpp steps may use while other localinfer processes run
    theirs: a slot of its own in a shared file, where it writes the threads each step wants
    before it runs, the threads it runs with, and when it ended. Each slot is written by its
    own process only; a slot whose process is gone counts for nothing.

    A step that finds every core held by steps running now waits for one of them to end
    (a running step cannot give threads back; a thread more beside it would stall both), and
    the others, seeing its claim, take fewer threads at their next step."""

    def __init__(self, cores: int, path: Path | None = None) -> None:
        self.cores = max(1, cores)
        path = path or share_path()
        self._pid = os.getpid()
        self._born = _started(self._pid) or 0.0
        with FileLock(f"{path}.lock", timeout=5):
            with open(path, "a+b") as f:
                facts = os.fstat(f.fileno())
                if hasattr(os, "getuid") and facts.st_uid != os.getuid():
                    raise OSError(f"{path} belongs to another user")
                if facts.st_size != _SLOT.size * _SLOTS:  # (new, or of another layout)
                    f.truncate(0)
                    f.truncate(_SLOT.size * _SLOTS)
                self._map = mmap.mmap(f.fileno(), _SLOT.size * _SLOTS)
            self._slot = self._take()
        self.waits = 0  # steps (and pooled reads) that waited for a core
        self.waited_s = 0.0  # how long the last step waited
        self._waited_out: set[tuple[int, float]] = set()  # (pid, step began) held too long

    def _take(self) -> int:
        for i in range(_SLOTS):
            pid, born = _SLOT.unpack_from(self._map, i * _SLOT.size)[:2]
            if not pid or not _alive(pid, born):
                _SLOT.pack_into(self._map, i * _SLOT.size, self._pid, self._born, 0, 0.0, 0.0)
                return i
        raise OSError("every slot of the core share is taken")

    def others(self, since: float | None = None) -> tuple[int, int]:
        """Threads of the other processes: those in steps running now, and those claimed at
        all (running, ended just now, or waiting to run); with `since` (this process's own
        wait began), a process waiting since before it counts all its cores as running (the
        first to wait is the first to run)."""
        now = time.monotonic()
        running = claimed = 0
        for i in range(_SLOTS):
            if i == self._slot:
                continue
            pid, born, threads, began, ended = _SLOT.unpack_from(self._map, i * _SLOT.size)
            if not pid or not threads:
                continue
            in_step = threads > 0 and ended < began
            if not (threads < 0 or in_step or now - ended < _LINGER_S):
                continue
            if not _alive(pid, born):
                continue
            claimed += abs(threads)
            if in_step and (pid, began) not in self._waited_out:
                running += threads
            elif (threads < 0 and since is not None and (began, i) < (since, self._slot)
                  and (pid, began) not in self._waited_out):
                running += self.cores
        return running, claimed

    def allowed(self, wanted: int) -> int:
        """At most `wanted`, at most the cores the others' claims leave, at least one."""
        return max(1, min(wanted, self.cores - self.others()[1]))

    def begin(self, wanted: int) -> int:
        """Claim `wanted` threads for a step about to run; once a core is free of the others'
        running steps (and those waiting since before have run), keep of them what the
        others' claims leave (two processes starting at once each see the other's claim).
        `waited_s`: how long it waited."""
        offset = self._slot * _SLOT.size
        since = time.monotonic()
        try:
            _SLOT.pack_into(self._map, offset, self._pid, self._born, -wanted, since, 0.0)
            deadline = since + _WAIT_S
            running, claimed = self.others(since)
            if running >= self.cores:
                self.waits += 1
                while running >= self.cores and time.monotonic() < deadline:
                    time.sleep(_POLL_S)
                    running, claimed = self.others(since)
                if running >= self.cores:  # a step that never ends (a process stopped or
                    self._wait_out()       # hung): not waited for again
                    claimed = self.others()[1]
            count = max(1, min(wanted, self.cores - claimed))
            _SLOT.pack_into(self._map, offset, self._pid, self._born, count, time.monotonic(),
                            0.0)
        except BaseException:
            _SLOT.pack_into(self._map, offset, self._pid, self._born, 0, 0.0, 0.0)
            raise
        self.waited_s = time.monotonic() - since
        return count

    def _wait_out(self) -> None:
        for i in range(_SLOTS):
            pid, _, threads, began, ended = _SLOT.unpack_from(self._map, i * _SLOT.size)
            if i != self._slot and pid and (threads < 0 or ended < began):
                self._waited_out.add((pid, began))
        log.warning("another localinfer process's step has held the cores %.0f s: running "
                    "beside it", _WAIT_S)

    def end(self) -> None:
        offset = self._slot * _SLOT.size
        threads, began = _SLOT.unpack_from(self._map, offset)[2:4]
        _SLOT.pack_into(self._map, offset, self._pid, self._born, threads, began,
                        time.monotonic())

    def close(self) -> None:
        if not self._map.closed:
            _SLOT.pack_into(self._map, self._slot * _SLOT.size, 0, 0.0, 0, 0.0, 0.0)
            self._map.close()


def open_share(cores: int) -> CoreShare | None:
    """The machine's core share, or None where its file cannot be made (a read-only
    temporary folder, another user's file of that name): each process then counts alone."""
    try:
        return CoreShare(cores)
    except Exception as err:
        log.debug("no core share: %s", err)
        return None


class ThreadTuner:
    def __init__(self, start: int, max_threads: int, period: int = 512,
                 free: Callable[[], int] | None = None, share: CoreShare | None = None):
        self.current = max(1, min(start, max_threads))
        self.at_load = self.current
        self.prompt = self.current  # for steps that read prompt tokens: at least the count at load
        self.max_threads = max(1, max_threads)
        self.period = period
        self._avg: dict[tuple[int, int], float] = {}  # (threads, streams) → seconds a step
        self._best: dict[tuple[int, int], float] = {}  # what a slowdown is measured against
        self._measured: set[tuple[int, int]] = set()  # those a probe has measured
        self._since_probe = 0
        # (from, streams, the count tried, its times, then times back at `from`)
        self._probe: tuple[int, int, int, list[float], list[float]] | None = None
        self._probe_steps = 0  # steps since the probe's half began, of any number of streams
        self.switches = 0
        self._chosen: dict[int, int] = {}  # streams' bucket (_bucket) → the count kept for it
        self._unprobed: dict[int, int] = {}  # a bucket not yet probed → its steps so far
        # the cores free of other processes now (None: only one thread fewer is tried)
        self._free = free if free is not None else (OthersLoad() if max_threads > 1 else None)
        self._checked = time.monotonic()  # when the prompt count last looked for free cores
        # the cores other localinfer processes' steps hold now (None: not counted)
        self.share = share
        self._capped = False  # this step runs with fewer threads than the tuner chose
        self._pooled = 0  # the count a pooled read claimed (begin_pooled), until release

    def begin(self, n_prompt: int, n_decode: int = 0) -> int:
        """The count a step starting now runs with: `for_step`'s, no more than the cores the
        other localinfer processes' steps leave (claimed in the share until `end`)."""
        wanted = self.for_step(n_prompt, n_decode)
        if self.share is None:
            return wanted
        count = self.share.begin(wanted)
        self._capped = count < wanted
        return count

    @property
    def waited_s(self) -> float:
        """How long the last step waited for a core (no part of its time)."""
        return self.share.waited_s if self.share is not None else 0.0

    def release(self) -> None:
        """The step's (or pooled read's) llama.cpp work is over: its claim ends (lingering a
        moment)."""
        self._pooled = 0
        if self.share is not None:
            self.share.end()

    def begin_pooled(self) -> int:
        """Claim the cores for a pooled read about to run on the engine's thread (an
        embedding's or a ranking's decodes: Engine.call), as for a step that reads prompt
        tokens: it waits while other processes' steps hold every core, and keeps what their
        claims leave. `for_pooled` is that count until `release`."""
        self._pooled = self.begin(1)
        return self._pooled

    def for_pooled(self) -> int:
        """The count an embedding or ranking read runs with: its claim's (`begin_pooled`),
        else a prompt step's, no more than the other processes' claims leave."""
        if self._pooled:
            return self._pooled
        wanted = self.for_step(1)
        return wanted if self.share is None else self.share.allowed(wanted)

    def for_step(self, n_prompt: int, n_decode: int = 0) -> int:
        """The count a step runs with: the one tuned for its `n_decode` streams (the count at
        load for a number not yet probed; a probe's own count while it runs, for the number
        of streams it probes), or for a step
        that reads prompt tokens (or a pooled decode) the count at load where that is higher
        — or, looked at every _RECHECK_S, the cores other processes leave now where that is
        higher still: a runner loaded while the machine was busy, that only embeds or ranks,
        has no decode steps to tune on."""
        count = self.current
        if n_decode:
            if self._probe is None:
                self.current = count = self._chosen.get(_bucket(n_decode), self.at_load)
            elif n_decode != self._probe[1]:
                # a probe times steps of its own number of streams: the others run with
                # their count meanwhile (with replies of mixed lengths the number changes
                # every few steps, and ran up to 4 x _PROBE_STEPS steps at the probe's count)
                count = self._chosen.get(_bucket(n_decode), self.at_load)
        if not n_prompt:
            return count
        if self._free is not None:
            now = time.monotonic()
            if now - self._checked >= _RECHECK_S:
                self._checked = now
                self.prompt = max(self.at_load, min(self._free(), self.max_threads))
        return max(count, self.prompt)

    def observe(self, seconds: float, n_decode: int, n_prompt: int) -> int | None:
        """Feed one step's time (from its start to the next step's start); returns a thread
        count to change to, or None."""
        if n_prompt or not n_decode or self.max_threads == 1:
            return None  # prompt steps vary with their chunk: only decode steps are compared
        if self._capped:
            return None  # run with fewer threads than the tuner's: says nothing of its count
        if self._probe is not None:
            return self._probing(seconds, n_decode)
        key = (self.current, n_decode)
        self._avg[key] = seconds if key not in self._avg else (
            self._avg[key] + _ALPHA * (seconds - self._avg[key]))
        if key not in self._measured:  # (once a probe has measured it, its figure stands)
            self._best[key] = min(self._best.get(key, seconds), self._avg[key])
        self._since_probe += 1
        bucket = _bucket(n_decode)
        if bucket not in self._chosen:
            self._unprobed[bucket] = steps = self._unprobed.get(bucket, 0) + 1
            if steps >= _FIRST_PROBE:
                return self._start_probe(n_decode)
        slowed = self._avg[key] > _SLOWDOWN * self._best[key]
        if (slowed and self._since_probe >= _PROBE_STEPS) or self._since_probe >= self.period:
            return self._start_probe(n_decode)
        return None

    def _start_probe(self, n_decode: int) -> int:
        free = min(self._free(), self.max_threads) if self._free is not None else 0
        if free > self.current or 0 < free < self.current - 1:
            other = free  # the cores other processes leave now: try them all
        else:
            other = self.current - 1 if self.current > 1 else self.current + 1  # ≤ max_threads
        self._probe = (self.current, n_decode, other, [], [])
        self._probe_steps = 0
        self._since_probe = 0
        self.current = other
        return other

    def _probing(self, seconds: float, n_decode: int) -> int | None:
        """A probe's step: its trial count's steps, then as many back at the count it came
        from, taken in turn so that both see the same load; the medians decide (the first
        step after each change is not counted). Against the moving average of the steps
        before it, a probe read whatever had passed meanwhile as the count's cost: on
        bench/serve_speed.py's load (smollm2's shape, 2 cores), the steps of one stream left
        at the end of 8 clients' replies, while the server read the next requests, put
        2 threads' average at 20 ms against 10 alone, and one stream then decoded with 1
        thread (66-74 tok/s against 84-109 for llama-server, 4 rounds of 5)."""
        came_from, streams, other, trial, control = self._probe
        self._probe_steps += 1
        if n_decode == streams:
            (trial if len(trial) < _PROBE_STEPS else control).append(seconds)
        if len(control) < _PROBE_STEPS:
            if len(trial) == _PROBE_STEPS and not control and self.current != came_from:
                self.current = came_from  # the trial is done: back for as many steps
                self._probe_steps = 0  # (each half has as long to fill)
                return came_from
            if self._probe_steps < 4 * _PROBE_STEPS:
                return None
            self._probe = None  # the streams changed under the probe: give up, go back
            self.current = came_from
            if _bucket(streams) in self._unprobed:
                self._unprobed[_bucket(streams)] = 0  # (tried again after _FIRST_PROBE)
            return came_from
        self._unprobed.pop(_bucket(streams), None)
        self._probe = None
        tried, before = statistics.median(trial[1:]), statistics.median(control[1:])
        for count, figure in ((other, tried), (came_from, before)):
            self._avg[(count, streams)] = self._best[(count, streams)] = figure
            self._measured.add((count, streams))
        if tried < _BETTER * before:  # keep the new count
            self.switches += 1
            self.current = self._chosen[_bucket(streams)] = other
            return other
        self._chosen[_bucket(streams)] = came_from
        return None
