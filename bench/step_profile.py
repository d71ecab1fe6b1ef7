"""Where a decode step's time goes when steps are fast (a GPU): llama.cpp, or Python around it.

N greedy streams of T tokens each through the engine, twice: once plainly, for the times
(step, inside llama_decode until the device is done, the rest in the engine's Python), once
under cProfile, for the functions the engine's own time goes to. `--switch-interval` sets
Python's thread switch interval, to see whether waiting for the GIL after llama_decode
(its consumers hold it meanwhile) costs the engine thread.

    python3 bench/step_profile.py MODEL.gguf --streams 8,32 [--tokens 128] [--switch-interval 0.0005]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import threading
from pathlib import Path

from localinfer.backends import engine as engine_module
from localinfer.backends.base import LoadOptions, SamplingParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.service import prepare


def run(path: Path, streams: int, tokens: int, profile: bool) -> dict:
    _, _, options = prepare(str(path), LoadOptions(n_ctx=256 + tokens, n_slots=streams))
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--streams", default="8,32")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--switch-interval", type=float)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    rows = []
    for n in (int(x) for x in args.streams.split(",")):
        timed, profiled = run(args.model, n, args.tokens, False), run(args.model, n, 32, True)
        timed["profile"] = profiled["profile"]
        rows.append(timed)
        print(f"{args.model.name} streams={n} switch={sys.getswitchinterval() * 1000:.1f} ms: "
              f"step {timed['step_ms']:.2f} ms = llama_decode {timed['decode_ms']:.2f} + engine "
              f"{timed['engine_ms']:.2f} ms; {timed['generated']} tokens in {timed['steps']} "
              f"steps\n{timed['profile']}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
