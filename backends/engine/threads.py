"""How many CPU threads llama.cpp gets: the cores that are free, re-chosen as the load changes.

llama.cpp's threads meet at a barrier after every operation of a step, so one thread that
another process keeps off its core holds all the others up: with one busy neighbour on two
cores, two threads decode at a third of their idle speed, one thread at two thirds
(measured: 39 against 71-77 tok/s, idle 108-139). One thread per core, the default of
llama.cpp and Ollama, is right only on an idle machine.

- At load: as many threads as the physical cores other processes leave free (`free_cores`).
- While running (`ThreadTuner`): decode-only steps are timed per thread count and per number
  of streams (moving averages). When the steps of the current count slow down by a third
  against the best it has shown — a neighbour started — or every `period` steps, the tuner
  runs a few steps with another count and keeps whichever was faster: the cores other
  processes leave now (`OthersLoad`, since the last probe) where that differs from the
  current count by more than one — a neighbour started, or one busy at load stopped — else
  one thread fewer.
- A step that reads prompt tokens runs with the count chosen at load (or the tuned one where
  it is higher): its matrix products keep every thread busy between barriers, so the light
  load of the server's own parent and clients costs it little, while one thread fewer
  halves it. Tuned on decode steps alone, a 3,000-token prompt read beside a running stream
  took 2.1x as long as alone (1 thread); with the count at load, 1.0x
  (bench/results/long_prompt_gap.md).
  A user's explicit --threads is never changed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

__all__ = ["OthersLoad", "ThreadTuner", "free_cores", "physical_cores"]

_ALPHA = 0.25  # weight of the newest step in a moving average
_SLOWDOWN = 1.35  # steps this much slower than the count's best: the load changed, probe
_PROBE_STEPS = 5  # decode-only steps timed at the other count (the first is not counted)
_BETTER = 0.92  # a count must be this much faster to replace the current one
_RECHECK_S = 5.0  # how often a prompt step may raise its count to the cores free now


def physical_cores() -> int:
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def free_cores(sample_s: float = 0.1) -> int:
    """Physical cores left over by other processes, measured over `sample_s`: at least one."""
    cores = physical_cores()
    logical = psutil.cpu_count() or cores
    busy = psutil.cpu_percent(interval=sample_s) / 100 * logical  # logical CPUs in use
    busy_cores = busy * cores / logical
    return max(1, min(cores, round(cores - busy_cores)))


class OthersLoad:
    """The physical cores other processes leave free, over the time since the last call: the
    machine's busy time less this process's own (its llama.cpp threads spin while they wait)."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._last = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        times = psutil.cpu_times()
        busy = sum(times) - times.idle - sum(getattr(times, name, 0.0) for name in (
            "iowait", "guest", "guest_nice"))  # (Linux counts a guest's time in user too)
        own = self._process.cpu_times()
        return time.monotonic(), busy, own.user + own.system

    def __call__(self) -> int:
        then, self._last = self._last, self._sample()
        elapsed = self._last[0] - then[0]
        cores = physical_cores()
        if elapsed <= 0:
            return cores
        others = max(0.0, (self._last[1] - then[1]) - (self._last[2] - then[2])) / elapsed
        logical = psutil.cpu_count() or cores
        return max(1, min(cores, round(cores - others * cores / logical)))


class ThreadTuner:
    def __init__(self, start: int, max_threads: int, period: int = 512,
                 free: Callable[[], int] | None = None):
        self.current = max(1, min(start, max_threads))
        self.at_load = self.current
        self.prompt = self.current  # for steps that read prompt tokens: at least the count at load
        self.max_threads = max(1, max_threads)
        self.period = period
        self._avg: dict[tuple[int, int], float] = {}  # (threads, streams) → seconds a step
        self._best: dict[tuple[int, int], float] = {}
        self._since_probe = 0
        self._probe: tuple[int, int, list[float]] | None = None  # (from, streams, times)
        self._probe_steps = 0  # steps since the probe began, of any number of streams
        self.switches = 0
        # the cores free of other processes now (None: only one thread fewer is tried)
        self._free = free if free is not None else (OthersLoad() if max_threads > 1 else None)
        self._checked = time.monotonic()  # when the prompt count last looked for free cores

    def for_step(self, n_prompt: int) -> int:
        """The count a step runs with: the tuned one, or for a step that reads prompt tokens
        (or a pooled decode) the count at load where that is higher — or, looked at every
        _RECHECK_S, the cores other processes leave now where that is higher still: a runner
        loaded while the machine was busy, that only embeds or ranks, has no decode steps to
        tune on."""
        if not n_prompt:
            return self.current
        if self._free is not None:
            now = time.monotonic()
            if now - self._checked >= _RECHECK_S:
                self._checked = now
                self.prompt = max(self.at_load, min(self._free(), self.max_threads))
        return max(self.current, self.prompt)

    def observe(self, seconds: float, n_decode: int, n_prompt: int) -> int | None:
        """Feed one step's time; returns a thread count to change to, or None."""
        if n_prompt or not n_decode or self.max_threads == 1:
            return None  # prompt steps vary with their chunk: only decode steps are compared
        if self._probe is not None:
            return self._probing(seconds, n_decode)
        key = (self.current, n_decode)
        self._avg[key] = seconds if key not in self._avg else (
            self._avg[key] + _ALPHA * (seconds - self._avg[key]))
        self._best[key] = min(self._best.get(key, seconds), self._avg[key])
        self._since_probe += 1
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
        self._probe = (self.current, n_decode, [])
        self._probe_steps = 0
        self._since_probe = 0
        self.current = other
        return other

    def _probing(self, seconds: float, n_decode: int) -> int | None:
        came_from, streams, times = self._probe
        self._probe_steps += 1
        if n_decode == streams:
            times.append(seconds)
        if len(times) < _PROBE_STEPS:
            if self._probe_steps < 4 * _PROBE_STEPS:
                return None
            self._probe = None  # the streams changed under the probe: give up, go back
            self.current = came_from
            return came_from
        self._probe = None
        trial = sum(times[1:]) / (len(times) - 1)
        before = self._avg[(came_from, streams)]
        self._avg[(self.current, streams)] = trial
        self._best[(self.current, streams)] = trial
        self._best[(came_from, streams)] = before  # its best under this load, not the old one
        if trial < _BETTER * before:  # keep the new count
            self.switches += 1
            return None
        self.current = came_from
        return came_from
