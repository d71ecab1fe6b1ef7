"""How soon `localinfer run` answers: its runner process started at the command's start (a
spare that loads llama.cpp while the command imports, reads the model's header and plans),
against the runner started when the load begins (as before), and against no runner at all
(the model in the command's own process, as before runners).

Each run is a fresh `localinfer run MODEL --prompt ... --max-tokens 8`, as a user types it;
the figures are the time from starting the command to the reply's first byte on its stdout,
and to its exit. The variants take turns.

    python3 bench/runner_start.py [--model smollm2:135m] [--reps 10] [--out NAME]
                                  [--results FOLDER]

Writes bench/results/runner_start.{json,md,png} (--out names them).
"""

from __future__ import annotations

import os
import statistics
import sys

import harness

_MAIN = "import sys\nfrom localinfer.cli import main\nsys.argv[0] = 'localinfer'\nmain()\n"
_NO_SPARE = ("import localinfer.backends.runner.spawn as runner\n"
             "runner.warm_spare = lambda: None  # the runner starts when the load does\n")
_IN_PROCESS = ("import localinfer.runners as runners, localinfer.service as service\n"
               "load = service.load_model  # no runner: the model in `run` itself\n"
               "service.load_model = lambda *a, **k: load(*a, **{**k, 'backend_factory': "
               "runners.llama_cpp_backend})\n")
VARIANTS = {"at the load": ["-c", _NO_SPARE + _MAIN], "at the start": ["-m", "localinfer"],
            "none (in process)": ["-c", _IN_PROCESS + _MAIN]}


def once(variant: list[str], model: str) -> tuple[float, float]:
    """(seconds to the reply's first byte, seconds to exit) of one `run`."""
    command = [sys.executable, *variant, "run", model, "--prompt", "Say hello.",
               "--max-tokens", "8", "--temperature", "0"]
    return harness.first_byte(command, dict(os.environ))


def main() -> None:
    parser = harness.arguments(__doc__, reps=10)
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--out", default="runner_start", help="file names under --results")
    args = parser.parse_args()
    rows = []
    for name, variant in VARIANTS.items():  # a warm-up each: the OS caches the files
        once(variant, args.model)
    for rep in range(args.reps):
        for name, variant in VARIANTS.items():
            first, total = once(variant, args.model)
            rows.append({"variant": name, "rep": rep, "first_byte_s": first, "exit_s": total})
            print(f"{name:13s} first byte {first:.3f} s  exit {total:.3f} s", flush=True)
    meta = harness.run_facts(model=args.model, reps=args.reps)
    write_report(meta, rows, args)


def write_report(meta: dict, rows: list[dict], args) -> None:
    def median(key: str, variant: str) -> float:
        return statistics.median(r[key] for r in rows if r["variant"] == variant)

    ratios = [a["first_byte_s"] / b["first_byte_s"] for a, b in zip(
        (r for r in rows if r["variant"] == "at the start"),
        (r for r in rows if r["variant"] == "at the load"))]
    lines = [
        "# When `localinfer run` starts its runner",
        "",
        f"`python3 bench/runner_start.py{''.join(' ' + a for a in sys.argv[1:])}`: "
        f"`localinfer run {args.model} --prompt 'Say hello.' --max-tokens 8`, a fresh command "
        f"each time, the variants in turns; medians of {args.reps} runs on "
        f"{os.cpu_count()} CPUs. The runner process started when the command starts (a "
        "spare, loading llama.cpp meanwhile) or when the load begins; or no runner, the model "
        "in the command's own process.",
        "",
        "| runner started | to the reply's first byte (s) | to exit (s) |",
        "|---|---|---|",
    ]
    for variant in VARIANTS:
        lines.append(f"| {variant} | {median('first_byte_s', variant):.3f} | "
                     f"{median('exit_s', variant):.3f} |")
    lines += ["", f"First byte, at the start ÷ at the load, pair by pair: median "
              f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})."]
    fig, axes = harness.figure(1, 1, size=(7.5, 3.2))
    ax = axes[0][0]
    for i, key in enumerate(("first_byte_s", "exit_s")):
        xs = [x + i * 0.4 for x in range(len(VARIANTS))]
        ax.bar(xs, [median(key, v) for v in VARIANTS], 0.4,
               label="first byte of the reply" if i == 0 else "exit")
    ax.set_xticks([x + 0.2 for x in range(len(VARIANTS))],
                  [f"runner: {v}" for v in VARIANTS])
    ax.set_ylabel("seconds from the command's start")
    ax.legend()
    ax.set_title(f"localinfer run {args.model}: when its runner starts")
    harness.write(args.out, meta, {"runs": rows}, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
