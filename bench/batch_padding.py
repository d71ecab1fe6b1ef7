"""Filler tokens in idle slots (backends/engine/padding.py): what a decode step costs by its
shape in llama.cpp, and what the engine gains from them under replies of mixed lengths.

1. `llama_decode` of one token in each of n sequences (slots 0..n-1), n = 1..16, and of
   seven streams as one micro-batch (slots 0-6) and as two (0-3 and 5-7, the gap a request
   that ended first leaves): SmolLM2-135M's and Llama-3.2-1B's shapes in random Q8_0, and
   Qwen3-0.6B's in random Q4_K_M (bench/random_gguf.py); medians of --reps.
2. The engine in this process (8 slots of 512 tokens), 8 clients each sending --requests
   requests one after another, replies of 16-192 tokens (one fixed pseudo-random draw, the
   same every round; random weights run a reply to its limit): tokens/s with fillers and without, in
   alternating rounds, for SmolLM2-135M's shape (and the 1B's with --with-1b, replies a
   quarter as long).
3. With --llama-server: `localinfer serve` against llama-server (-np 8, built from the same
   llama.cpp), the same load over HTTP from a raw-socket client in a process of its own.

    python3 bench/batch_padding.py [--reps 5] [--requests 4] [--with-1b]
                                   [--llama-server PATH]

Writes bench/results/batch_padding.{json,md,png}.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness
from random_gguf import ARCH_SHAPES, SHAPES, embedded_smollm2, read_tokenizer, write_arch, write_model

SLOTS = 8
CTX = 512  # per slot
NS = list(range(1, 17))
GAP = [0, 1, 2, 3, 5, 6, 7]  # seven streams, slot 4 idle: two micro-batches


def _lengths(clients: int, requests: int, scale: float = 1.0) -> list[list[int]]:
    rng = random.Random(41)
    return [[max(4, int(rng.randint(16, 192) * scale)) for _ in range(requests)]
            for _ in range(clients)]


# ---------------------------------------------------------------------------- 1. step costs
def step_costs(path: Path, reps: int) -> dict:
    from localinfer.backends.native.model import NativeModel

    native = NativeModel(str(path), n_ctx_total=128 * 16, n_slots=16, n_batch=64, n_threads=2)
    batch = native.batch(64)
    pos = [0] * 16

    def step(seqs: list[int]) -> float:
        for i, seq in enumerate(seqs):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = 100 + i, pos[seq], 1
            batch.seq_id[i][0], batch.logits[i] = seq, True
            pos[seq] += 1
        batch.n_tokens = len(seqs)
        began = time.perf_counter()
        if native.decode(batch) != 0:
            raise SystemExit("llama_decode failed")
        return time.perf_counter() - began

    for seq in range(16):  # a short prompt each
        step([seq])
    times: dict[str, list[float]] = {}
    for _ in range(reps):
        for n in NS:
            step(list(range(n)))  # (its graph built)
            times.setdefault(str(n), []).append(step(list(range(n))))
        for name, seqs in (("7 as one", list(range(7))), ("7 as two", GAP)):
            step(seqs)
            times.setdefault(name, []).append(step(seqs))
    native.close()
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


# ---------------------------------------------------------------------------- 2. the engine
def engine_load(path: Path, reps: int, requests: int, scale: float) -> dict:
    from localinfer.backends.base import SamplingParams
    from localinfer.backends.engine.scheduler import Engine
    from localinfer.backends.native.model import NativeModel

    native = NativeModel(str(path), n_ctx_total=CTX * SLOTS, n_slots=SLOTS, n_batch=512,
                         n_threads=2)
    engine = Engine(native, n_slots=SLOTS, n_batch=512)
    lengths = _lengths(SLOTS, requests, scale)

    def client(i: int, out: list[int]) -> None:
        for j, n in enumerate(lengths[i]):
            prompt = native.tokenize(f"Client {i}, question {j}: tell me a story.")
            g = engine.submit(prompt, SamplingParams(temperature=0, max_tokens=n))
            g.text()
            out.append(g.stats.generated_tokens)

    def one_round(fill: bool) -> float:
        engine.padding.enabled = fill
        counts: list[int] = []
        threads = [threading.Thread(target=client, args=(i, counts)) for i in range(SLOTS)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts) / (time.perf_counter() - began)

    rounds = {"with fillers": [], "without": []}
    try:
        for rep in range(reps):
            for fill in ((True, False) if rep % 2 == 0 else (False, True)):
                rounds["with fillers" if fill else "without"].append(one_round(fill))
            print(f"  round {rep}: " + ", ".join(f"{k} {v[-1]:.1f} tok/s"
                                                 for k, v in rounds.items()), flush=True)
    finally:
        engine.close()
        native.close()
    ratios = [a / b for a, b in zip(rounds["with fillers"], rounds["without"])]
    return {"rounds": rounds, "ratios": ratios, "ratio_median": statistics.median(ratios),
            "tokens": sum(map(sum, lengths))}


# ---------------------------------------------------------------------------- 3. served
async def _http_load(port: int, model: str, lengths: list[list[int]]) -> float:
    from clients import _raw_one

    async def client(i: int) -> int:
        done = 0
        for j, n in enumerate(lengths[i]):
            r = await _raw_one("127.0.0.1", port, model, "", f"Client {i}, question {j}: "
                               "tell me a story.", {"max_tokens": n, "temperature": 0})
            if r["error"] or not r["chunks"]:
                raise SystemExit(f"the load failed: {r}")
            done += r["tokens"]
        return done

    began = time.perf_counter()
    counts = await asyncio.gather(*(client(i) for i in range(len(lengths))))
    return sum(counts) / (time.perf_counter() - began)


def served(path: Path, llama_server: Path, reps: int, requests: int) -> dict:
    lengths = _lengths(SLOTS, requests)
    rounds: dict[str, list[float]] = {"localinfer": [], "llama-server": []}
    with tempfile.TemporaryDirectory() as home:
        servers = harness.start_servers({
            "llama-server": lambda: harness.start_server(
                [str(llama_server)], ["-m", str(path), "-np", str(SLOTS), "-c",
                                      str(CTX * SLOTS)]),
            "localinfer": lambda: harness.start_serve(harness.SERVE, str(path), SLOTS, CTX,
                                                      home)})
        try:
            for rep in range(reps):
                order = list(rounds) if rep % 2 == 0 else list(rounds)[::-1]
                for name in order:
                    port = int(servers[name][1].rsplit(":", 1)[1])
                    out = subprocess.run(
                        [sys.executable, __file__, "--http-load", str(port), path.stem,
                         json.dumps(lengths)], check=True, capture_output=True, text=True)
                    rounds[name].append(float(out.stdout.strip().splitlines()[-1]))
                print(f"  round {rep}: " + ", ".join(f"{k} {v[-1]:.1f} tok/s"
                                                     for k, v in rounds.items()), flush=True)
        finally:
            harness.stop_servers(servers)
    ratios = [a / b for a, b in zip(rounds["localinfer"], rounds["llama-server"])]
    return {"rounds": rounds, "ratios": ratios, "ratio_median": statistics.median(ratios)}


# ---------------------------------------------------------------------------- the report
def main() -> None:
    if sys.argv[1:2] == ["--http-load"]:  # (the client's own process)
        port, model, lengths = int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
        print(asyncio.run(_http_load(port, model, lengths)))
        return
    parser = harness.arguments(__doc__, reps=5)
    parser.add_argument("--requests", type=int, default=4, help="per client")
    parser.add_argument("--with-1b", action="store_true", help="also Llama-3.2-1B's shape")
    parser.add_argument("--llama-server", type=Path)
    args = parser.parse_args()
    results: dict = {"step_ms": {}, "engine": {}}
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = read_tokenizer(embedded_smollm2())
        models = {"SmolLM2-135M Q8_0": Path(folder) / "smollm2-135m-random.gguf"}
        write_model(SHAPES["smollm2-135m"], models["SmolLM2-135M Q8_0"], tokenizer,
                    "random smollm2-135m Q8_0")
        models["Qwen3-0.6B Q4_K_M"] = Path(folder) / "qwen3-0.6b-random.gguf"
        write_arch(ARCH_SHAPES["qwen3-rerank-0.6b"], models["Qwen3-0.6B Q4_K_M"], tokenizer,
                   "random qwen3-0.6b Q4_K_M", quant="q4_k_m")
        if args.with_1b:
            models["Llama-3.2-1B Q8_0"] = Path(folder) / "llama3.2-1b-random.gguf"
            write_model(SHAPES["llama3.2-1b"], models["Llama-3.2-1B Q8_0"], tokenizer,
                        "random llama3.2-1b Q8_0")
        for name, path in models.items():
            print(f"== step costs, {name}", flush=True)
            results["step_ms"][name] = step_costs(path, args.reps)
        for name, scale in (("SmolLM2-135M Q8_0", 1.0), ("Llama-3.2-1B Q8_0", 0.25)):
            if name in models:
                print(f"== the engine, {name}", flush=True)
                results["engine"][name] = engine_load(models[name], args.reps, args.requests,
                                                      scale)
        if args.llama_server:
            print("== served, SmolLM2-135M Q8_0", flush=True)
            results["served"] = served(models["SmolLM2-135M Q8_0"], args.llama_server,
                                       args.reps, args.requests)
    report(args, results)


def report(args, results: dict) -> None:
    lines = ["# Filler tokens in idle slots", "",
             "## What a decode step costs by its shape (`llama_decode`, ms, 2 threads)", "",
             "One token in each of n sequences (slots 0..n-1); seven streams as one "
             "micro-batch (slots 0-6) and as two (slots 0-3 and 5-7). Medians of "
             f"{args.reps}.", ""]
    costs = results["step_ms"]
    cols = [str(n) for n in NS] + ["7 as one", "7 as two"]
    lines += harness.markdown_table(["model", *cols],
                                    [[m, *(f"{c[k]:.1f}" for k in cols)] for m, c in costs.items()])
    lines += ["", "## The engine under replies of mixed lengths", "",
              f"8 slots of {CTX} tokens, 8 clients each sending {args.requests} requests one "
              "after another (replies of 16-192 tokens, a quarter of that for the 1B; the "
              f"same draw every round); generated tokens/s; {args.reps} alternating rounds.", ""]
    rows = []
    for name, r in results["engine"].items():
        rows.append([name, f"{statistics.median(r['rounds']['without']):.1f}",
                     f"{statistics.median(r['rounds']['with fillers']):.1f}",
                     f"**{r['ratio_median']:.3f}** ({min(r['ratios']):.3f}-{max(r['ratios']):.3f})",
                     " ".join(f"{x:.3f}" for x in r["ratios"])])
    lines += harness.markdown_table(["model", "without tok/s", "with fillers tok/s",
                                     "ratio (range)", "each round"], rows)
    if "served" in results:
        r = results["served"]
        lines += ["", "## Served: `localinfer serve` against llama-server", "",
                  "SmolLM2-135M's shape, the same load over HTTP (raw-socket client in a "
                  f"process of its own), both with 8 slots of {CTX}; {args.reps} alternating "
                  "rounds.", ""]
        lines += harness.markdown_table(
            ["llama-server tok/s", "localinfer tok/s", "ratio (range)", "each round"],
            [[f"{statistics.median(r['rounds']['llama-server']):.1f}",
              f"{statistics.median(r['rounds']['localinfer']):.1f}",
              f"**{r['ratio_median']:.3f}** ({min(r['ratios']):.3f}-{max(r['ratios']):.3f})",
              " ".join(f"{x:.3f}" for x in r["ratios"])]])
    fig, axes = harness.figure(2)
    for name, c in costs.items():
        axes[0][0].plot(NS, [c[str(n)] / c["1"] for n in NS], "o-", label=name)
    axes[0][0].set(title="decode step by streams", xlabel="streams (one micro-batch)",
                   ylabel="step time ÷ one stream's")
    axes[0][0].legend(fontsize=7)
    for name, r in results["engine"].items():
        axes[0][1].plot(range(1, len(r["ratios"]) + 1), r["ratios"], "o-", label=f"engine, {name}")
    if "served" in results:
        axes[0][1].plot(range(1, len(results["served"]["ratios"]) + 1),
                        results["served"]["ratios"], "s--", label="served ÷ llama-server")
    axes[0][1].axhline(1.0, color="grey", lw=0.8)
    axes[0][1].set(title="mixed reply lengths, 8 clients", xlabel="round",
                   ylabel="tok/s ÷ baseline")
    axes[0][1].legend(fontsize=7)
    meta = harness.run_facts(reps=args.reps, requests=args.requests, slots=SLOTS, ctx=CTX,
                             llama_server=str(args.llama_server or ""))
    harness.write("batch_padding", meta, results, lines, fig, args.results)


if __name__ == "__main__":
    main()
