"""Tokens a step on a CPU: what a prompt token costs at each batch size, and what 128
tokens a step would change against the default, 512 (as llama.cpp's own server reads
prompts). Measured to decide the default: it stays 512 (see the results).

    python3 bench/prefill_batch.py [--reps 2] [--replot] [--results FOLDER]

1. The bare loop reads a 1024-token prompt in batches of 32 … 512 tokens (best of 3):
   prompt tok/s at each size, and its ratio to 512's.
2. The engine with 512 tokens a step and with 128, alternating, `--reps` rounds each:
   - a lone 2000-token prompt: its TTFT (nobody else waiting, so only the cost per token
     matters);
   - 4 streams generating while a 2000-token prompt is read: their P99 ITL during the read
     against their median before it, and the long prompt's TTFT;
   - 8 clients with prompts of 32–256 tokens (Poisson gaps): TTFT p50 / p99, output tok/s.
   Ratios are 128 ÷ 512 within each round, median over rounds.
Writes bench/results/prefill_batch.{json,png,md}.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
from pathlib import Path

import harness
from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.llamacpp import LlamaCppBackend, default_threads
from localinfer.bench import (Workload, bare_prefill_seconds, engine_level, long_prefill_itl,
                              prompt_tokens)
from localinfer.model_store.sources import resolve

MODELS = ("smollm2:135m", "gemma3:270m")
SIZES = (32, 64, 128, 256, 512)
LONG = 2000
SMALL = 128  # tokens a step against the default 512


def bare_prefill(path: Path, threads: int, length: int = 1024) -> dict[int, float]:
    """Prompt tok/s of the bare loop at each batch size (the best of 3 reads)."""
    tps = {}
    for size in SIZES:
        tps[size] = length / bare_prefill_seconds(path, threads, length, size, reads=3)
        print(f"  bare loop, {size} tokens a batch: {tps[size]:.0f} prompt tok/s", flush=True)
    return tps


def lone_ttft(path: Path, threads: int, n_batch: int | None) -> float:
    backend = LlamaCppBackend(path, LoadOptions(n_ctx=LONG + 64, n_threads=threads,
                                                n_gpu_layers=0, n_batch=n_batch))
    try:
        g = backend.generate(prompt_tokens(backend, LONG, 3),
                             SamplingParams(temperature=0, max_tokens=2))
        g.text()
        return g.stats.ttft
    finally:
        backend.close()


def one_round(path: Path, threads: int, n_batch: int | None) -> dict:
    short = dataclasses.replace(Workload(), max_prompt=256)
    burst = engine_level(path, 8, short, threads, n_batch=n_batch)
    long = long_prefill_itl(path, threads, n_batch=n_batch, long_prompt=LONG)
    return {"lone_ttft_s": lone_ttft(path, threads, n_batch),
            "itl_ratio": long["ratio"], "p99_itl_s": long["p99_itl_during_prefill_s"],
            "long_ttft_s": long["long_prompt_ttft_s"],
            "burst_ttft_p50_s": burst["ttft_p50_s"], "burst_ttft_p99_s": burst["ttft_p99_s"],
            "burst_output_tps": burst["output_tps"]}


def bench_model(path: Path, threads: int, reps: int) -> dict:
    result = {"bare_prefill_tps": bare_prefill(path, threads), "rounds": []}
    for rep in range(reps):
        order = (512, SMALL) if rep % 2 == 0 else (SMALL, 512)
        runs = {}
        for n_batch in order:
            runs[n_batch] = one_round(path, threads, n_batch)
            r = runs[n_batch]
            print(f"  {n_batch} a step: lone TTFT {r['lone_ttft_s']:.2f} s; "
                  f"while read, P99 ITL {r['itl_ratio']:.1f}x median, long TTFT "
                  f"{r['long_ttft_s']:.1f} s; 8 clients TTFT p50 {r['burst_ttft_p50_s']:.2f} "
                  f"p99 {r['burst_ttft_p99_s']:.2f} s, {r['burst_output_tps']:.1f} tok/s",
                  flush=True)
        result["rounds"].append(runs)
    keys = result["rounds"][0][512]
    result["median"] = {b: {k: statistics.median(r[b][k] for r in result["rounds"]) for k in keys}
                        for b in (512, SMALL)}
    result["ratio"] = {k: statistics.median(r[SMALL][k] / r[512][k]
                                            for r in result["rounds"]) for k in keys}
    return result


def main() -> None:
    parser = harness.arguments(__doc__, reps=2)
    parser.add_argument("--replot", action="store_true",
                        help="rewrite the md and png from the saved JSON")
    args = parser.parse_args()
    if args.replot:
        saved = json.loads((args.results / "prefill_batch.json").read_text())
        _write(saved["meta"], saved["results"], args.results)
        return
    logging.getLogger("localinfer.llama_cpp").setLevel(logging.ERROR)
    threads = default_threads()
    results = {}
    for name in MODELS:
        print(f"== {name}", flush=True)
        results[name] = bench_model(resolve(name, harness.STORE).path, threads, args.reps)
    meta = harness.run_facts(models=list(MODELS), threads=threads, reps=args.reps,
                             small_batch=SMALL)
    _write(meta, json.loads(json.dumps(results)), args.results)  # keys as the JSON has them


def _write(meta: dict, results: dict, folder: Path) -> None:
    harness.write("prefill_batch", meta, results, _markdown(meta, results), _plot(results),
                  folder=folder)


_ROWS = (("lone_ttft_s", "a lone 2000-token prompt: TTFT (s)", ".2f"),
         ("itl_ratio", "4 streams while it is read: P99 ITL ÷ their median", ".1f"),
         ("long_ttft_s", "… and the long prompt's TTFT (s)", ".1f"),
         ("burst_ttft_p50_s", "8 clients, prompts 32–256: TTFT p50 (s)", ".2f"),
         ("burst_ttft_p99_s", "8 clients, prompts 32–256: TTFT p99 (s)", ".2f"),
         ("burst_output_tps", "8 clients, prompts 32–256: output tok/s", ".1f"))


def _markdown(meta: dict, results: dict) -> list[str]:
    small = meta["small_batch"]
    lines = [f"# Tokens a step on a CPU: {small} against 512", "",
             f"{meta['threads']} threads. The bare loop reads a 1024-token prompt at each "
             "batch size (best of 3); the engine runs with 512 tokens a step (the default, as "
             f"llama.cpp's server reads prompts) and with {small}, alternating, "
             f"{meta['reps']} rounds; medians, and the median of each round's ratio.", "",
             _verdict(small, results), ""]
    for name, r in results.items():
        bare = r["bare_prefill_tps"]
        lines += [f"## {name}", "", "| tokens a batch | " + " | ".join(map(str, bare)) + " |",
                  "|---" * (len(bare) + 1) + "|",
                  "| prompt tok/s | " + " | ".join(f"{v:.0f}" for v in bare.values()) + " |",
                  "| ÷ 512's | " + " | ".join(f"{v / bare['512']:.2f}" for v in bare.values())
                  + " |", "",
                  f"| | 512 a step | {small} a step | ratio |", "|---|---|---|---|"]
        for key, label, fmt in _ROWS:
            lines.append(f"| {label} | {r['median']['512'][key]:{fmt}} | "
                         f"{r['median'][str(small)][key]:{fmt}} | {r['ratio'][key]:.2f} |")
        lines.append("")
    return lines[:-1]


def _verdict(small: int, results: dict) -> str:
    """The reading of this run's ratios (small ÷ 512), in words."""
    span = lambda key, scale=1: "–".join(  # noqa: E731
        f"{scale * v:.0f}" for v in sorted({round(r["ratio"][key], 2) for r in results.values()}))
    return (f"**The trade, in this run.** {small} prompt tokens a step against 512: running "
            f"streams' P99 ITL while a long prompt is read × {span('itl_ratio', 100)}%; "
            f"under 8 clients with short prompts, P99 TTFT × {span('burst_ttft_p99_s', 100)}% "
            f"and output tok/s × {span('burst_output_tps', 100)}%. The streams that start "
            f"first take a decode turn in every one of the more numerous steps, ahead of the "
            f"prompts still waiting. The default stays 512 unless these say otherwise; "
            f"`--step-budget` is the option for smooth streams.")


def _plot(results: dict):
    fig, axes = harness.figure(2, 1, size=(5.5, 4))
    left, right = axes[0]
    for name, r in results.items():
        bare = r["bare_prefill_tps"]
        left.plot([int(k) for k in bare], [v / bare["512"] for v in bare.values()], marker="o",
                  label=name)
    left.axhline(1.0, color="gray", linestyle="--")
    left.set_xscale("log", base=2)
    left.set_xlabel("tokens a batch (bare loop)")
    left.set_ylabel("prompt tok/s ÷ at 512")
    left.legend()
    width = 0.4
    for i, (name, r) in enumerate(results.items()):
        ratios = [r["ratio"][key] for key, _, _ in _ROWS]
        left_edge = [x + (i - 0.5) * width for x in range(len(ratios))]
        right.bar(left_edge, ratios, width, label=name)
    right.axhline(1.0, color="gray", linestyle="--")
    right.set_xticks(range(len(_ROWS)), ["lone\nTTFT", "ITL P99\n÷ median", "long\nTTFT",
                                         "burst\nTTFT p50", "burst\nTTFT p99", "burst\ntok/s"],
                     fontsize=8)
    right.set_ylabel(f"engine at {SMALL} a step ÷ at 512")
    right.legend()
    return fig


if __name__ == "__main__":
    main()
