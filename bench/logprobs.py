"""What asking for log probabilities costs decoding, against the same requests without.

    python3 bench/logprobs.py [--tokens 96] [--reps 5] [--results FOLDER]

N streams (1 and 8) decode together from short prompts, greedy, with no log probabilities,
with each written token's (logprobs 0), and with the 20 likeliest tokens' too (OpenAI's
most): each is a log-softmax over the whole vocabulary of the token's logits (backends/
llama_native.py `logprob`), computed on the engine's thread — a request that asks none pays
nothing. Reported: output tok/s of each and its ratio to none within each round (median over
rounds, the order turned each round), on smollm2 (49k tokens) and gemma3 (262k). Writes
bench/results/logprobs.{json,png,md}.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

import harness
from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.llamacpp import LlamaCppBackend, default_threads
from localinfer.model_store.sources import resolve

MODELS = ("smollm2:135m", "gemma3:270m")
CASES = {"none": None, "logprobs": 0, "top 20": 20}


def _run(backend: LlamaCppBackend, n: int, logprobs: int | None, tokens: int) -> float:
    bias = {backend.native.eos(): -100}  # every stream writes all its tokens
    prompts = [backend.tokenize(f"Story {i}: the keeper of the lighthouse") for i in range(n)]
    started = time.perf_counter()
    gens = [backend.generate(p, SamplingParams(temperature=0, max_tokens=tokens,
                                               logit_bias=bias, logprobs=logprobs))
            for p in prompts]
    for g in gens:
        g.text()
    return sum(g.stats.generated_tokens for g in gens) / (time.perf_counter() - started)


def bench_model(path: Path, tokens: int, reps: int, threads: int) -> list[dict]:
    rows = []
    for n in (1, 8):
        backend = LlamaCppBackend(path, LoadOptions(n_ctx=256, n_slots=n, n_threads=threads))
        try:
            _run(backend, n, None, 8)  # warm up
            runs: dict[str, list[float]] = {name: [] for name in CASES}
            for rep in range(reps):
                order = list(CASES) if rep % 2 == 0 else list(reversed(CASES))
                for name in order:
                    runs[name].append(_run(backend, n, CASES[name], tokens))
            for name in CASES:
                rows.append({"streams": n, "case": name,
                             "tps": statistics.median(runs[name]),
                             "ratio": statistics.median(a / b for a, b in
                                                        zip(runs[name], runs["none"])),
                             "runs": runs[name]})
                r = rows[-1]
                print(f"  N={n} {name}: {r['tps']:.1f} tok/s ({r['ratio']:.2f}x)", flush=True)
        finally:
            backend.close()
    return rows


def main() -> None:
    parser = harness.arguments(__doc__, tokens=96, reps=5)
    args = parser.parse_args()
    logging.getLogger("localinfer.llama_cpp").setLevel(logging.ERROR)
    threads = default_threads()
    results = {}
    for name in MODELS:
        print(f"== {name}", flush=True)
        results[name] = bench_model(resolve(name, harness.STORE).path, args.tokens, args.reps,
                                    threads)
    meta = harness.run_facts(models=list(MODELS), threads=threads, tokens=args.tokens,
                             reps=args.reps)
    lines = ["# Log probabilities: what asking for them costs decoding", "",
             f"{threads} threads, {args.tokens} greedy tokens per stream, median of "
             f"{args.reps} rounds (order turned each round); the ratio to no log probabilities "
             "is the median of each round's.", "",
             "| model | streams | asked | tok/s | ÷ none |", "|---|---|---|---|---|"]
    for name, rows in results.items():
        for r in rows:
            lines.append(f"| {name} | {r['streams']} | {r['case']} | {r['tps']:.1f} | "
                         f"{r['ratio']:.2f} |")
    harness.write("logprobs", meta, results, lines, _plot(results), folder=args.results)


def _plot(results: dict):
    fig, axes = harness.figure(1, 1, size=(8, 3.8))
    ax = axes[0][0]
    labels, ratios = [], []
    for name, rows in results.items():
        for r in rows:
            if r["case"] != "none":
                labels.append(f"{name.split(':')[0]}\nN={r['streams']}\n{r['case']}")
                ratios.append(r["ratio"])
    ax.bar(range(len(ratios)), ratios)
    ax.axhline(1.0, color="gray", linestyle="--")
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("tok/s with log probabilities ÷ without")
    return fig


if __name__ == "__main__":
    main()
