"""The engine's refusals: a full wait queue answers busy, a closed engine answers closed."""

from __future__ import annotations

import pytest

from localinfer.backends.base import SamplingParams, TokenEvent
from localinfer.backends.engine import Engine
from localinfer.backends.llama_native import NativeModel
from localinfer.errors import EngineBusy, EngineClosed


def test_full_queue_is_busy_and_closed_engine_refuses(smollm2_path):
    engine = Engine(NativeModel(str(smollm2_path), n_ctx_total=512, n_slots=1, n_batch=64,
                                n_threads=2), n_slots=1, n_batch=64, max_waiting=1)
    long = SamplingParams(temperature=0, max_tokens=400)
    prompt = list(range(10, 30))
    running = engine.submit(prompt, long)
    assert isinstance(next(iter(running)), TokenEvent)  # it holds the only slot now
    waiting = engine.submit(prompt, long)
    with pytest.raises(EngineBusy, match="1 requests are already waiting"):
        engine.submit(prompt, long)
    running.cancel()
    waiting.cancel()
    for generation in (running, waiting):
        for _ in generation:
            pass
        assert generation.stats.finish_reason == "cancelled"
    engine.close()
    with pytest.raises(EngineClosed):
        engine.submit(prompt, long)
