"""Starting runner processes: a fresh one, or the spare started ahead of a load.

A runner is `python -m localinfer.backends.runner.child` (the bundled app's own executable
with `__runner__`), in a session of its own so that a Ctrl-C or a terminal's hang-up reaches
the parent, not it. `warm_spare` starts the next load's runner early: its interpreter and
llama.cpp load while the parent reads the model's header and plans.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

from localinfer.model_store.hardware import SERVER_PID, by_bus
from localinfer.settings import debug

__all__ = ["OMP_SPINS", "dismiss", "how", "spawn", "take", "warm_spare"]


def how(exitcode: int | None) -> str:
    """A process's end in words: its exit status or the signal that ended it."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


# How long llama.cpp's idle OpenMP threads spin before they sleep, in libgomp's spins (~23
# ns each on a 2-core EPYC). libgomp's own default, 300,000 (~7 ms there), outlasts a whole
# decode step of a small model or a GPU's: after each step the team spins on while the engine
# samples and sends the step's events, and the parent and the clients that read them, woken,
# find no free core, so they preempt the engine or one of llama.cpp's threads. Bounded to ~70
# µs, longer than the waits at llama.cpp's barriers inside a step. On bench/random_gguf.py's
# fast-step model through a runner on 2 cores (a GPU's step rate), 7 rounds: one stream 1.15x
# the tokens/s with 39% less of the runner's CPU a token, 8 streams 1.08x; smollm2 1.03x and
# 1.01x (bench/results/omp_wait.md). A user's own GOMP_SPINCOUNT or OMP_WAIT_POLICY stays.
OMP_SPINS = "3000"


def _environment() -> dict[str, str]:
    """The environment a runner started now gets: this process's, with what a runner needs."""
    # when llama.cpp aborts it (a worker lost), it ends at once with a line on stderr rather
    # than attaching a debugger for a backtrace (seconds, and pages in the server's log)
    env = {**os.environ, **({} if debug() else {"GGML_NO_BACKTRACE": "1"}),
           # whose processes' mapped weights its memory checks count as in use
           SERVER_PID: str(os.getpid())}
    if "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env:
        env["GOMP_SPINCOUNT"] = OMP_SPINS  # (read once, as libgomp loads)
    # as this process sets its own once it plans (`ggml.ensure_loaded`): a spare started
    # before then has the environment of one started after
    by_bus(env)
    return env


def spawn(env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A new runner process, waiting for its Load (`env`: `_environment()`'s)."""
    command = ([sys.executable, "__runner__"] if getattr(sys, "frozen", False)
               else [sys.executable, "-m", "localinfer.backends.runner.child"])
    # its own session: a Ctrl-C or a terminal's hang-up goes to us, not to it
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                            start_new_session=os.name == "posix",
                            env=env if env is not None else _environment())


_spare: tuple[subprocess.Popen[bytes], dict[str, str]] | None = None
_spare_lock = threading.Lock()


def warm_spare() -> None:
    """Start the next load's runner now: its interpreter and llama.cpp (~0.25 s) load while
    the caller reads the model's header and plans. It waits for a model to be named, and
    ends with its parent (its pipe reads end-of-file)."""
    global _spare
    with _spare_lock:
        if _spare is None or _spare[0].poll() is not None:
            env = _environment()
            _spare = spawn(env), env


def take() -> subprocess.Popen[bytes]:
    """The spare runner if it is waiting and started with the environment a runner started
    now would get (tests set variables a runner reads), else a new one."""
    global _spare
    with _spare_lock:
        spare, _spare = _spare, None
    if spare is not None:
        process, env = spare
        if process.poll() is None and env == _environment():
            return process
        dismiss(process)
    return spawn()


def dismiss(process: subprocess.Popen[bytes]) -> None:
    """End a runner that was never given a model. It holds nothing, so it is killed: told by
    end-of-file, it would end only once it had loaded llama.cpp (it reads its pipe after),
    and a load that waited for it waited that long."""
    for stream in (process.stdin, process.stdout):
        with contextlib.suppress(OSError):
            stream.close()
    with contextlib.suppress(OSError):
        process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)  # (one stuck in a driver's call ends when it returns)
