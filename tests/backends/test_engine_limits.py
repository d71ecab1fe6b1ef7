"""The engine's refusals: a full wait queue answers busy, a closed engine answers closed."""

from __future__ import annotations

import pytest

from localinfer.backends.base import SamplingParams, TokenEvent
from localinfer.backends.engine.scheduler import Engine
from localinfer.backends.native.model import NativeModel
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


_TOO_MANY_LOGITS = """
import sys
from localinfer.backends.base import SamplingParams
from localinfer.backends.engine.scheduler import Engine
from localinfer.backends.native.model import NativeModel
from localinfer.errors import EngineError
native = NativeModel(sys.argv[1], n_ctx_total=512, n_slots=2, n_batch=64, n_threads=2,
                     n_outputs=2)
engine = Engine(native, n_slots=2, n_batch=64, draft_tokens=8)  # a lone stream asks for 9
repetitive = native.tokenize("one two three four five six. " * 8 + "one two")
try:
    engine.submit(repetitive, SamplingParams(temperature=0, max_tokens=32)).text()
    print("no error")
except EngineError as exc:
    print(exc)
engine.speculator.draft_tokens = 0
print(engine.submit(list(range(10, 30)), SamplingParams(temperature=0, max_tokens=8)).text()
      != "")  # the engine goes on
"""


def test_a_step_asking_for_more_logits_than_the_context_holds_fails_its_requests_only(
        smollm2_path):
    """llama.cpp aborts the process on a batch asking for more logits than the context
    reserved (n_outputs); the engine refuses such a step instead, and keeps serving."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _TOO_MANY_LOGITS, str(smollm2_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.strip().splitlines()[-2:]
    assert "more than the 2 the context holds" in first, first
    assert second == "True"
