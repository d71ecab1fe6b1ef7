"""One KV pool for all requests (`--kv-unified`) against a fixed share per slot, in one run.

Two measurements, same model file and threads:

1. What one pool costs a decode step: a bare loop decodes 8 sequences, each with its own
   context of C tokens, one batch per step, with the cache split in 8 streams or unified.
   With one pool each sequence's attention runs over every sequence's cells (masked), so
   longer contexts cost more. Runs alternate; the median of --reps is kept.
2. The same memory serving 16 clients: a pool of 8192 cells as 4 slots × 2048 (split),
   16 slots × 512 (split: prompts over 512 tokens are refused), or 16 slots sharing 8192
   (unified). Clients send prompts of 32–1500 tokens (log-uniform) and ask for 16–128
   tokens, with exponential gaps; greedy.

    python3 bench/kv_unified.py [--reps 3] [--models smollm2:135m gemma3:270m] [--results FOLDER]

Writes bench/results/kv_unified.{json,png,md}.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import harness
import llama_cpp

from localinfer.backends.base import LoadOptions
from localinfer.backends.native.model import NativeModel
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.bench import FILLER, Workload, closed_loop, decode_bare, read_prompt
from localinfer.model_store.sources import resolve

THREADS = 2
POOL = 8192
CLIENTS = 16
WORK = Workload(min_prompt=32, max_prompt=1500, min_output=16, max_output=128,
                requests_per_client=2, mean_gap_s=0.5)
LAYOUTS = {  # name: (n_ctx per slot, slots, unified)
    "split 4 x 2048": (2048, 4, False),
    "split 16 x 512": (512, 16, False),
    "unified 16 / 8192": (512, 16, True),
}


def decode_tps(path: Path, unified: bool, n_seq: int, context: int, n_tokens: int = 48) -> float:
    native = NativeModel(str(path), n_ctx_total=(context + n_tokens + 64) * n_seq, n_slots=n_seq,
                         n_batch=512, n_threads=THREADS, kv_unified=unified)
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    try:
        prompt = native.tokenize(FILLER * (1 + context // 20))[:context]
        for seq in range(n_seq):  # each its own cells: nothing shared between sequences
            read_prompt(native, batch, prompt, seq)
        return decode_bare(native, batch, n_seq, prompt[-1], len(prompt), n_tokens)
    finally:
        llama_cpp.llama_batch_free(batch)
        native.close()


def serve_clients(path: Path, n_ctx: int, n_slots: int, unified: bool) -> dict:
    backend = LlamaCppBackend(path, LoadOptions(n_ctx=n_ctx, n_slots=n_slots, n_threads=THREADS,
                                                n_gpu_layers=0, kv_unified=unified))
    try:
        return {**closed_loop(backend, CLIENTS, WORK), "preemptions": backend.stats().preemptions}
    finally:
        backend.close()


def bench_model(name: str, reps: int) -> dict:
    path = resolve(name, harness.STORE).path
    decode = {}
    for context in (320, 1000):
        runs = {"split": [], "unified": []}
        for _ in range(reps):
            for layout in ("split", "unified"):
                runs[layout].append(decode_tps(path, layout == "unified", 8, context))
        row = {k: statistics.median(v) for k, v in runs.items()}
        row["ratio"] = row["unified"] / row["split"]
        decode[context] = row
        print(f"{name} decode 8 x {context}: split {row['split']:.0f} tok/s, unified "
              f"{row['unified']:.0f} tok/s ({row['ratio']:.2f}x)", flush=True)
    serving = {}
    for label, (n_ctx, n_slots, unified) in LAYOUTS.items():
        serving[label] = row = serve_clients(path, n_ctx, n_slots, unified)
        print(f"{name} {label}: {row['requests']} served, {row['refused']} refused, "
              f"{row['output_tps']:.1f} tok/s, TTFT p50 {row['ttft_p50_s']:.2f} s p99 "
              f"{row['ttft_p99_s']:.2f} s, preemptions {row['preemptions']}", flush=True)
    return {"model": name, "decode": decode, "serving": serving}


def report(results: list[dict], models: list[str], reps: int, folder: Path) -> None:
    meta = harness.run_facts(models=models, threads=THREADS, reps=reps, pool=POOL,
                             clients=CLIENTS, workload=WORK.__dict__)
    lines = ["# One KV pool (`--kv-unified`) against a fixed share per slot", "",
             f"{THREADS} threads, median of {reps} alternating runs for decode.", "",
             "## Decode tok/s, 8 sequences each with its own context", "",
             "| model | context | split | unified | unified ÷ split |", "|---|---|---|---|---|"]
    for r in results:
        for context, row in r["decode"].items():
            lines.append(f"| {r['model']} | {context} | {row['split']:.0f} | "
                         f"{row['unified']:.0f} | {row['ratio']:.2f}× |")
    lines += ["", f"## The same {POOL} cells serving {CLIENTS} clients", "",
              f"Prompts {WORK.min_prompt}–{WORK.max_prompt} tokens, replies "
              f"{WORK.min_output}–{WORK.max_output}, {WORK.requests_per_client} requests per "
              "client.", "",
              "| model | layout | served | refused | output tok/s | TTFT p50 | TTFT p99 | "
              "preemptions |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for label, row in r["serving"].items():
            lines.append(f"| {r['model']} | {label} | {row['requests']} | {row['refused']} | "
                         f"{row['output_tps']:.1f} | {row['ttft_p50_s']:.2f} s | "
                         f"{row['ttft_p99_s']:.2f} s | {row['preemptions']} |")
    fig, axes = harness.figure(2, 1, size=(5, 3.8))
    axes = axes[0]
    for i, r in enumerate(results):
        labels = list(r["serving"])
        axes[0].bar([x + 0.4 * i for x in range(len(labels))],
                    [r["serving"][k]["output_tps"] for k in labels], width=0.4, label=r["model"])
        axes[1].bar([x + 0.4 * i for x in range(len(labels))],
                    [r["serving"][k]["ttft_p99_s"] for k in labels], width=0.4, label=r["model"])
    for ax, title in zip(axes, ("output tok/s (served requests)", "TTFT p99 (s)")):
        ax.set_xticks([x + 0.2 for x in range(len(LAYOUTS))], list(LAYOUTS), fontsize=8)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(f"{CLIENTS} clients on {POOL} KV cells")
    harness.write("kv_unified", meta, results, lines, fig, folder=folder)


def main() -> None:
    parser = harness.arguments(__doc__, reps=3, models=["smollm2:135m", "gemma3:270m"])
    args = parser.parse_args()
    report([bench_model(m, args.reps) for m in args.models], args.models, args.reps,
           args.results)


if __name__ == "__main__":
    main()
