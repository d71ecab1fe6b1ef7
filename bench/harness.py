"""What every benchmark shares: its command line, the facts of the run, its figure, and
how its results are written.

A benchmark measures, then calls `write(name, meta, results, lines, fig)`, which writes
bench/results/<name>.json ({"meta", "results"}), <name>.png (the figure) and <name>.md (the
lines, then one line of the run's facts and the command that reproduces it). `meta` starts
from `run_facts()`: the date, the machine (OS, CPU, cores), the commit, llama.cpp (the
llama-cpp-python release and the llama.cpp build it carries) and Python, the same keys in
every result. Servers that benchmarks start and compare (ours, llama.cpp's) are here too.

Benchmarks run as scripts (`python3 bench/NAME.py`): this file is imported as `harness`
from their folder. They import no other benchmark; shared code lives in harness.py, clients.py
and random_gguf.py.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import shlex
import statistics
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
STORE = Path(os.environ.get("TMPDIR", "/tmp")) / "localinfer-bench"  # models a run pulls


# ---------------------------------------------------------------------------- the command line
def arguments(doc: str | None, *, writes: bool = True, **defaults: Any
              ) -> argparse.ArgumentParser:
    """A benchmark's parser: its description is the docstring's first paragraph, and each
    keyword adds a shared flag with that default — reps, tokens, threads (None: the free
    cores), models (a list of names), clients (a list of counts). --results (where `write`
    puts the files) is there unless `writes` is false (a tool that writes no results)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    if writes and importlib.util.find_spec("matplotlib") is None:  # (before, not after, a run)
        sys.exit("the figures need matplotlib: python3 -m pip install -e \".[bench]\"")
    if writes:
        parser.add_argument("--results", type=Path, default=RESULTS,
                            help="folder for the JSON, PNG and Markdown [bench/results]")
    shared = {
        "reps": dict(type=int, help="rounds, alternating what is compared"),
        "tokens": dict(type=int, help="tokens generated per request"),
        "threads": dict(type=int, help="llama.cpp threads [the free cores]"),
        "models": dict(nargs="+", help="models to measure (names or .gguf paths)"),
        "clients": dict(type=int, nargs="+", help="concurrent clients, one level each"),
    }
    for name, default in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", default=default, **shared[name])
    return parser


def threads_or_default(threads: int | None) -> int:
    if threads:
        return threads
    from localinfer.backends.llamacpp import default_threads

    return default_threads()


# ---------------------------------------------------------------------------- facts of a run
def run_facts(**settings: Any) -> dict[str, Any]:
    """The same metadata for every result: when, on what, at which commit, with which
    llama.cpp; then the benchmark's own settings."""
    import llama_cpp
    import psutil

    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.platform(),
        "cpu": _cpu_model(),
        "cores": psutil.cpu_count(logical=False) or os.cpu_count(),
        "threads_available": os.cpu_count(),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_build": _llama_build(),
        "python": platform.python_version(),
        **settings,
    }


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _llama_build() -> str:
    """llama.cpp's own system line (the build's CPU features and backends)."""
    import llama_cpp

    try:
        return llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    except Exception:  # an old or unusual build: the release above still names it
        return ""


# ---------------------------------------------------------------------------- the figure
def figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6, 4)):
    """A matplotlib figure with an axes grid (always 2-D), drawn off-screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows),
                        squeeze=False)


# ---------------------------------------------------------------------------- results
def write(name: str, meta: dict[str, Any], results: Any, lines: Sequence[str],
          fig: Any | None = None, folder: Path = RESULTS) -> None:
    """bench/results/<name>.{json,png,md}: the figures, the plot, and the report — the
    report's last lines are the run's facts and the command that reproduces it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"meta": meta, "results": results},
                                                    indent=2, default=str) + "\n")
    text = list(lines)
    if fig is not None:
        fig.tight_layout()
        fig.savefig(folder / f"{name}.png", dpi=120)
        text += ["", f"![{name}]({name}.png)"]
    text += ["", facts_line(meta), "", f"Reproduce: `{reproduce()}`", ""]
    (folder / f"{name}.md").write_text("\n".join(text))
    print(f"wrote {folder / name}.{{json,md{',png' if fig is not None else ''}}}", flush=True)


def facts_line(meta: dict[str, Any]) -> str:
    """When and on what; a report rewritten from figures measured elsewhere (meta's
    "figures_from") says so. A key an older result lacks reads "?"."""
    fact = lambda key: meta.get(key) or "?"  # noqa: E731
    done = (f"Written {fact('date')} from the figures in {meta['figures_from']}"
            if meta.get("figures_from") else f"Measured {fact('date')}")
    return (f"{done} on {fact('cpu')} ({fact('cores')} cores; "
            f"{fact('machine')}), commit {fact('commit')}"
            f"{' with changes' if meta.get('dirty') else ''}, "
            f"llama-cpp-python {fact('llama_cpp_python')}, Python {fact('python')}.")


def reproduce() -> str:
    script = Path(sys.argv[0]).resolve()
    try:
        shown = script.relative_to(ROOT)
    except ValueError:
        shown = script
    return shlex.join(["python3", str(shown), *sys.argv[1:]])


def median_of(rows: Sequence[dict[str, Any]], key: str, **match: Any) -> float | None:
    """The median of `key` over the rows whose fields equal `match` (a missing figure, None,
    left out); None where no row has one."""
    values = [r[key] for r in rows if all(r[k] == v for k, v in match.items())
              and r[key] is not None]
    return statistics.median(values) if values else None


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines."""
    return ([f"| {' | '.join(header)} |", f"|{'---|' * len(header)}"]
            + [f"| {' | '.join(str(c) for c in row)} |" for row in rows])


# ---------------------------------------------------------------------------- servers
# `localinfer`'s command line as `python -c` code: a variant patches something, then runs it
MAIN = "from localinfer.cli import main\nmain()\n"
# `localinfer serve` as an installed user runs it
SERVE = [sys.executable, "-c", MAIN, "serve"]
# a variant's patch: the pool loads models in the server's own process, as before runners (a
# patch of the engine then applies to the model's process: a runner is another)
IN_PROCESS = (
    "import localinfer.pool as pool, localinfer.runners as runners\n"
    "init = pool.ModelPool.__init__\n"
    "def in_process(self, *args, **kw):\n"
    "    init(self, *args, **{**kw, 'backend_factory': runners.llama_cpp_backend})\n"
    "pool.ModelPool.__init__ = in_process\n")


@contextlib.contextmanager
def baseline_tree(revision: str | None, folder: Path):
    """localinfer at another git `revision`, laid out as it installs under `folder`
    (packaging/installed_tree.py), to run with PYTHONPATH: the tree's path (None: no
    revision). Its checkout is a temporary worktree, removed at the end."""
    if revision is None:
        yield None
        return
    root = Path(__file__).resolve().parents[1]
    checkout = folder / "checkout"
    subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(checkout),
                    revision], check=True, capture_output=True)
    try:
        sys.path.insert(0, str(root / "packaging"))
        from installed_tree import build

        yield build(folder / "tree", checkout)
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force",
                        str(checkout)], check=False, capture_output=True)


def first_byte(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(seconds to the first byte on its stdout, seconds to its exit) of one command, as a
    user's `localinfer run --prompt ...` (unbuffered); one that fails ends the run."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               stdin=subprocess.DEVNULL, env={**env, "PYTHONUNBUFFERED": "1"})
    first = process.stdout.read(1)
    first_at = time.perf_counter() - started
    process.stdout.read()
    if process.wait() != 0 or not first:
        raise SystemExit(f"`{' '.join(command)}` failed")
    return first_at, time.perf_counter() - started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(launch: list[str], args: list[str], path: str = "/health",
                 ready: Callable[[httpx.Response], bool] = lambda r: r.status_code == 200,
                 env: dict[str, str] | None = None, timeout: float = 300
                 ) -> tuple[subprocess.Popen, str]:
    """A server on a free loopback port (`launch` + `args` + --host/--port) once its answer
    at `path` is `ready` (e.g. its model loaded); its process and URL. Its log goes to a
    temporary file (a pipe nobody reads would fill and stop a chatty server)."""
    port = free_port()
    log = tempfile.TemporaryFile()
    process = subprocess.Popen([*launch, *args, "--host", "127.0.0.1", "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=log,
                               env={**os.environ, **(env or {})})
    process.log = log  # type: ignore[attr-defined]  # read by server_log
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(process, url + path, ready, timeout)
    return process, url


def start_serve(launch: list[str], model: str, slots: int, ctx: int, home: str | Path,
                env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """`localinfer serve` (`launch`: SERVE, or a variant's command) with `model` loaded in
    `slots` slots of `ctx` tokens, LOCALINFER_HOME at `home` (and `env`): once /api/ps lists
    the model."""
    return start_server(launch, ["--model", model, "--parallel", str(slots), "--ctx", str(ctx)],
                        path="/api/ps", ready=lambda r: bool(r.json().get("models")),
                        env={"LOCALINFER_HOME": str(home), **(env or {})})


def wait_until_ready(process: subprocess.Popen, url: str,
                     ready: Callable[[httpx.Response], bool] = lambda r: r.status_code == 200,
                     timeout: float = 300) -> None:
    """Poll `url` until its answer is `ready`; a server that exits or never gets there is
    stopped and its last log lines raised."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited: {_tail(process)}")
        try:
            if ready(httpx.get(url, timeout=2)):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"{url} was not ready within {timeout:.0f} s: {_tail(process)}")


def server_log(process: subprocess.Popen) -> str:
    """What a server started by start_server has logged so far (its temporary file)."""
    process.log.seek(0)  # type: ignore[attr-defined]
    return process.log.read().decode("utf-8", "replace")  # type: ignore[attr-defined]


def _tail(process: subprocess.Popen) -> str:
    """The last of a stopped server's log (start_server's file, else its stderr pipe)."""
    if process.poll() is None:
        process.kill()
        process.wait()
    if getattr(process, "log", None) is not None:
        return server_log(process)[-2000:]
    if process.stderr is not None:
        return process.stderr.read().decode("utf-8", "replace")[-2000:]
    return ""


def start_servers(starts: dict[str, Callable[[], tuple[subprocess.Popen, str]]]
                  ) -> dict[str, tuple[subprocess.Popen, str]]:
    """Each server in turn (name → what starts it); where one fails to start, those already
    running are stopped before the error goes on (a llama-server left behind holds its
    memory and port after the benchmark has ended)."""
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for name, start in starts.items():
            servers[name] = start()
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: dict[str, tuple[subprocess.Popen, str]]) -> None:
    for process, _ in servers.values():
        process.terminate()
    for process, _ in servers.values():
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


# ---------------------------------------------------------------------------- engine variants
def uncache_token_calls() -> tuple:
    """The engine as it was: two ctypes calls a token (end flag, bytes), each letting go of
    the GIL. Returns what it replaced. bench/step_profile.py's baseline runs it in-process,
    bench/stream_cost.py's baseline server at start-up."""
    import llama_cpp
    from localinfer.backends.native.model import NativeModel

    saved = NativeModel.is_eog, NativeModel.piece
    NativeModel.is_eog = lambda self, t: bool(llama_cpp.llama_vocab_is_eog(self.vocab, t))
    NativeModel.piece = lambda self, t: self._piece(t, self._piece_buf)
    return saved
