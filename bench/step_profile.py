"""Where a decode step's time goes when steps are fast (a GPU): llama.cpp, or Python around it.

N greedy streams of T tokens each through the engine, twice: once plainly, for the times
(step, inside llama_decode until the device is done, the rest in the engine's Python), once
under cProfile, for the functions the engine's own time goes to. `--switch-interval` sets
Python's thread switch interval, to see whether waiting for the GIL after llama_decode
(its consumers hold it meanwhile) costs the engine thread.

The timed runs alternate with a baseline that asks llama.cpp for each token's end flag and
bytes through ctypes, as the engine did before it cached them (a ctypes call lets go of the
GIL, and getting it back waits for the consumers). Without MODEL, bench/random_gguf.py's
fast-step shape is written and used: a CPU steps it at a GPU's rate.

    python3 bench/step_profile.py [MODEL.gguf] --streams 8,32 [--tokens 128] [--reps 3]
                                  [--switch-interval 0.0005] [--out ROWS.json]
                                  [--results FOLDER]

Writes bench/results/step_profile.{json,md,png} when run on the fast-step model.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import threading
from pathlib import Path

import harness
from localinfer.backends.engine import scheduler as engine_module
from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.native.model import NativeModel
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.service import prepare
from random_gguf import fast_step_model  # bench/, the script's own folder


@contextlib.contextmanager
def uncached_tokens():
    saved = harness.uncache_token_calls()
    try:
        yield
    finally:
        NativeModel.is_eog, NativeModel.piece = saved


def run(path: Path, streams: int, tokens: int, profile: bool) -> dict:
    options = prepare(str(path), LoadOptions(n_ctx=256 + tokens, n_slots=streams)).options
    backend = LlamaCppBackend(path, options)
    profiler = cProfile.Profile() if profile else None
    original = engine_module.Engine._step
    if profiler:
        def step(self):
            profiler.enable()
            try:
                original(self)
            finally:
                profiler.disable()
        engine_module.Engine._step = step
    try:
        params = SamplingParams(temperature=0, max_tokens=tokens)
        prompts = [backend.tokenize(f"Story {i}: once upon a time") for i in range(streams)]
        results = [None] * streams

        def consume(i: int) -> None:  # one thread per stream, as the server's clients
            results[i] = backend.generate(prompts[i], params)
            results[i].text()

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = backend.stats()
        generated = sum(g.stats.generated_tokens for g in results)
        row = {"streams": streams, "gpu_layers": options.n_gpu_layers, "steps": stats.steps,
               "generated": generated, "step_ms": 1000 * stats.step_seconds / stats.steps,
               "decode_ms": 1000 * stats.decode_seconds / stats.steps,
               "engine_ms": 1000 * (stats.step_seconds - stats.decode_seconds) / stats.steps}
        if profiler:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(12)
            row["profile"] = out.getvalue()
        return row
    finally:
        engine_module.Engine._step = original
        backend.close()


def main() -> None:
    parser = harness.arguments(__doc__, tokens=128, reps=3)
    parser.add_argument("model", type=Path, nargs="?")
    parser.add_argument("--streams", default="8,32")
    parser.add_argument("--switch-interval", type=float)
    parser.add_argument("--out", type=Path, help="write the rows as JSON here too")
    args = parser.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    with tempfile.TemporaryDirectory() as folder:
        model = args.model or fast_step_model(Path(folder))
        rows = [measure(model, int(n), args.tokens, args.reps)
                for n in args.streams.split(",")]
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))
    if args.model is None:
        write_report(rows, args)


def measure(model: Path, streams: int, tokens: int, reps: int) -> dict:
    timed = {"cached": [], "uncached": []}
    for _ in range(reps):  # in turns: machine noise hits both
        timed["cached"].append(run(model, streams, tokens, False))
        with uncached_tokens():
            timed["uncached"].append(run(model, streams, tokens, False))
    row = {"streams": streams, "tokens": tokens, "reps": reps}
    for name, runs in timed.items():
        for key in ("step_ms", "decode_ms", "engine_ms"):
            row[f"{name}_{key}"] = statistics.median(r[key] for r in runs)
    row["profile"] = run(model, streams, 32, True)["profile"]
    print(f"{model.name} streams={streams} switch={sys.getswitchinterval() * 1000:.1f} ms: "
          f"step {row['cached_step_ms']:.2f} ms = llama_decode {row['cached_decode_ms']:.2f} + "
          f"engine {row['cached_engine_ms']:.2f} ms (a ctypes call per token: step "
          f"{row['uncached_step_ms']:.2f} = {row['uncached_decode_ms']:.2f} + "
          f"{row['uncached_engine_ms']:.2f} ms)\n{row['profile']}", flush=True)
    return row


def write_report(rows: list[dict], args) -> None:
    meta = harness.run_facts(streams=args.streams, tokens=args.tokens, reps=args.reps,
                             switch_interval=args.switch_interval)
    lines = [
        "# Where a fast decode step's time goes",
        "",
        f"`python3 bench/step_profile.py`: greedy streams of {args.tokens} tokens through the "
        "engine on bench/random_gguf.py's fast-step model (a CPU steps it at a GPU's rate), one "
        "consuming thread per stream; per step: the time inside llama_decode (until the device "
        "is done), and the engine's Python around it. Medians of "
        f"{args.reps} runs, in turns with the baseline. {os.cpu_count()} CPUs.",
        "",
        "| streams | engine | step ms | llama_decode ms | engine Python ms | steps per second × before |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        for name, label in (("uncached", "before: 2 ctypes calls a token"),
                            ("cached", "token facts cached")):
            lines.append(f"| {r['streams']} | {label} | {r[f'{name}_step_ms']:.2f} | "
                         f"{r[f'{name}_decode_ms']:.2f} | {r[f'{name}_engine_ms']:.2f} | "
                         f"{r['uncached_step_ms'] / r[f'{name}_step_ms']:.2f} |")
    lines += [
        "",
        "Each ctypes call lets go of the GIL; the consumers take it, and the engine thread "
        "waits to get it back — in a native profile of `localinfer serve` at 32 streams, ~20% "
        "of the engine thread's busy time. The engine now asks llama.cpp once per token id "
        "whether it ends the reply and what its bytes are (`NativeModel.is_eog`, `piece`).",
    ]
    fig, axes = harness.figure(1, 1, size=(7, 3.2))
    ax = axes[0][0]
    labels, decode, python = [], [], []
    for r in rows:
        for name, label in (("uncached", "before"), ("cached", "cached")):
            labels.append(f"{r['streams']} streams, {label}")
            decode.append(r[f"{name}_decode_ms"])
            python.append(r[f"{name}_engine_ms"])
    ax.barh(labels, decode, color="#9aa4b2", label="llama_decode")
    ax.barh(labels, python, left=decode, color="#1f4fd1", label="engine Python")
    ax.invert_yaxis()
    ax.set_xlabel("ms per decode step")
    ax.legend(loc="lower right")
    ax.set_title("engine step at GPU-like rates (fast-step model, CPU)")
    harness.write("step_profile", meta, {"rows": rows}, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
