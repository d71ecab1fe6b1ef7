"""How soon a command is ready: `localinfer serve --model M` from its start to the model
listed (/api/ps), and `localinfer run M --prompt ... --max-tokens 1` to the reply's first
byte; against llama-server's start to /health ok on the same file, and against localinfer at
another revision (--baseline REV: checked out in a temporary worktree and laid out as it
installs by packaging/installed_tree.py, run with PYTHONPATH).

A fresh process each time, as a user types it; the variants take turns, after a warm-up of
each (the OS caches the files, and Python writes its bytecode: a user's install has it, so
PYTHONDONTWRITEBYTECODE is dropped for the commands). The model is the embedded smollm2.

    python3 bench/serve_start.py --llama-server PATH [--baseline REV] [--reps 5]
                                 [--results FOLDER]

Writes bench/results/serve_start.{json,md,png}.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import harness
from random_gguf import embedded_smollm2

MODEL = "smollm2:135m"


def _ready(url: str, process: subprocess.Popen, ready, timeout: float = 120) -> float:
    """Seconds until `ready(answer)` at `url` (polled every 10 ms), from `process`'s start
    (its `started` attribute)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited ({process.returncode})")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if ready(httpx.get(url, timeout=1)):
                return time.perf_counter() - process.started
        time.sleep(0.01)
    raise SystemExit(f"{url} was not ready within {timeout:.0f} s")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _start(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               stdin=subprocess.DEVNULL, env=env)
    process.started = started  # type: ignore[attr-defined]
    return process


def serve_seconds(env: dict[str, str]) -> float:
    port = harness.free_port()
    process = _start([sys.executable, "-m", "localinfer", "serve", "--model", MODEL,
                      "--port", str(port)], env)
    try:
        return _ready(f"http://127.0.0.1:{port}/api/ps", process,
                      lambda r: bool(r.json().get("models")))
    finally:
        _stop(process)


def llama_server_seconds(binary: Path, env: dict[str, str]) -> float:
    port = harness.free_port()
    process = _start([str(binary), "-m", str(embedded_smollm2()), "--port", str(port)], env)
    try:
        return _ready(f"http://127.0.0.1:{port}/health", process, lambda r: r.status_code == 200)
    finally:
        _stop(process)


def main() -> None:
    parser = harness.arguments(__doc__, reps=5)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--baseline", help="a git revision of localinfer to measure beside")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as folder, \
            harness.baseline_tree(args.baseline, Path(folder)) as tree:
        envs = {"localinfer": {**env, "LOCALINFER_HOME": str(Path(folder) / "home")}}
        if tree is not None:
            envs[f"localinfer at {args.baseline}"] = {
                **envs["localinfer"], "PYTHONPATH": str(tree)}
        rows = []
        for rep in range(-1, args.reps):  # round -1: the warm-up, not counted
            for name, variant_env in envs.items():
                row = {"variant": name, "rep": rep, "serve_s": serve_seconds(variant_env),
                       "run_s": first_byte(variant_env)}
                _report(row, rows)
            _report({"variant": "llama-server", "rep": rep, "run_s": None,
                     "serve_s": llama_server_seconds(args.llama_server, env)}, rows)
    meta = harness.run_facts(model=MODEL, reps=args.reps, baseline=args.baseline)
    write_report(meta, [r for r in rows if r["rep"] >= 0], list(envs) + ["llama-server"], args)


def _report(row: dict, rows: list[dict]) -> None:
    rows.append(row)
    run = "" if row["run_s"] is None else f"  run's first byte {row['run_s']:.3f} s"
    print(f"{row['rep']:2d} {row['variant']:28s} serve {row['serve_s']:.3f} s{run}", flush=True)


def first_byte(env: dict[str, str]) -> float:
    """`localinfer run`'s start to its reply's first byte on stdout."""
    return harness.first_byte([sys.executable, "-m", "localinfer", "run", MODEL, "--prompt",
                               "Say hello.", "--max-tokens", "1", "--temperature", "0"], env)[0]


def write_report(meta: dict, rows: list[dict], variants: list[str], args) -> None:
    def cell(key: str, variant: str) -> str:
        value = harness.median_of(rows, key, variant=variant)
        if value is None:
            return "—"
        rounds = " ".join(f"{r[key]:.2f}" for r in rows if r["variant"] == variant)
        return f"**{value:.2f}** ({rounds})"

    lines = [
        "# How soon `localinfer serve` and `run` are ready",
        "",
        f"`python3 bench/serve_start.py`: `localinfer serve --model {MODEL}` from its start to "
        "the model listed (/api/ps), against llama-server's start to /health ok on the same "
        f"file (its defaults); `localinfer run {MODEL} --prompt 'Say hello.' --max-tokens 1` "
        "to its reply's first byte. A fresh process each time, the variants in turns after a "
        f"warm-up round; medians of {args.reps} rounds (each round in brackets), seconds, on "
        f"{os.cpu_count()} CPUs. Python's bytecode is written and used, as in an install.",
        "",
        *harness.markdown_table(["", "serve: start to model listed (s)",
                                 "run: start to the reply's first byte (s)"],
                                [[v, cell("serve_s", v), cell("run_s", v)] for v in variants]),
    ]
    fig, axes = harness.figure(1, 1, size=(7.5, 3.2))
    ax = axes[0][0]
    for i, (key, label) in enumerate((("serve_s", "serve: model listed"),
                                      ("run_s", "run: first byte"))):
        xs = [x + i * 0.4 for x in range(len(variants))]
        ax.bar(xs, [harness.median_of(rows, key, variant=v) or 0 for v in variants], 0.4,
               label=label)
    ax.set_xticks([x + 0.2 for x in range(len(variants))], variants)
    ax.set_ylabel("seconds from the command's start")
    ax.legend()
    ax.set_title(f"{MODEL}: how soon each is ready")
    harness.write("serve_start", meta, {"runs": rows}, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
