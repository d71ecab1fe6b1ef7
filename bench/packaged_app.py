"""The packaged app against the pip install: size on disk, time to the first token, memory.

Both run the same llama.cpp build (the wheel packaging/build_linux.py bundles, installed with
`pip install .` in build/pkg/venv) and the same embedded model, so the difference is the
packaging: PyInstaller's one-folder bundle against a virtual environment. Each rep starts
`localinfer run --prompt ... --max-tokens 8` from nothing and times, from outside the process,
the first byte of the reply on stdout and the exit; peak RSS is polled every 5 ms. Runs
alternate (after one warm-up each) so machine noise hits both alike.

    python3 packaging/build_linux.py && python3 bench/packaged_app.py [--reps 5] [--results FOLDER]

Writes bench/results/packaged_app.{json,png,md}.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import harness
import psutil

WORK = harness.ROOT / "build" / "pkg"
PROMPT = "What is the capital of France?"
# in the build environment only to make the bundle; a user's pip install has none of them
BUILD_ONLY = ("pyinstaller", "pyinstaller_hooks_contrib", "altgraph", "pip", "setuptools",
              "_distutils_hack")


def one_run(program: list[str], home: Path) -> dict:
    env = {**os.environ, "LOCALINFER_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    proc = subprocess.Popen([*program, "run", "--prompt", PROMPT, "--max-tokens", "8"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    watched = psutil.Process(proc.pid)
    peak = 0
    os.set_blocking(proc.stdout.fileno(), False)
    first = None
    while proc.poll() is None:
        try:
            peak = max(peak, watched.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        if first is None and proc.stdout.read(1):
            first = time.perf_counter() - started
        time.sleep(0.005)
    ended = time.perf_counter() - started
    if proc.returncode != 0 or first is None:
        raise SystemExit(f"{program[0]} failed (exit {proc.returncode})")
    return {"first_token_s": first, "exit_s": ended, "peak_rss_mib": peak / 2**20}


def size_mib(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 2**20
    return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir()) / 2**20


def pip_install_mib(venv: Path) -> float:
    site = next(venv.glob("lib/python*/site-packages"))
    return sum(size_mib(p) for p in site.iterdir()
               if not p.name.lower().startswith(tuple(b.lower() for b in BUILD_ONLY)))


def main() -> None:
    parser = harness.arguments(__doc__, reps=5)
    args = parser.parse_args()
    bundle = WORK / "dist" / "localinfer"
    venv = WORK / "venv"
    kinds = {"bundle": [str(bundle / "localinfer")], "pip": [str(venv / "bin" / "localinfer")]}
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as home:
        for program in kinds.values():
            one_run(program, Path(home))  # warm-up: page cache, the store's first files
        for _ in range(args.reps):
            for kind, program in kinds.items():
                runs[kind].append(one_run(program, Path(home)))
    out = WORK / "out"
    sizes = {"bundle_folder": size_mib(bundle),
             "tarball": size_mib(next(out.glob("localinfer-*.tar.gz"))),
             "deb": size_mib(next(out.glob("localinfer_*.deb"))),
             "pip_site_packages": pip_install_mib(venv)}
    medians = {kind: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
               for kind, rs in runs.items()}
    meta = harness.run_facts(reps=args.reps, prompt=PROMPT, max_tokens=8, model="smollm2:135m")
    harness.write("packaged_app", meta, {"sizes_mib": sizes, "median": medians, "runs": runs},
                  report(sizes, medians, args.reps), plot(sizes, medians), folder=args.results)


def report(sizes: dict, medians: dict, reps: int) -> list[str]:
    b, p = medians["bundle"], medians["pip"]
    lines = [
        "# The packaged app against the pip install",
        "",
        "`python3 bench/packaged_app.py` after `python3 packaging/build_linux.py`; both run the same",
        f"llama.cpp build and the embedded model; median of {reps} alternating runs of",
        "`localinfer run --prompt ... --max-tokens 8`, timed from outside the process.",
        "",
        "| | bundle | pip install | bundle / pip |",
        "|---|---|---|---|",
        f"| first token after start | {b['first_token_s']:.2f} s | {p['first_token_s']:.2f} s "
        f"| {b['first_token_s'] / p['first_token_s']:.2f} |",
        f"| start to exit | {b['exit_s']:.2f} s | {p['exit_s']:.2f} s "
        f"| {b['exit_s'] / p['exit_s']:.2f} |",
        f"| peak memory (RSS) | {b['peak_rss_mib']:.0f} MiB | {p['peak_rss_mib']:.0f} MiB "
        f"| {b['peak_rss_mib'] / p['peak_rss_mib']:.2f} |",
        f"| on disk | {sizes['bundle_folder']:.0f} MiB (folder) | "
        f"{sizes['pip_site_packages']:.0f} MiB (site-packages) | "
        f"{sizes['bundle_folder'] / sizes['pip_site_packages']:.2f} |",
        "",
        f"Downloads: tarball {sizes['tarball']:.0f} MiB, .deb {sizes['deb']:.0f} MiB. The pip "
        "figure leaves out the Python interpreter the user already has; the bundle carries its",
        "own. Either way about 94 MiB of it is the embedded model.",
    ]
    return lines


def plot(sizes: dict, medians: dict):
    fig, axes = harness.figure(3, 1, size=(11 / 3, 3.6))
    axes = axes[0]
    panels = [("first token after start (s)", [medians[k]["first_token_s"] for k in ("bundle", "pip")]),
              ("peak memory (MiB)", [medians[k]["peak_rss_mib"] for k in ("bundle", "pip")]),
              ("on disk (MiB)", [sizes["bundle_folder"], sizes["pip_site_packages"]])]
    for ax, (title, values) in zip(axes, panels):
        ax.bar(["bundle", "pip install"], values, color=["#1f4fd1", "#9aa4b2"])
        ax.set_title(title)
        ax.margins(y=0.15)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.2f}" if v < 10 else f"{v:.0f}", ha="center", va="bottom")
    fig.suptitle("localinfer packaged (PyInstaller one-folder) against pip install")
    return fig


if __name__ == "__main__":
    main()
