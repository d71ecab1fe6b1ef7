"""Each loaded model in a process of its own: a crash inside llama.cpp costs one runner.

llama.cpp ends its process on conditions Python cannot catch (`abort()`, `GGML_ASSERT`, a failed
device allocation, an RPC worker that goes away). `RunnerBackend` is a `Backend` whose model
lives in a child process (`child.py`: `python -m localinfer.backends.runner.child`, or the
bundled app's own executable with `__runner__`). The parent holds no weights: it sends calls
down the runner's stdin and receives each engine pass's events in one message on its stdout
(the messages of `protocol.py`; whatever llama.cpp prints goes to stderr).

    parent                                            runner (child process)
    RunnerBackend.start ─ Request(rid, Start(…)) ──►  a call thread: LlamaCppBackend.start
                        ◄─ Reply or Refused ────────  accepted, or the error to answer with
    reader (or the loop) ◄─ Events([…]) ────────────  the engine's pass, sent after it
    watchdog thread      ◄─ Beat(steps) ────────────  every BEAT_SECONDS

A runner that ends (a signal, an exit) ends each of its requests with `RunnerDied`; one that
has work and makes no progress for `hang_seconds` (LOCALINFER_RUNNER_TIMEOUT) is killed and
treated the same (an embedding, one llama.cpp call that shows no progress until it ends, is
not watched). A closed runner that ends by a signal is logged.

The parent's side of the pipe is `link.py`; starting processes (and the spare) is `spawn.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from localinfer.backends.base import Backend, Generation, LoadOptions, SamplingParams
from localinfer.backends.metrics import EngineStats
from localinfer.backends.runner import protocol as p
from localinfer.backends.runner.link import Link
from localinfer.errors import EngineClosed, RunnerDied
from localinfer.settings import Settings

__all__ = ["RunnerBackend", "hang_seconds"]


def hang_seconds() -> float:
    """How long a runner with work may show no progress: the runner_timeout setting (120 s,
    generous: one prompt chunk of a big model on a slow CPU takes tens of seconds)."""
    return Settings().runner_timeout


class RunnerBackend(Backend):
    """A model loaded in a runner process; the same interface as the in-process backend.
    A runner that has ended stays ended (`ended`): each call raises RunnerDied, and its
    owner (the model pool, or `run`'s loop) loads the model again through the plan — with
    the memory check a restart here would skip."""

    def __init__(self, path: str | os.PathLike[str], options: LoadOptions,
                 name: str | None = None, *, hang: float | None = None,
                 loop: asyncio.AbstractEventLoop | None = None,
                 stop: threading.Event | None = None):
        """loop: the event loop of a server that uses this model, to read on; stop: set, the
        load ends at once with EngineClosed (see link.Link)."""
        self.name = name or Path(path).stem
        self._link = Link(str(path), options, self.name, hang or hang_seconds(), loop, stop)
        self.info = self._link.info
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

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self._link.call(p.Tokenize(text, add_special))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._link.call(p.Detokenize(list(tokens)))

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]],
                            add_generation_prompt: bool = True,
                            template_args: Mapping[str, Any] | None = None) -> str:
        return self._link.call(p.ApplyChatTemplate([dict(m) for m in messages],
                                                       add_generation_prompt,
                                                       _plain(template_args)))

    def prompt_tokens(self, messages: Sequence[Mapping[str, Any]],
                      template_args: Mapping[str, Any] | None = None,
                      images: Sequence[Any] = ()) -> list[int]:
        return self._link.call(p.PromptTokens([dict(m) for m in messages],
                                                  _plain(template_args), tuple(images)))

    def generate(self, prompt: str | Sequence[int], params: SamplingParams) -> Generation:
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        return self._link.generate(p.Generate(tokens, params))[1]

    def start(self, params: SamplingParams, messages: Sequence[Mapping[str, Any]] | None = None,
              prompt: str | Sequence[int] | None = None,
              template_args: Mapping[str, Any] | None = None,
              images: Sequence[Any] = ()) -> tuple[list[int], Generation]:
        if messages is not None:
            messages = [dict(m) for m in messages]
        elif prompt is not None and not isinstance(prompt, str):
            prompt = list(prompt)
        return self._link.generate(p.Start(params, messages, prompt,
                                               _plain(template_args), tuple(images)))

    def embed(self, text: str) -> tuple[list[float], int]:
        vectors, n_tokens = self.embed_many([text])
        return vectors[0], n_tokens

    def embed_many(self, texts: Sequence[str], stop: threading.Event | None = None,
                   truncate: bool = False) -> tuple[list[list[float]], int]:
        return self._link.call(p.Embed(list(texts), truncate), stop=stop)

    def rerank(self, query: str, documents: Sequence[str], stop: threading.Event | None = None
               ) -> tuple[list[float], int]:
        return self._link.call(p.Rerank(query, list(documents)), stop=stop)

    def stats(self) -> EngineStats:
        """Figures only: a runner gone reads as an idle one."""
        link = self._link
        with contextlib.suppress(RunnerDied, EngineClosed):
            if link.alive:
                return link.call(p.Stats())
        return EngineStats(n_slots=self.info.n_slots, active=0, waiting=0, kv_cells_used=0,
                           kv_cells_total=0, steps=0, tokens_evaluated=0, tokens_generated=0,
                           requests_finished=0, preemptions=0, decode_seconds=0.0,
                           step_seconds=0.0, threads=0)

    def fewest_tokens(self, text_bytes: int) -> int:
        return self._link.call(p.FewestTokens(text_bytes))

    def infill_tokens(self, prefix: str, suffix: str, extra: Sequence[tuple[str, str]] = (),
                      prompt: str = "", room: int | None = None) -> list[int]:
        return self._link.call(p.InfillTokens(prefix, suffix, [tuple(e) for e in extra],
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
        self._link.close()


def _plain(template_args: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return dict(template_args) if template_args else None

