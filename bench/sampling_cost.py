"""What choosing each token costs the engine, with the sampler shortcuts on and off.

    python3 bench/sampling_cost.py [--vocab GGUF ...] [--tokens 96] [--reps 3] [--results FOLDER]

Streams decode together from short prompts, greedy and sampled: Ollama's default sampling
(temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1) and localinfer's (temperature
0.8, top_k 40, top_p 0.95, min_p 0.05), also with `ignore_eos` (the end tokens banned by a
logit bias, first in the chain). With the shortcuts off, every token goes through
llama.cpp's plain sampler chain (see SamplerChain in backends/native/model.py); the tokens
are the same either way (tests check it), so both runs do the same work: no end token is
banned (a logit bias keeps greedy streams off the argmax). The models: SmolLM2-135M
(1 and 8 streams) and Gemma 3 270M's 262k vocabulary, and with `--vocab`, bench/random_gguf.py's
fast-step shape (a CPU steps it at a GPU's rate) over that file's vocabulary (llama.cpp's
models/ggml-vocab-qwen2.gguf: Qwen's 151,936 tokens), 8 and 32 streams. Reported: output
tok/s of each, and their ratio within each round (median over rounds, alternating order).
Writes bench/results/sampling_cost.{json,png,md}.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from pathlib import Path

import harness
from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.native.model import SamplerChain
from localinfer.backends.llamacpp import LlamaCppBackend, default_threads
from localinfer.model_store.sources import resolve
from random_gguf import fast_step_model

MODELS = {"smollm2:135m": (1, 8), "gemma3:270m": (1, 8)}  # name: streams
VOCAB_STREAMS = (8, 32)  # the fast-step shape over a --vocab file's vocabulary
CASES = {"greedy": dict(temperature=0),
         "Ollama defaults": dict(temperature=0.8, top_k=40, top_p=0.9, repeat_penalty=1.1),
         "localinfer defaults": dict(),
         # (a bias first: what benchmark clients send to have every reply run its length)
         "localinfer defaults, ignore_eos": dict(ignore_eos=True)}


def _run(backend: LlamaCppBackend, n: int, case: dict, tokens: int, shortcuts: bool) -> float:
    SamplerChain.shortcuts = shortcuts
    prompts = [backend.tokenize(f"Story {i}: the keeper of the lighthouse") for i in range(n)]
    started = time.perf_counter()
    gens = [backend.generate(p, SamplingParams(**case, seed=i, max_tokens=tokens))
            for i, p in enumerate(prompts)]
    for g in gens:
        g.text()
    return sum(g.stats.generated_tokens for g in gens) / (time.perf_counter() - started)


def bench_model(path: Path, streams: tuple[int, ...], tokens: int, reps: int, threads: int
                ) -> list[dict]:
    rows = []
    for n in streams:
        backend = LlamaCppBackend(path, LoadOptions(n_ctx=256, n_slots=n, n_threads=threads))
        try:
            for name, case in CASES.items():
                _run(backend, n, case, 8, True)  # warm up
                on, off = [], []
                for rep in range(reps):
                    order = (True, False) if rep % 2 == 0 else (False, True)
                    for shortcuts in order:
                        (on if shortcuts else off).append(_run(backend, n, case, tokens, shortcuts))
                rows.append({"streams": n, "sampling": name,
                             "with_shortcuts_tps": statistics.median(on),
                             "plain_chain_tps": statistics.median(off),
                             "ratio": statistics.median(a / b for a, b in zip(on, off)),
                             "runs": {"with_shortcuts": on, "plain_chain": off}})
                r = rows[-1]
                print(f"  N={n} {name}: {r['with_shortcuts_tps']:.1f} vs "
                      f"{r['plain_chain_tps']:.1f} tok/s ({r['ratio']:.2f}x)", flush=True)
        finally:
            SamplerChain.shortcuts = True
            backend.close()
    return rows


def main() -> None:
    parser = harness.arguments(__doc__, tokens=96, reps=3)
    parser.add_argument("--vocab", type=Path, action="append", default=[],
                        help="also the fast-step shape over this GGUF's vocabulary")
    args = parser.parse_args()
    logging.getLogger("localinfer.llama_cpp").setLevel(logging.ERROR)
    threads = default_threads()
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        models = {name: (resolve(name, harness.STORE).path, streams)
                  for name, streams in MODELS.items()}
        for vocab in args.vocab:
            path = fast_step_model(Path(folder), vocab)
            models[path.stem] = (path, VOCAB_STREAMS)
        for name, (path, streams) in models.items():
            print(f"== {name}", flush=True)
            results[name] = bench_model(path, streams, args.tokens, args.reps, threads)
    meta = harness.run_facts(models=list(models), threads=threads, tokens=args.tokens,
                             reps=args.reps)
    lines = ["# Choosing tokens: the sampler shortcuts against llama.cpp's plain chain", "",
             f"`python3 bench/sampling_cost.py{''.join(f' --vocab {v}' for v in args.vocab)}`"
             f": {threads} threads, {args.tokens} tokens per stream (or to the model's end "
             f"token: the same either way), median of {args.reps} alternating rounds; the "
             "ratio is the median of each round's. Same tokens either way. fast-step-*: "
             "bench/random_gguf.py's fast-step shape (a CPU steps it at a GPU's rate) over "
             "that vocabulary.", "",
             "| model | streams | sampling | with shortcuts tok/s | plain chain tok/s | ratio |",
             "|---|---|---|---|---|---|"]
    for name, rows in results.items():
        for r in rows:
            lines.append(f"| {name} | {r['streams']} | {r['sampling']} | "
                         f"{r['with_shortcuts_tps']:.1f} | {r['plain_chain_tps']:.1f} | "
                         f"{r['ratio']:.2f} |")
    harness.write("sampling_cost", meta, results, lines, _plot(results), folder=args.results)


def _plot(results: dict):
    labels, ratios = [], []
    for name, rows in results.items():
        for r in rows:
            labels.append(f"{name.split(':')[0]}\nN={r['streams']}\n{r['sampling']}")
            ratios.append(r["ratio"])
    fig, axes = harness.figure(1, 1, size=(9, 3.8))
    ax = axes[0][0]
    ax.bar(range(len(ratios)), ratios)
    ax.axhline(1.0, color="gray", linestyle="--")
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("tok/s with shortcuts ÷ plain chain")
    return fig


if __name__ == "__main__":
    main()
