"""Where a loaded model runs — a runner process of its own (the default), or this process —
and the spare runner a command starts ahead of its load.

Light to import (no model store, no llama.cpp): a command starts its spare before it imports
`localinfer.service` (~0.4 s on a 2-core machine), so the spare's interpreter and llama.cpp
load meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading

    from localinfer.backends.base import Backend, LoadOptions

__all__ = ["BackendFactory", "llama_cpp_backend", "runner_backend", "warm_runner"]

# (path, options, name, loop=None, stop=None): loop is the event loop of the server that will
# use it; stop, once set, ends a load still running (its owner is shutting down)
BackendFactory = Callable[..., "Backend"]


def llama_cpp_backend(path: Path, options: LoadOptions, name: str,
                      loop: asyncio.AbstractEventLoop | None = None,
                      stop: threading.Event | None = None) -> Backend:
    """The model in this process (benchmarks and tests of the engine itself); its load,
    one llama.cpp call, cannot be stopped."""
    from localinfer.backends.llamacpp import LlamaCppBackend  # loads the native library

    return LlamaCppBackend(path, options, name=name)


def runner_backend(path: Path, options: LoadOptions, name: str,
                   loop: asyncio.AbstractEventLoop | None = None,
                   stop: threading.Event | None = None) -> Backend:
    """The model in a runner process of its own: a crash inside llama.cpp ends that runner,
    not the program that uses it. loop: a server's, to read the runner's events on; stop:
    set, the load ends at once (its runner killed) with EngineClosed."""
    from localinfer.backends.runner.process import RunnerBackend

    return RunnerBackend(path, options, name=name, loop=loop, stop=stop)


def warm_runner(factory: BackendFactory = runner_backend) -> None:
    """Before planning a load by `factory`: a runner's process starts meanwhile (see
    spawn.warm_spare), so the load that follows waits less (bench/results/runner_start.md)."""
    if factory is runner_backend:
        from localinfer.backends.runner.spawn import warm_spare

        warm_spare()
