"""Prometheus metrics: request counts by route and status, latency histograms, tokens,
and the engines' own state (queue, active slots, KV cells) read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from localinfer.backends.metrics import RequestStats

if TYPE_CHECKING:
    from localinfer.api.core import Job
    from localinfer.pool import ModelPool

__all__ = ["REGISTRY", "observe", "render", "track_pool"]

REGISTRY = CollectorRegistry(auto_describe=True)
_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
_PER_TOKEN = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1)

REQUESTS = Counter("localinfer_http_requests", "HTTP requests by route and status",
                   ["route", "method", "status"], registry=REGISTRY)
TTFT = Histogram("localinfer_ttft_seconds", "time to first token", ["model"],
                 buckets=_LATENCY, registry=REGISTRY)
TPOT = Histogram("localinfer_tpot_seconds", "time per output token after the first", ["model"],
                 buckets=_PER_TOKEN, registry=REGISTRY)
E2EL = Histogram("localinfer_e2el_seconds", "end-to-end latency of a generation", ["model"],
                 buckets=_LATENCY, registry=REGISTRY)
QUEUE = Histogram("localinfer_queue_seconds", "time waiting for a slot", ["model"],
                  buckets=_LATENCY, registry=REGISTRY)
PROMPT_TOKENS = Counter("localinfer_prompt_tokens", "prompt tokens received", ["model"],
                        registry=REGISTRY)
CACHED_TOKENS = Counter("localinfer_cached_prompt_tokens", "prompt tokens served from the cache",
                        ["model"], registry=REGISTRY)
GENERATED_TOKENS = Counter("localinfer_generated_tokens", "tokens generated", ["model"],
                           registry=REGISTRY)


def observe(job: Job, stats: RequestStats | None) -> None:
    if stats is None:
        return
    model = job.model.name
    for histogram, value in ((TTFT, stats.ttft), (TPOT, stats.tpot), (E2EL, stats.e2el),
                             (QUEUE, stats.queue_time)):
        if value is not None:
            histogram.labels(model).observe(value)
    PROMPT_TOKENS.labels(model).inc(stats.prompt_tokens)
    CACHED_TOKENS.labels(model).inc(stats.cached_tokens)
    GENERATED_TOKENS.labels(model).inc(stats.generated_tokens)


class _PoolCollector(Collector):
    def __init__(self, pool: ModelPool):
        self.pool = pool

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        models = self.pool.loaded()
        yield GaugeMetricFamily("localinfer_models_loaded", "models in memory", value=len(models))
        yield GaugeMetricFamily("localinfer_models_loading", "models being loaded",
                                value=len(self.pool.loading))
        gauges = {
            "active": GaugeMetricFamily("localinfer_slots_active", "slots with a request",
                                        labels=["model"]),
            "n_slots": GaugeMetricFamily("localinfer_slots", "slots", labels=["model"]),
            "waiting": GaugeMetricFamily("localinfer_requests_waiting", "requests queued for a slot",
                                         labels=["model"]),
            "kv_cells_used": GaugeMetricFamily("localinfer_kv_cells_used",
                                               "KV cache cells holding tokens", labels=["model"]),
            "kv_cells_total": GaugeMetricFamily("localinfer_kv_cells", "KV cache cells",
                                                labels=["model"]),
            "steps": GaugeMetricFamily("localinfer_decode_steps", "llama_decode calls so far",
                                       labels=["model"]),
            "threads": GaugeMetricFamily("localinfer_threads", "CPU threads llama.cpp decodes "
                                         "with now (tuned to the cores left free)",
                                         labels=["model"]),
            "preemptions": GaugeMetricFamily(
                "localinfer_preemptions", "requests whose KV was dropped to make room so far "
                "(--kv-unified)", labels=["model"]),
            "saved_bytes": GaugeMetricFamily(
                "localinfer_saved_prompt_bytes", "bytes of RAM holding saved prompts' state "
                "(--cache-ram)", labels=["model"]),
        }
        # time spent, so rate() tells how busy the engine is and what it adds to llama.cpp
        seconds = {
            "step_seconds": CounterMetricFamily(
                "localinfer_engine_step_seconds", "seconds in engine steps (batch, decode, "
                "sampling)", labels=["model"]),
            "decode_seconds": CounterMetricFamily(
                "localinfer_llama_decode_seconds", "seconds inside llama_decode", labels=["model"]),
        }
        # a hybrid or recurrent model's slots gone back to a context checkpoint
        counts = {
            "checkpoints_restored": CounterMetricFamily(
                "localinfer_checkpoints_restored", "context checkpoints restored (a recurrent "
                "state gone back to an earlier point of a prompt)", labels=["model"]),
            "checkpoint_tokens": CounterMetricFamily(
                "localinfer_checkpoint_tokens", "prompt tokens kept by restored context "
                "checkpoints instead of read again", labels=["model"]),
            # prompts kept in RAM when their slot took another request (--cache-ram)
            "prompts_saved": CounterMetricFamily(
                "localinfer_prompts_saved", "slots' sequences saved in RAM when another "
                "request took their slot", labels=["model"]),
            "prompts_restored": CounterMetricFamily(
                "localinfer_prompts_restored", "saved sequences put back into a slot for a "
                "prompt that shares them", labels=["model"]),
            "restored_tokens": CounterMetricFamily(
                "localinfer_restored_prompt_tokens", "prompt tokens kept by saved sequences "
                "put back instead of read again", labels=["model"]),
        }
        for model in models:
            stats = model.backend.stats()
            for key, family in {**gauges, **seconds, **counts}.items():
                family.add_metric([model.name], getattr(stats, key))
        yield from gauges.values()
        yield from seconds.values()
        yield from counts.values()


_tracked: dict[int, _PoolCollector] = {}


def track_pool(pool: ModelPool) -> None:
    if id(pool) not in _tracked:
        _tracked[id(pool)] = _PoolCollector(pool)
        REGISTRY.register(_tracked[id(pool)])


def render() -> bytes:
    return generate_latest(REGISTRY)
