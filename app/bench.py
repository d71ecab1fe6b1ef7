"""`localinfer bench`: the engine under a mixed workload, against the ceiling and the baseline.

All in one process, same model file, same threads:
- ceiling: a bare loop decoding one batch of N sequences per step (no scheduling, no
  sampling), N = each concurrency level;
- baseline: llama-cpp-python's `Llama` serving the same requests one after another;
- localinfer: the engine with N slots and N closed-loop clients, each sending requests with
  exponential (Poisson) gaps; prompts log-uniform in [min_prompt, max_prompt] tokens,
  outputs uniform in [min_output, max_output] tokens, greedy.
Two scenarios follow: running streams' ITL while a long prompt is prefilled (at two chunk
sizes), and the TTFT of a request whose long system prompt is cached against a cold one.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.native.ggml import ensure_loaded
from localinfer.backends.native.model import NativeModel
from localinfer.backends.llamacpp import LlamaCppBackend, default_threads
from localinfer.backends.metrics import EngineStats, RequestStats
from localinfer.errors import PromptTooLong
from localinfer.model_store.gguf_info import read_gguf_info
from localinfer.backends.native.machine import detect
from localinfer.model_store.hardware import Hardware

__all__ = ["FILLER", "Workload", "closed_loop", "decode_bare", "planned_device", "prefill_label",
           "prompt_tokens", "read_prompt", "run_bench", "time_split", "typical_context"]

SLO_TTFT_S = 2.0
SLO_TPOT_S = 0.100
FILLER = ("The keeper climbed the stairs of the lighthouse each evening, counting the steps "
          "and listening to the sea against the rocks below. ")


@dataclass(frozen=True)
class Workload:
    min_prompt: int = 32
    max_prompt: int = 2000
    min_output: int = 16
    max_output: int = 256
    requests_per_client: int = 2
    mean_gap_s: float = 0.2
    seed: int = 7


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def prompt_tokens(backend: LlamaCppBackend, n_tokens: int, salt: int) -> list[int]:
    text = f"Story {salt}. " + FILLER * (n_tokens // 20 + 2)
    return backend.tokenize(text)[:n_tokens]


# ---------------------------------------------------------------------------- ceiling
def ceiling(path: Path, n_seq: int, n_tokens: int, threads: int, context: int = 0,
            gpu_layers: int = 0) -> float:
    """Decode tok/s of a bare loop: n_seq sequences, one batch per step, a fixed token fed.

    Each sequence starts `context` tokens in (one prefill, copied to the others, untimed):
    attention over a longer context costs real time on a CPU, so the ceiling is measured at
    the context lengths the workload decodes at.
    """
    n_ctx = context + n_tokens + 64
    native = NativeModel(str(path), n_ctx_total=n_ctx * n_seq, n_slots=n_seq,
                         n_batch=max(512, n_seq), n_threads=threads, n_gpu_layers=gpu_layers)
    batch = llama_cpp.llama_batch_init(max(512, n_seq), 0, 1)
    try:
        text = FILLER * (1 + context // 20)
        prompt = native.tokenize(text)[:max(4, context)]
        read_prompt(native, batch, prompt, seq=0)  # sequence 0 reads it, the rest copy it
        for seq in range(1, n_seq):
            llama_cpp.llama_memory_seq_cp(native.memory, 0, seq, -1, -1)
        return decode_bare(native, batch, n_seq, prompt[-1], len(prompt), n_tokens)
    finally:
        llama_cpp.llama_batch_free(batch)
        native.close()


def decode_bare(native: NativeModel, batch, n_seq: int, token: int, start: int,
                n_tokens: int) -> float:
    """Tok/s of the bare loop: `n_tokens` steps, each decoding `token` for sequences
    0..n_seq-1 at positions from `start` on (no sampling, no scheduling). Each step waits
    for its logits, as any loop that samples must (a GPU backend returns before it is done)."""
    started = time.perf_counter()
    for step in range(n_tokens):
        for seq in range(n_seq):
            _put(batch, seq, token, start + step, seq, True)
        batch.n_tokens = n_seq
        llama_cpp.llama_decode(native.ctx, batch)
        llama_cpp.llama_synchronize(native.ctx)
    return n_seq * n_tokens / (time.perf_counter() - started)


def prefill_cost(path: Path, threads: int, lengths: tuple[int, int] = (512, 2048),
                 gpu_layers: int = 0) -> tuple[float, float]:
    """The bare loop's prefill time as a·L + b·L² seconds for L tokens (attention grows with L).

    Fitted through two prompts read in 512-token batches, each timed twice (the faster kept).
    """
    times = [bare_prefill_seconds(path, threads, length, gpu_layers=gpu_layers)
             for length in lengths]
    (l1, l2), (t1, t2) = lengths, times
    b = (t2 / l2 - t1 / l1) / (l2 - l1)
    return t1 / l1 - b * l1, b


def bare_prefill_seconds(path: Path, threads: int, length: int, size: int = 512,
                         reads: int = 2, gpu_layers: int = 0) -> float:
    """Seconds the bare loop takes to read a `length`-token prompt, `size` tokens a batch:
    the fastest of `reads` reads."""
    native = NativeModel(str(path), n_ctx_total=length + 64, n_slots=1, n_batch=size,
                         n_threads=threads, n_gpu_layers=gpu_layers)
    batch = llama_cpp.llama_batch_init(size, 0, 1)
    try:
        prompt = native.tokenize(FILLER * (1 + length // 20))[:length]
        best = math.inf
        for _ in range(reads):
            llama_cpp.llama_memory_clear(native.memory, True)
            started = time.perf_counter()
            read_prompt(native, batch, prompt, seq=0, size=size)
            best = min(best, time.perf_counter() - started)
        return best
    finally:
        llama_cpp.llama_batch_free(batch)
        native.close()


def bare_time(level: dict, cost: tuple[float, float], ceiling_tps: float) -> float:
    """Seconds the bare loop needs for a level's work: its prompts read (cached parts
    excluded), then its output tokens decoded at the ceiling of its concurrency. A lower
    bound: fewer streams than N decode slower than the ceiling of N."""
    a, b = cost
    t = lambda n: a * n + b * n * n  # noqa: E731
    prefill = sum(t(p) - t(c) for p, c in level["prompts"])
    return prefill + level["output_tokens"] / ceiling_tps


def typical_context(work: Workload) -> int:
    """Where the workload's decoding happens: the median prompt plus half a mean reply."""
    return int(math.sqrt(work.min_prompt * work.max_prompt)) + (work.min_output
                                                                 + work.max_output) // 4


def read_prompt(native: NativeModel, batch, prompt: Sequence[int], seq: int,
                size: int = 512) -> None:
    """The bare loop reads a prompt into one sequence, `size` tokens a batch, logits for the
    last."""
    for start in range(0, len(prompt), size):
        chunk = prompt[start:start + size]
        for i, token in enumerate(chunk):
            _put(batch, i, token, start + i, seq, start + i == len(prompt) - 1)
        batch.n_tokens = len(chunk)
        llama_cpp.llama_decode(native.ctx, batch)
    llama_cpp.llama_synchronize(native.ctx)  # timed to the end of the work, on a GPU too


def _put(batch, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
    batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
    batch.seq_id[i][0], batch.logits[i] = seq, logits


# ---------------------------------------------------------------------------- requests
def _requests(backend: LlamaCppBackend, work: Workload, n: int, rng: random.Random
              ) -> list[tuple[list[int], int]]:
    out = []
    for i in range(n):
        length = int(math.exp(rng.uniform(math.log(work.min_prompt), math.log(work.max_prompt))))
        out.append((prompt_tokens(backend, length, rng.randrange(10**6)),
                    rng.randint(work.min_output, work.max_output)))
    return out


def _summary(stats: Sequence[RequestStats], wall: float) -> dict:
    ttfts = [s.ttft for s in stats if s.ttft is not None]
    tpots = [s.tpot for s in stats if s.tpot is not None]
    itls = [x for s in stats for x in s.itls]
    good = [s for s in stats if s.ttft is not None and s.ttft <= SLO_TTFT_S
            and (s.tpot is None or s.tpot <= SLO_TPOT_S)]
    tokens = sum(s.generated_tokens for s in stats)
    return {
        "requests": len(stats), "wall_s": wall, "output_tokens": tokens,
        "output_tps": tokens / wall, "requests_per_s": len(stats) / wall,
        "goodput_requests_per_s": len(good) / wall,
        "ttft_p50_s": _pct(ttfts, 0.5), "ttft_p99_s": _pct(ttfts, 0.99),
        "tpot_p50_s": _pct(tpots, 0.5), "tpot_p99_s": _pct(tpots, 0.99),
        "itl_p50_s": _pct(itls, 0.5), "itl_p99_s": _pct(itls, 0.99),
        "decode_tps_p50": _pct([s.decode_tps for s in stats if s.decode_tps], 0.5),
        "prompts": [(s.prompt_tokens, s.cached_tokens) for s in stats],
    }


def engine_level(path: Path, clients: int, work: Workload, threads: int,
                 step_budget: float | None = None, n_batch: int = 512,
                 gpu_layers: int = 0, step_ms: int = 0) -> dict:
    n_ctx = work.max_prompt + work.max_output + 16
    backend = LlamaCppBackend(path, LoadOptions(n_ctx=n_ctx, n_slots=clients, n_threads=threads,
                                                n_gpu_layers=gpu_layers, step_budget=step_budget,
                                                n_batch=n_batch, step_ms=step_ms))
    try:
        level = {"clients": clients, **closed_loop(backend, clients, work)}
        return {**level, **time_split(backend.stats(), level["wall_s"])}
    finally:
        backend.close()


def time_split(stats: EngineStats, wall: float) -> dict:
    """Where a level's wall time went: inside llama_decode, in the engine's own work around
    it (filling batches, sampling, streaming text), and idle (no request to serve)."""
    return {"llama_decode_share": stats.decode_seconds / wall,
            "engine_share": (stats.step_seconds - stats.decode_seconds) / wall,
            "idle_share": max(0.0, wall - stats.step_seconds) / wall}


def closed_loop(backend: LlamaCppBackend, clients: int, work: Workload) -> dict:
    """`clients` threads, each sending its requests one after another with exponential gaps
    (greedy); the summary of those served, and how many were refused as too long."""
    rng = random.Random(work.seed)
    plans = [_requests(backend, work, work.requests_per_client, rng) for _ in range(clients)]
    gaps = [[rng.expovariate(1 / work.mean_gap_s) for _ in p] for p in plans]
    results: list[RequestStats] = []
    refused = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for (prompt, n_out), gap in zip(plans[i], gaps[i]):
            time.sleep(gap)
            try:
                generation = backend.generate(prompt, SamplingParams(temperature=0,
                                                                     max_tokens=n_out))
            except PromptTooLong:
                with lock:
                    refused.append(len(prompt))
                continue
            generation.text()
            with lock:
                results.append(generation.stats)

    started = time.perf_counter()
    workers = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {**_summary(results, time.perf_counter() - started), "refused": len(refused)}


def baseline(path: Path, work: Workload, n_requests: int, threads: int,
             gpu_layers: int = 0) -> dict:
    """llama-cpp-python's Llama, one request after another (how its server runs them)."""
    from llama_cpp import Llama

    ensure_loaded()  # a build whose backends load at run time has none until then
    llm = Llama(str(path), n_ctx=work.max_prompt + work.max_output + 16, n_threads=threads,
                n_gpu_layers=gpu_layers, verbose=False)
    helper = LlamaCppBackend(path, LoadOptions(n_ctx=256, n_threads=1, n_gpu_layers=0))
    try:
        requests = _requests(helper, work, n_requests, random.Random(work.seed))
    finally:
        helper.close()
    stats = []
    started = time.perf_counter()
    for prompt, n_out in requests:
        s = RequestStats(submitted_at=time.perf_counter())
        s.started_at = s.submitted_at
        s.prompt_tokens = len(prompt)
        llm.reset()
        for _ in llm.create_completion(prompt, max_tokens=n_out, temperature=0, stream=True):
            s.token_times.append(time.perf_counter())
        stats.append(s)
    return _summary(stats, time.perf_counter() - started)


# ---------------------------------------------------------------------------- scenarios
def long_prefill_itl(path: Path, threads: int, chunk: int | None = None, n_running: int = 4,
                     long_prompt: int = 2000, step_budget: float | None = None,
                     n_batch: int = 512, gpu_layers: int = 0, step_ms: int = 0) -> dict:
    """Running streams' ITL while a long prompt is read, against their own median ITL.
    chunk: prompt tokens per slot per step (None: the batch); n_batch: tokens per step."""
    backend = LlamaCppBackend(path, LoadOptions(n_ctx=long_prompt + 300, n_slots=n_running + 1,
                                                n_threads=threads, prefill_chunk=chunk,
                                                n_gpu_layers=gpu_layers,
                                                step_budget=step_budget, n_batch=n_batch,
                                                step_ms=step_ms))
    try:
        bias = {backend.native.eos(): -100}  # keep them running through the whole window
        running = [backend.generate(prompt_tokens(backend, 32, i), SamplingParams(
            temperature=0, max_tokens=400, logit_bias=bias)) for i in range(n_running)]
        time.sleep(1.0)  # all decoding
        reader = backend.generate(prompt_tokens(backend, long_prompt, 99),
                                  SamplingParams(temperature=0, max_tokens=2))
        reader.text()
        window = (reader.stats.started_at, reader.stats.token_times[0])
        for g in running:
            g.cancel()
            g.text()
        during, before = [], []
        for g in running:
            t = g.stats.token_times
            for a, b in zip(t, t[1:]):
                if b < window[0]:
                    before.append(b - a)  # the streams on their own: the reference
                elif b <= window[1]:
                    during.append(b - a)
        median = statistics.median(before)
        p99 = _pct(during, 0.99)
        return {"prefill_chunk": backend.engine.prefill_chunk,
                "step_budget": backend.engine.budget.factor,
                "step_ms": step_ms,
                "median_itl_s": median, "p99_itl_during_prefill_s": p99,
                "ratio": p99 / median if p99 else None,
                "long_prompt_ttft_s": reader.stats.ttft}
    finally:
        backend.close()


def prefill_label(r: dict) -> str:
    if r["step_budget"]:
        return f"step budget {r['step_budget']:g}x a decode step"
    if r.get("step_ms"):
        return f"steps held to {r['step_ms']} ms"
    return f"chunks of {r['prefill_chunk']}, no step budget"


def cached_system_prompt(path: Path, threads: int, system_tokens: int = 1500,
                         gpu_layers: int = 0) -> dict:
    backend = LlamaCppBackend(path, LoadOptions(n_ctx=system_tokens + 300, n_slots=1,
                                                n_threads=threads, n_gpu_layers=gpu_layers))
    try:
        system = backend.detokenize(prompt_tokens(backend, system_tokens, 5))

        def ask(question: str) -> RequestStats:
            g = backend.chat([{"role": "system", "content": system},
                              {"role": "user", "content": question}],
                             SamplingParams(temperature=0, max_tokens=8))
            g.text()
            return g.stats

        cold = ask("What did the keeper count?")
        warm = ask("What did the keeper hear?")
        return {"cold_ttft_s": cold.ttft, "warm_ttft_s": warm.ttft,
                "warm_cached_tokens": warm.cached_tokens, "ratio": warm.ttft / cold.ttft}
    finally:
        backend.close()


def planned_device(path: Path, n_ctx: int, n_slots: int, gpu_layers: int | None = None,
                   hw: Hardware | None = None) -> tuple[int, str]:
    """The GPU layers the planner gives this model on this machine (or the ones asked for),
    and where that puts it, in words."""
    from localinfer.service import gpu_plan

    info = read_gguf_info(path)
    hw = hw or detect()
    if gpu_layers is None:
        chosen = gpu_plan(info, n_ctx, n_slots, hw)
        gpu_layers = chosen.n_gpu_layers if chosen else 0
    if not gpu_layers or not hw.usable_gpus:
        return 0, "CPU"
    layers = min(gpu_layers, info.n_layer + 1)
    return layers, f"GPU {hw.gpus[0].name}, {layers} of {info.n_layer + 1} layers"


def run_bench(path: Path, levels: Sequence[int] = (1, 2, 4, 8, 16), work: Workload = Workload(),
              threads: int | None = None, scenarios: bool = True,
              log: Callable[[str], None] = print, gpu_layers: int | None = None) -> dict:
    """Everything on the device the planner picks for the largest level (or `gpu_layers`)."""
    threads = threads or default_threads()
    layers, device = planned_device(path, work.max_prompt + work.max_output + 16, max(levels),
                                    gpu_layers)
    log(f"device: {device} · {threads} CPU threads")
    on = {"gpu_layers": layers}
    result: dict = {"model": str(path), "device": device, "gpu_layers": layers,
                    "threads": threads, "workload": work.__dict__,
                    "slo": {"ttft_s": SLO_TTFT_S, "tpot_s": SLO_TPOT_S},
                    "ceiling": {}, "ceiling_context": typical_context(work), "levels": []}
    for n in levels:
        result["ceiling"][n] = ceiling(path, n, 64, threads, result["ceiling_context"], **on)
        log(f"ceiling N={n} at {result['ceiling_context']} tokens of context: "
            f"{result['ceiling'][n]:.1f} tok/s")
    result["prefill_cost"] = prefill_cost(path, threads, **on)
    result["baseline"] = baseline(path, work, max(4, work.requests_per_client * 2), threads, **on)
    log(f"baseline (Llama, sequential): {result['baseline']['output_tps']:.1f} tok/s")
    for n in levels:
        level = engine_level(path, n, work, threads, **on)
        # output_vs_ceiling counts prefill time too; decode_vs_ceiling compares n streams'
        # decode speed (median per request × n) with the bare loop of n sequences
        level["ceiling_tps"] = result["ceiling"][n]
        level["output_vs_ceiling"] = level["output_tps"] / result["ceiling"][n]
        level["decode_vs_ceiling"] = (level["decode_tps_p50"] or 0) * n / result["ceiling"][n]
        level["output_vs_baseline"] = level["output_tps"] / result["baseline"]["output_tps"]
        # the same prompts and tokens through the bare loop, as a share of the wall time:
        # 1.0 would mean no time lost to scheduling, sampling or idle cores
        level["bare_vs_wall"] = bare_time(level, result["prefill_cost"],
                                          result["ceiling"][n]) / level["wall_s"]
        result["levels"].append(level)
        log(f"localinfer N={n}: {level['output_tps']:.1f} tok/s, TTFT p50 "
            f"{level['ttft_p50_s']:.2f} s p99 {level['ttft_p99_s']:.2f} s, "
            f"goodput {level['goodput_requests_per_s']:.2f} req/s, the bare loop would need "
            f"{level['bare_vs_wall']:.0%} of that time; {level['llama_decode_share']:.0%} "
            f"inside llama_decode, {level['engine_share']:.1%} in the engine around it")
    if scenarios:
        result["long_prefill"] = [
            long_prefill_itl(path, threads, chunk, step_budget=budget, step_ms=ms, **on)
            for chunk, budget, ms in ((512, None, 0), (32, None, 0), (512, 2.0, 0),
                                      (512, None, 200))]
        for r in result["long_prefill"]:
            log(f"long prefill, {prefill_label(r)}: running streams' P99 ITL "
                f"{r['p99_itl_during_prefill_s']:.3f} s = {r['ratio']:.1f}x their median, "
                f"the long prompt's TTFT {r['long_prompt_ttft_s']:.1f} s")
        short = dataclasses.replace(work, max_prompt=256)
        result["short_prompts"] = [
            engine_level(path, 8, short, threads, step_budget=b, step_ms=ms, **on)
            for b, ms in ((None, 0), (2.0, 0), (None, 200))]
        for r, b in zip(result["short_prompts"], ("no step budget", "step budget 2x",
                                                  "steps held to 200 ms")):
            r["label"] = b
            log(f"8 clients, prompts 32-256 tokens, {b}: TTFT p50 {r['ttft_p50_s']:.2f} s "
                f"p99 {r['ttft_p99_s']:.2f} s")
        result["cached_system"] = cached_system_prompt(path, threads, **on)
        c = result["cached_system"]
        log(f"cached 1500-token system prompt: TTFT {c['warm_ttft_s']:.3f} s vs cold "
            f"{c['cold_ttft_s']:.3f} s ({c['ratio']:.1%})")
    return result
