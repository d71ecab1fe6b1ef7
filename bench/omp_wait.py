"""How long llama.cpp's idle OpenMP threads spin: a runner with localinfer's bound against
one with libgomp's own default.

llama.cpp's CPU threads are an OpenMP team; between two steps its idle threads spin for
GOMP_SPINCOUNT spins before they sleep (libgomp's default: 300,000, some milliseconds), and
meanwhile the engine samples, the runner sends the step's events, and the server's parent and
its clients read them. A runner is started with a bound (backends/runner/spawn.py, OMP_SPINS)
unless the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY. Two `localinfer serve` side by side,
one with GOMP_SPINCOUNT=300000 (libgomp's default, as before) and one as shipped, take
bench/serve_load.py's raw-socket load in turns, round after round, on bench/random_gguf.py's
fast-step model (a CPU steps it at a GPU's rate) and on smollm2. Figures: streamed tokens/s
and the runner's CPU µs per streamed token (its idle threads' spinning included). On a GPU
the models are offloaded as localinfer plans them. Wholly offloaded, a step's CPU part (the
input layer's row lookup) runs on one thread, with no team to spin, and the two should match;
where layers stay on the CPU, the team spins beside the GPU's part of each step.

    python3 bench/omp_wait.py [--levels 1,8] [--tokens 512] [--requests 3] [--reps 5]
                              [--models fast-step smollm2] [--results FOLDER]

Writes bench/results/omp_wait.{json,md,png}.
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

from localinfer.backends.runner.spawn import OMP_SPINS

LIBGOMP = "300000"  # libgomp's default where OMP_WAIT_POLICY is not set
VARIANTS = {f"libgomp's default ({LIBGOMP} spins)": {"GOMP_SPINCOUNT": LIBGOMP},
            f"localinfer's bound ({OMP_SPINS} spins)": {}}
CTX = 1024


def main() -> None:
    parser = harness.arguments(__doc__, tokens=512, reps=5, models=["fast-step", "smollm2"])
    parser.add_argument("--levels", default="1,8", help="concurrent clients")
    parser.add_argument("--requests", type=int, default=3, help="per client")
    args = parser.parse_args()
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):  # (each variant says its own)
        os.environ.pop(name, None)
    levels = [int(x) for x in args.levels.split(",")]
    labels = [m for item in args.models for m in item.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as home:
        models = named_models(labels, Path(home))
        for label, model in models.items():
            servers = harness.start_servers({
                name: (lambda env=env: harness.start_serve(harness.SERVE, model, max(levels),
                                                           CTX, home, env))
                for name, env in VARIANTS.items()})
            served = Path(model).stem if label == "fast-step" else model
            try:
                for rep in range(args.reps):
                    for clients in levels:
                        order = list(servers) if rep % 2 == 0 else list(servers)[::-1]
                        for name in order:
                            server, url = servers[name]
                            row = level_with_cpu(url, server, served, clients,
                                                 args.tokens, args.requests)
                            rows.append({"model": label, "variant": name, "rep": rep, **row})
                            print(f"{label:9s} {name:32s} {clients:2d} clients: "
                                  f"{row['output_tps']:7.1f} tok/s  runner "
                                  f"{row['runner_us_per_token']:6.1f} µs/token", flush=True)
            finally:
                harness.stop_servers(servers)
    meta = harness.run_facts(levels=levels, tokens=args.tokens, requests=args.requests,
                             reps=args.reps, models=list(models), ctx=CTX)
    write_report(meta, rows, args, levels, list(models))


def write_report(meta: dict, rows: list[dict], args, levels: list[int],
                 models: list[str]) -> None:
    old, new = VARIANTS

    def runs(key: str, model: str, variant: str, clients: int) -> list[float]:
        return [r[key] for r in sorted(rows, key=lambda r: r["rep"]) if r["model"] == model
                and r["variant"] == variant and r["clients"] == clients]

    lines = [
        "# llama.cpp's idle OpenMP threads: libgomp's spin against localinfer's bound",
        "",
        f"`python3 bench/omp_wait.py{''.join(' ' + a for a in sys.argv[1:])}`: two "
        f"`localinfer serve --parallel {max(levels)} --ctx {CTX}`, the model in a runner; in "
        f"one the runner's GOMP_SPINCOUNT is {LIBGOMP} (libgomp's default), in the other it is "
        f"as shipped ({OMP_SPINS}). {args.tokens} tokens a request, {args.requests} requests "
        f"per client, bench/serve_load.py's raw-socket client; {args.reps} rounds with the "
        f"servers in turns. {os.cpu_count()} CPUs, shared by the servers and the client. The "
        "runner's CPU is µs per streamed token, its llama.cpp threads' spinning included.",
        "",
        "| model | clients | tok/s, libgomp's default | tok/s, bounded | bounded ÷ default "
        "(median) | each round | runner CPU µs/token, default → bounded |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in models:
        for n in levels:
            a, b = runs("output_tps", model, old, n), runs("output_tps", model, new, n)
            ratios = [y / x for x, y in zip(a, b)]
            lines.append(
                f"| {model} | {n} | {statistics.median(a):.0f} | {statistics.median(b):.0f} | "
                f"**{statistics.median(ratios):.2f}** (lowest {min(ratios):.2f}) | "
                f"{' '.join(f'{r:.2f}' for r in ratios)} | "
                f"{statistics.median(runs('runner_us_per_token', model, old, n)):.0f} → "
                f"{statistics.median(runs('runner_us_per_token', model, new, n)):.0f} |")
    fig, axes = harness.figure(len(models), 2, size=(10 / len(models), 3.2))
    for col, model in enumerate(models):
        for row, (key, label) in enumerate([("output_tps", "streamed tokens/s"),
                                            ("runner_us_per_token", "runner CPU µs/token")]):
            ax = axes[row][col]
            for i, variant in enumerate(VARIANTS):
                xs = [x + i * 0.4 for x in range(len(levels))]
                ax.bar(xs, [statistics.median(runs(key, model, variant, n)) for n in levels],
                       0.4, label=variant)
            ax.set_xticks([x + 0.2 for x in range(len(levels))], [f"{n} clients" for n in levels])
            ax.set_ylabel(label)
            if row == 0:
                ax.set_title(model)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("llama.cpp's idle OpenMP threads in a runner: libgomp's spin vs bounded")
    harness.write("omp_wait", meta, {"runs": rows}, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
