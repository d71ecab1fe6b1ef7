"""One model loaded several times — a runner on each GPU that holds it whole — serving as one.

On N GPUs, N copies of a model that fits one card decode N batches at once, where one copy
split over the cards would pass every token through all of them. Each request goes to the
copy with the fewest requests running or waiting per slot (the first among equals), asked
of each copy's engine as the request arrives, with those just sent to a copy and not yet
queued there counted too; what is not a request (tokens, the template, an
embedding) goes to the first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from localinfer.backends.base import Backend, Generation, ModelInfo, SamplingParams
from localinfer.backends.metrics import EngineStats

__all__ = ["Replicas"]


class Replicas(Backend):
    def __init__(self, members: Sequence[Backend]):
        if not members:
            raise ValueError("replicas of nothing")
        self.members = list(members)
        first = self.members[0].info
        self.info: ModelInfo = dataclasses.replace(
            first, n_slots=sum(m.info.n_slots for m in self.members))
        # requests picked for a copy that has not queued them yet (its engine does not count
        # them): two arriving at once must not both find the same copy idle
        self._starting = [0] * len(self.members)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _least_busy(self) -> Iterator[Backend]:
        with self._lock:
            loads = [(s.active + s.waiting + starting) / max(s.n_slots, 1)
                     if not m.ended else float("inf")  # a copy gone: the others serve on
                     for m, s, starting in zip(self.members, (m.stats() for m in self.members),
                                               self._starting)]
            index = loads.index(min(loads))
            self._starting[index] += 1
        try:
            yield self.members[index]
        finally:
            with self._lock:
                self._starting[index] -= 1

    # ---------------------------------------------------------------- requests: spread
    def start(self, params: SamplingParams, messages: Sequence[Mapping[str, Any]] | None = None,
              prompt: str | Sequence[int] | None = None,
              template_args: Mapping[str, Any] | None = None,
              images: Sequence[Any] = ()) -> tuple[list[int], Generation]:
        with self._least_busy() as member:
            return member.start(params, messages, prompt, template_args, images)

    def generate(self, prompt: str | Sequence[int], params: SamplingParams) -> Generation:
        with self._least_busy() as member:
            return member.generate(prompt, params)

    # ---------------------------------------------------------------- the rest: the first copy
    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self.members[0].tokenize(text, add_special=add_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.members[0].detokenize(tokens)

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]],
                            add_generation_prompt: bool = True,
                            template_args: Mapping[str, Any] | None = None) -> str:
        return self.members[0].apply_chat_template(messages, add_generation_prompt,
                                                   template_args)

    def prompt_tokens(self, messages: Sequence[Mapping[str, Any]],
                      template_args: Mapping[str, Any] | None = None,
                      images: Sequence[Any] = ()) -> list[int]:
        return self.members[0].prompt_tokens(messages, template_args, images)

    def embed(self, text: str) -> tuple[list[float], int]:
        return self.members[0].embed(text)

    def embed_many(self, texts: Sequence[str], stop: threading.Event | None = None,
                   truncate: bool = False) -> tuple[list[list[float]], int]:
        return self.members[0].embed_many(texts, stop, truncate)

    def rerank(self, query: str, documents: Sequence[str], stop: threading.Event | None = None
               ) -> tuple[list[float], int]:
        return self.members[0].rerank(query, documents, stop)

    def fewest_tokens(self, text_bytes: int) -> int:
        return self.members[0].fewest_tokens(text_bytes)

    def infill_tokens(self, prefix: str, suffix: str, extra: Sequence[tuple[str, str]] = (),
                      prompt: str = "", room: int | None = None) -> list[int]:
        return self.members[0].infill_tokens(prefix, suffix, extra, prompt, room)

    # ---------------------------------------------------------------- all of them
    def stats(self) -> EngineStats:
        """The copies' figures added up (threads: the first copy's)."""
        each = [m.stats() for m in self.members]
        summed = {f.name: sum(getattr(s, f.name) for s in each)
                  for f in dataclasses.fields(EngineStats)
                  if f.name != "threads" and isinstance(getattr(each[0], f.name), (int, float))}
        return dataclasses.replace(each[0], **summed)

    def cancel_all(self) -> None:
        for member in self.members:
            member.cancel_all()

    @property
    def ended(self) -> bool:
        """A copy's process is gone: the model is no longer as planned, and its owner loads
        it again (the pool, once the requests on the other copies are done); meanwhile new
        requests go to the copies that live."""
        return any(m.ended for m in self.members)

    def memory_bytes(self) -> int:
        return sum(m.memory_bytes() for m in self.members)

    def close(self) -> None:
        for member in self.members:
            member.close()
