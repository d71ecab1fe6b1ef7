"""Single-stream decode speed of localinfer's engine against llama-cpp-python's `Llama` and
against the ceiling, in one process run.

Same model file, same prompt length, same threads, greedy, runs interleaved so machine noise hits
all alike. The engine and `Llama` are timed by an outside stopwatch on the streamed pieces
(arrival of the first and last piece); localinfer's own RequestStats figure is reported beside
it as a cross-check. The ceiling is the bare low-level loop of `localinfer bench` at N=1 (one
sequence, a fixed token fed each step, no sampling), started at the prompt's length so it
decodes at the same context as the other two.

    python3 bench/decode_vs_llama.py [--tokens 128] [--reps 3] [--threads N] [--results FOLDER]

Writes bench/results/decode_vs_llama.{json,png,md}.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import harness
from localinfer.backends.base import LoadOptions, SamplingParams, TokenEvent
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.bench import ceiling
from localinfer.model_store.sources import resolve

MODELS = ("smollm2:135m", "gemma3:270m")
PROMPT = "Here is a long, detailed story about a lighthouse keeper and the sea:\n\n"
N_CTX = 2048


def _model_paths() -> dict[str, Path]:
    return {name: resolve(name, harness.STORE).path for name in MODELS}


def _rate(arrivals: list[float], n_tokens: int) -> float:
    return (n_tokens - 1) / (arrivals[-1] - arrivals[0])


def run_localinfer(backend: LlamaCppBackend, n_tokens: int) -> dict[str, float]:
    tokens = backend.tokenize(PROMPT)
    generation = backend.generate(tokens, SamplingParams(temperature=0, max_tokens=n_tokens))
    arrivals = [time.perf_counter() for e in generation if isinstance(e, TokenEvent)]
    stats = generation.stats
    return {"decode_tps": _rate(arrivals, stats.generated_tokens),
            "decode_tps_internal": stats.decode_tps, "tokens": stats.generated_tokens}


def run_llama(llm, n_tokens: int) -> dict[str, float]:
    llm.reset()  # no prompt cache: both sides prefill the same prompt every time
    arrivals = []
    for _chunk in llm.create_completion(PROMPT, max_tokens=n_tokens, temperature=0.0,
                                        top_k=1, stream=True):
        arrivals.append(time.perf_counter())
    return {"decode_tps": _rate(arrivals, len(arrivals)), "tokens": len(arrivals)}


def bench_model(name: str, path: Path, n_tokens: int, reps: int, threads: int) -> dict:
    from llama_cpp import Llama

    backend = LlamaCppBackend(path, LoadOptions(n_ctx=N_CTX, n_threads=threads), name=name)
    llm = Llama(str(path), n_ctx=N_CTX, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False)
    run_localinfer(backend, 8), run_llama(llm, 8)  # warm up both
    context = len(backend.tokenize(PROMPT))
    ours, theirs, bare = [], [], []
    for _ in range(reps):
        ours.append(run_localinfer(backend, n_tokens))
        theirs.append(run_llama(llm, n_tokens))
        bare.append(ceiling(path, 1, n_tokens, threads, context))
    backend.close()
    del llm
    med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    result = {
        "localinfer_decode_tps": med(ours, "decode_tps"),
        "localinfer_decode_tps_internal": med(ours, "decode_tps_internal"),
        "llama_cpp_python_decode_tps": med(theirs, "decode_tps"),
        "ceiling_tps": statistics.median(bare),
        "tokens": {"localinfer": ours[0]["tokens"], "llama_cpp_python": theirs[0]["tokens"]},
        "runs": {"localinfer": ours, "llama_cpp_python": theirs, "ceiling": bare},
    }
    # ratios within each round, then their median: the machine's speed drifts between rounds
    result["ratio"] = statistics.median(o["decode_tps"] / t["decode_tps"]
                                        for o, t in zip(ours, theirs))
    result["vs_ceiling"] = statistics.median(o["decode_tps"] / c for o, c in zip(ours, bare))
    return result


def _plot(results: dict):
    names = list(results)
    bars = {"localinfer engine": "localinfer_decode_tps",
            "llama-cpp-python Llama": "llama_cpp_python_decode_tps",
            "ceiling (bare loop, N=1)": "ceiling_tps"}
    x = range(len(names))
    fig, axes = harness.figure(1, 1, size=(6, 3.5))
    ax = axes[0][0]
    for k, (label, key) in enumerate(bars.items()):
        ax.bar([i + (k - 1) * 0.27 for i in x], [results[n][key] for n in names], width=0.27,
               label=label)
    ax.set_xticks(list(x), names)
    ax.set_ylabel("decode tokens/s (single stream)")
    ax.set_title("Greedy decode, same prompt and threads, one run")
    ax.legend()
    return fig


def _markdown(meta: dict, results: dict) -> list[str]:
    lines = [
        "# Single-stream decode speed: localinfer vs llama-cpp-python `Llama` and the ceiling",
        "",
        f"{meta['threads']} threads, {meta['tokens']} greedy tokens, median of {meta['reps']} "
        "interleaved runs (ratios: the median of each round's ratio).",
        "",
        "| model | localinfer tok/s | (engine's own stats) | Llama tok/s | ÷ Llama | "
        "ceiling tok/s | ÷ ceiling |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(f"| {name} | {r['localinfer_decode_tps']:.1f} | "
                     f"{r['localinfer_decode_tps_internal']:.1f} | "
                     f"{r['llama_cpp_python_decode_tps']:.1f} | {r['ratio']:.2f} | "
                     f"{r['ceiling_tps']:.1f} | {r['vs_ceiling']:.2f} |")
    return lines


def main() -> None:
    parser = harness.arguments(__doc__, tokens=128, reps=3, threads=None)
    args = parser.parse_args()
    threads = harness.threads_or_default(args.threads)
    results = {name: bench_model(name, path, args.tokens, args.reps, threads)
               for name, path in _model_paths().items()}
    meta = harness.run_facts(models=list(MODELS), threads=threads, tokens=args.tokens,
                             reps=args.reps)
    harness.write("decode_vs_llama", meta, results, _markdown(meta, results), _plot(results),
                  folder=args.results)
    for name, r in results.items():
        print(f"{name}: localinfer {r['localinfer_decode_tps']:.1f} tok/s, "
              f"Llama {r['llama_cpp_python_decode_tps']:.1f} tok/s, ratio {r['ratio']:.2f}, "
              f"ceiling {r['ceiling_tps']:.1f} tok/s, ÷ ceiling {r['vs_ceiling']:.2f}")


if __name__ == "__main__":
    main()
