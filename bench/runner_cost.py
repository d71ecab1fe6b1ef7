"""What the runner process costs: `localinfer serve` with each model in a runner of its own,
against the same server with the model in its own process (as it was before runners).

Both servers run side by side and take the load in turns (bench/serve_load.py's raw-socket
client in a process of its own), at 1, 8 and 32 clients, on bench/random_gguf.py's fast-step
model (a CPU steps it at a GPU's rate, so what surrounds llama_decode shows) and on smollm2.
Figures: streamed tokens/s, TTFT p50 and p99 as the client sees them, and CPU µs per streamed
token of the server process (the parent: HTTP, SSE, the events) and of its runner.

    python3 bench/runner_cost.py [--levels 1,8,32] [--tokens 128] [--requests 3] [--reps 3]
                                 [--models fast-step smollm2] [--threads 2] [--out NAME]
                                 [--results FOLDER]

Writes bench/results/runner_cost.{json,md,png} (--out names them).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

import harness
from clients import level_with_cpu
from random_gguf import named_models  # bench/, the script's own folder

VARIANTS = {"in-process": ["-c", harness.IN_PROCESS + harness.MAIN], "runner": ["-m", "localinfer"]}
CTX = 512


def main() -> None:
    parser = harness.arguments(__doc__, tokens=128, reps=3, models=["fast-step", "smollm2"])
    parser.add_argument("--levels", default="1,8,32", help="concurrent clients")
    parser.add_argument("--requests", type=int, default=3, help="per client")
    parser.add_argument("--out", default="runner_cost", help="file names under --results")
    parser.add_argument("--threads", type=int, default=2,
                        help="llama.cpp threads in both servers; 0: each tunes its own as the "
                             "machine's load changes (a single stream's level is too short "
                             "for that to settle, so it adds noise to the comparison)")
    args = parser.parse_args()
    if args.threads:
        os.environ["LOCALINFER_THREADS"] = str(args.threads)
    levels = [int(x) for x in args.levels.split(",")]
    labels = [m for item in args.models for m in item.split(",")]  # fast-step,smollm2 too
    rows = []
    with tempfile.TemporaryDirectory() as home:
        models = named_models(labels, Path(home))
        for label, model in models.items():
            servers = harness.start_servers({
                name: (lambda launch=launch: harness.start_serve(
                    [sys.executable, *launch, "serve"], model, max(levels), CTX, home))
                for name, launch in VARIANTS.items()})
            served = Path(model).stem if label == "fast-step" else model
            try:
                for rep in range(args.reps):
                    for clients in levels:
                        for name, (server, url) in servers.items():
                            row = level_with_cpu(url, server, served, clients, args.tokens,
                                          args.requests)
                            rows.append({"model": label, "server": name, "rep": rep, **row})
                            print(f"{label:9s} {name:10s} {clients:3d} clients: "
                                  f"{row['output_tps']:7.1f} tok/s  TTFT p50 "
                                  f"{row['ttft_p50_s']:.3f} p99 {row['ttft_p99_s']:.3f} s  "
                                  f"parent {row['parent_us_per_token']:6.1f} µs/token  "
                                  f"runner {row['runner_us_per_token']:6.1f}", flush=True)
            finally:
                harness.stop_servers(servers)
    meta = harness.run_facts(levels=levels, tokens=args.tokens, requests=args.requests,
                             reps=args.reps, models=list(models), threads=args.threads, ctx=CTX)
    write_report(meta, rows, args, levels, list(models))


def write_report(meta: dict, rows: list[dict], args, levels: list[int],
                 models: list[str]) -> None:
    def median(key: str, model: str, server: str, clients: int) -> float:
        return statistics.median(r[key] for r in rows if r["model"] == model
                                 and r["server"] == server and r["clients"] == clients)

    lines = [
        "# What a runner process costs",
        "",
        f"`python3 bench/runner_cost.py{''.join(' ' + a for a in sys.argv[1:])}`: "
        f"`localinfer serve --parallel {max(levels)} --ctx "
        f"{CTX}` with the model in a runner process, against the same server with the model "
        f"in its own process; {args.tokens} tokens a request, {args.requests} requests per "
        f"client, bench/serve_load.py's raw-socket client; medians of {args.reps} runs with "
        f"the servers in turns. {os.cpu_count()} CPUs, shared by the servers' processes and "
        "the client; llama.cpp threads: "
        f"{args.threads or 'tuned by each server as the load changes'}. CPU is µs per "
        "streamed token: the server process (with the model in it, that is everything), and "
        "the runner.",
        "",
        "| model | clients | in-process tok/s | runner tok/s | runner ÷ in-process | "
        "TTFT p50 in-process / runner (ms) | TTFT p99 in-process / runner (ms) | "
        "CPU µs/token in-process | parent + runner µs/token |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model in models:
        for n in levels:
            m = {key: {s: median(key, model, s, n) for s in VARIANTS}
                 for key in ("output_tps", "ttft_p50_s", "ttft_p99_s", "parent_us_per_token",
                             "runner_us_per_token")}
            lines.append(
                f"| {model} | {n} | {m['output_tps']['in-process']:.0f} | "
                f"{m['output_tps']['runner']:.0f} | "
                f"{m['output_tps']['runner'] / m['output_tps']['in-process']:.2f} | "
                f"{1e3 * m['ttft_p50_s']['in-process']:.0f} / {1e3 * m['ttft_p50_s']['runner']:.0f} | "
                f"{1e3 * m['ttft_p99_s']['in-process']:.0f} / {1e3 * m['ttft_p99_s']['runner']:.0f} | "
                f"{m['parent_us_per_token']['in-process']:.0f} | "
                f"{m['parent_us_per_token']['runner']:.0f} + "
                f"{m['runner_us_per_token']['runner']:.0f} |")
    fig, axes = harness.figure(len(models), 1, size=(10 / len(models), 3.6))
    axes = axes[0]
    for ax, model in zip(axes, models):
        for i, server in enumerate(VARIANTS):
            xs = [x + i * 0.4 for x in range(len(levels))]
            ax.bar(xs, [median("output_tps", model, server, n) for n in levels], 0.4,
                   label=server)
        ax.set_xticks([x + 0.2 for x in range(len(levels))], [f"{n} clients" for n in levels])
        ax.set_title(model)
        ax.set_ylabel("streamed tokens/s")
    axes[0].legend()
    fig.suptitle("localinfer serve: model in a runner process vs in the server's process")
    harness.write(args.out, meta, {"runs": rows}, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
