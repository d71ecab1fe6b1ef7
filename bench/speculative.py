"""Speculative decoding against plain decoding, in one process run.

Same model, threads and greedy requests; runs alternate so machine noise hits both alike.
Two tasks: rewriting code given in the prompt (the reply repeats much of it: guesses pay)
and an open question (little to look up: guesses mostly cost). Time is the outside
stopwatch from submission to the last token; the reply is checked identical.

Prompt lookup runs on both embedded models. A draft model needs a smaller model of the same
family, and none is installed offline: smollm2 requantised to Q8_0 is the model and the
embedded Q4_1 file guesses for it (same vocabulary, about 60% of the bytes to read a token).

    python3 bench/speculative.py [--reps 3] [--draft 8] [--model-draft 4] [--max-tokens 200]
                                 [--results FOLDER]

Writes bench/results/speculative.{json,png,md}.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import harness
from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.model_store.sources import resolve

MODELS = ("smollm2:135m", "gemma3:270m")
CODE = "".join(f"def {name}(a, b):\n    return a {op} b\n\n" for name, op in
               (("add", "+"), ("sub", "-"), ("mul", "*"), ("div", "/"), ("mod", "%")))
TASKS = {
    "rewrite code": [{"role": "user", "content": "Rewrite this code, adding a docstring to "
                                                 "each function:\n\n" + CODE}],
    "open question": [{"role": "user", "content": "Why is the sky blue? Explain in detail."}],
}


def _one(backend: LlamaCppBackend, messages, max_tokens: int) -> tuple[str, float, object]:
    started = time.perf_counter()
    generation = backend.chat(messages, SamplingParams(temperature=0, max_tokens=max_tokens))
    text = generation.text()
    return text, time.perf_counter() - started, generation.stats


def _requantised(source: Path, ftype: int = 7) -> Path:
    """`source` requantised (7: Q8_0) with llama.cpp's own quantizer, next to the bench store."""
    import ctypes

    import llama_cpp

    out = source.with_name(source.stem + "-Q8_0.gguf")
    if not out.exists():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = ftype, True, 2
        if llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(),
                                          ctypes.byref(params)) != 0:
            raise RuntimeError(f"could not requantise {source}")
    return out


def bench_model(name: str, reps: int, draft: int, max_tokens: int,
                draft_model: Path | None = None) -> dict:
    path = resolve(name, harness.STORE).path
    label = name
    if draft_model is not None:  # the model is the Q8_0 requantisation; the file guesses
        path, draft_model, label = _requantised(path), path, f"{name} Q8_0 + Q4_1 draft model"
    plain = LlamaCppBackend(path, LoadOptions(n_ctx=2048, n_gpu_layers=0), name=name)
    fast = LlamaCppBackend(path, LoadOptions(
        n_ctx=2048, n_gpu_layers=0, draft_tokens=draft,
        draft_model=str(draft_model) if draft_model else None), name=name)
    out = {"model": label, "draft": draft, "tasks": {}}
    try:
        for task, messages in TASKS.items():
            times = {"plain": [], "speculative": []}
            same, stats = True, None
            for rep in range(reps):
                text_a, t_a, s_a = _one(plain, messages, max_tokens)
                text_b, t_b, stats = _one(fast, messages, max_tokens)
                times["plain"].append(s_a.generated_tokens / t_a)
                times["speculative"].append(stats.generated_tokens / t_b)
                if rep == 0:  # later runs reuse the cached prompt, whose KV was computed in
                    same = text_a == text_b  # another batch shape: bits can differ there
            row = {"plain_tps": statistics.median(times["plain"]),
                   "speculative_tps": statistics.median(times["speculative"]),
                   "identical": same, "acceptance_rate": stats.acceptance_rate,
                   "generated": stats.generated_tokens}
            row["speedup"] = row["speculative_tps"] / row["plain_tps"]
            out["tasks"][task] = row
            print(f"{label} / {task}: plain {row['plain_tps']:.1f} tok/s, speculative "
                  f"{row['speculative_tps']:.1f} tok/s ({row['speedup']:.2f}x), acceptance "
                  f"{row['acceptance_rate'] or 0:.0%}, identical {same}", flush=True)
    finally:
        plain.close()
        fast.close()
    return out


def main() -> None:
    parser = harness.arguments(__doc__, reps=3)
    parser.add_argument("--draft", type=int, default=8)
    parser.add_argument("--model-draft", type=int, default=4,
                        help="guesses a step for the draft model")
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()
    results = [bench_model(m, args.reps, args.draft, args.max_tokens) for m in MODELS]
    smollm2 = resolve("smollm2:135m", harness.STORE).path
    results.append(bench_model("smollm2:135m", args.reps, args.model_draft, args.max_tokens,
                               draft_model=smollm2))
    meta = harness.run_facts(models=list(MODELS), reps=args.reps, draft=args.draft,
                             model_draft=args.model_draft, max_tokens=args.max_tokens)
    lines = ["# Speculative decoding", "",
             f"Greedy, up to {args.max_tokens} tokens, median of {args.reps} alternating runs; "
             "tok/s = tokens / time from submission to the last token (prefill included). "
             f"Prompt lookup guesses up to {args.draft} tokens a step; the draft model (the "
             "embedded smollm2 Q4_1 file, guessing for its Q8_0 requantisation: no smaller model "
             f"of a family is installed offline) up to {args.model_draft}.", "",
             "| model | guesses from | task | plain tok/s | speculative tok/s | speedup | "
             "acceptance | same reply |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        source = "draft model" if "draft model" in r["model"] else "prompt lookup"
        for task, row in r["tasks"].items():
            lines.append(f"| {r['model']} | {source} | {task} | {row['plain_tps']:.1f} | "
                         f"{row['speculative_tps']:.1f} | {row['speedup']:.2f}× | "
                         f"{(row['acceptance_rate'] or 0):.0%} | {row['identical']} |")
    labels = [f"{r['model']}\n{t}" for r in results for t in r["tasks"]]
    speedups = [row["speedup"] for r in results for row in r["tasks"].values()]
    fig, axes = harness.figure(1, 1, size=(9, 3.8))
    ax = axes[0][0]
    ax.bar(range(len(labels)), speedups)
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("speculative ÷ plain tok/s")
    ax.set_title("Speculative decoding (greedy, same replies)")
    harness.write("speculative", meta, results, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
