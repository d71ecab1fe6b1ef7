"""Copies of one model served as one (replicas.py): each request to the least busy copy,
over real engines on the fake model (fake_native.py), in milliseconds."""

from __future__ import annotations

import threading
import time

import pytest
from collections.abc import Sequence

from localinfer.backends.base import Backend, Generation, ModelInfo, SamplingParams
from localinfer.backends.engine.scheduler import Engine
from localinfer.backends.runner.replicas import Replicas
from localinfer.errors import InvalidRequest

from .fake_native import FakeNative, reference, text

GREEDY = SamplingParams(temperature=0, max_tokens=8)


def settled_loads(copies: Replicas, expected: list[int]) -> list[int]:
    """Each copy's requests, running or waiting, once they read `expected` (or after 2 s):
    an engine's figures may be caught while it moves a request from its queue to a slot."""
    deadline = time.monotonic() + 2
    while True:
        loads = [s.active + s.waiting for s in (m.stats() for m in copies.members)]
        if loads == expected or time.monotonic() > deadline:
            return loads
        time.sleep(0.01)


class EngineBackend(Backend):
    """A Backend over an engine on the fake model: requests only."""

    def __init__(self, n_slots: int = 1, trip: float = 0.0):
        self.trip = trip  # seconds before the engine has the request (a runner's round trip)
        self.native = FakeNative(n_ctx=256 * n_slots)
        self.engine = Engine(self.native, n_slots=n_slots, n_batch=64)
        self.info = ModelInfo("fake", "", "fake", "F16", 256, 4096, n_slots, 0, 0)

    def generate(self, prompt: str | Sequence[int], params: SamplingParams) -> Generation:
        time.sleep(self.trip)
        return self.engine.submit(prompt, params)

    def stats(self):
        return self.engine.stats()

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return [ord(c) % 97 for c in text]

    def detokenize(self, tokens):
        raise NotImplementedError

    def apply_chat_template(self, messages, add_generation_prompt=True):
        raise NotImplementedError

    def embed(self, text):
        raise NotImplementedError

    def close(self) -> None:
        self.native.gate.set()
        self.engine.close()


def test_requests_go_to_the_least_busy_copy_and_the_replies_are_the_models():
    copies = Replicas([EngineBackend(), EngineBackend()])
    try:
        for member in copies.members:
            member.native.gate.clear()  # hold the decodes: the requests stay in the engines
        prompts = [[1 + i, 2, 3] for i in range(4)]
        generations = [copies.generate(p, GREEDY) for p in prompts]
        assert settled_loads(copies, [2, 2]) == [2, 2]
        summed = copies.stats()
        assert summed.waiting + summed.active == 4
        assert copies.info.n_slots == 2
        for member in copies.members:
            member.native.gate.set()
        for prompt, generation in zip(prompts, generations):
            assert generation.text() == text(reference(prompt, 8))
        assert copies.stats().requests_finished == 4
    finally:
        copies.close()


def test_requests_arriving_together_are_spread_too():
    """Many at once, each taking a while to reach its copy's engine (a runner's round trip):
    each is counted against its copy from the moment it is picked, so they do not all pile
    onto the copy that looked idle."""
    copies = Replicas([EngineBackend(trip=0.02) for _ in range(3)])
    try:
        for member in copies.members:
            member.native.gate.clear()
        go = threading.Barrier(12)
        generations = []

        def send(i: int) -> None:
            go.wait()
            generations.append(copies.generate([1 + i, 2, 3], GREEDY))

        threads = [threading.Thread(target=send, args=(i,)) for i in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert settled_loads(copies, [4, 4, 4]) == [4, 4, 4]
        for member in copies.members:
            member.native.gate.set()
        assert all(g.text() for g in generations)
    finally:
        copies.close()


def test_a_start_passes_its_images_to_the_copy_it_goes_to():
    """core.start hands every backend the request's images (vision.py): the copies take
    them as a single model does — here a model without a projector, which refuses them."""
    copies = Replicas([EngineBackend(), EngineBackend()])
    try:
        tokens, generation = copies.start(GREEDY, None, [1, 2, 3], None, ())
        assert tokens == [1, 2, 3] and generation.text()
        with pytest.raises(InvalidRequest, match="takes no images"):
            copies.start(GREEDY, None, [1, 2, 3], None, ("a picture",))
    finally:
        copies.close()
