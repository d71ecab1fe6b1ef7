"""What a streamed token costs outside the engine: the server's event loop, and the client.

`localinfer serve` answers N streaming clients (bench/serve_load.py, Python threads over
httpx, in a process of its own). CPU time is read per thread of the server from /proc: the
main thread runs the event loop (HTTP, SSE encoding, hand-over of the engine's events),
the others llama.cpp and the engine. Divided by the tokens streamed, each gives CPU µs per
token, and 1 s over that is the most tokens a second that part could carry on one core,
whatever the engine's speed: the ceiling of the HTTP/SSE path, and of the client.

    python3 bench/stream_cost.py [--clients 32] [--tokens 64] [--model smollm2:135m]

Writes bench/results/stream_cost.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def thread_seconds(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a process."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: str, clients: int, tokens: int, home: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "LOCALINFER_HOME": str(home)}
    server = subprocess.Popen(
        [sys.executable, "-m", "localinfer", "serve", "--model", model, "--port", str(port),
         "--parallel", str(clients), "--ctx", str(clients * (tokens + 64))],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/api/ps", timeout=1).json().get("models"):
                return server, url
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    server.kill()
    raise SystemExit("the server did not load its model within 120 s")


def measure(url: str, pid: int, model: str, clients: int, tokens: int, requests: int,
            processes: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as out:
        before = thread_seconds(pid)
        client_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(
            [sys.executable, str(ROOT / "bench" / "serve_load.py"), "--url", url, "--model",
             model, "--levels", str(clients), "--requests-per-client", str(requests),
             "--max-tokens", str(tokens), "--processes", str(processes), "--out", out.name],
            check=True, capture_output=True)
        client_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        after = thread_seconds(pid)
        row = json.loads(Path(out.name).read_text().splitlines()[-1])
    if row["errors"] or row["empty"]:
        raise SystemExit(f"the load had errors or empty replies: {row}")
    tokens_total = row["output_tokens"]  # content chunks: one a token, as the server sends them
    loop = after.get(pid, 0) - before.get(pid, 0)
    others = sum(after[t] - before.get(t, 0) for t in after if t != pid)
    client = ((client_after.ru_utime + client_after.ru_stime)
              - (client_before.ru_utime + client_before.ru_stime))
    per_token = lambda s: 1e6 * s / tokens_total  # noqa: E731
    return {"clients": clients, "client_processes": processes, "tokens": tokens_total,
            "output_tps": row["output_tps"],
            "loop_us_per_token": per_token(loop), "engine_us_per_token": per_token(others),
            "client_us_per_token": per_token(client),
            "loop_ceiling_tps": 1e6 / per_token(loop), "client_ceiling_tps": 1e6 / per_token(client)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=2, help="per client")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        server, url = start_server(args.model, args.clients, args.tokens, Path(home))
        try:
            rows = [measure(url, server.pid, args.model, args.clients, args.tokens,
                            args.requests, processes)
                    for _ in range(args.reps) for processes in (1, 2)]
        finally:
            server.terminate()
            server.wait(timeout=30)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "stream_cost.json").write_text(json.dumps({"args": vars(args), "runs": rows},
                                                         indent=2))
    write_report(rows, args)
    for r in rows:
        print(f"{r['client_processes']} client process(es): ", end="")
        print(f"{r['output_tps']:7.1f} tok/s streamed · CPU per token: server loop "
              f"{r['loop_us_per_token']:.0f} µs (ceiling {r['loop_ceiling_tps']:.0f} tok/s), "
              f"engine+llama {r['engine_us_per_token']:.0f} µs, client "
              f"{r['client_us_per_token']:.0f} µs (ceiling {r['client_ceiling_tps']:.0f} tok/s)")


def write_report(rows: list[dict], args: argparse.Namespace) -> None:
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = lambda key, p=None: statistics.median(  # noqa: E731
        r[key] for r in rows if p is None or r["client_processes"] == p)
    loop, client = med("loop_us_per_token"), med("client_us_per_token")
    lines = [
        "# What a streamed token costs outside the engine",
        "",
        f"`python3 bench/stream_cost.py`: `localinfer serve --parallel {args.clients}` with "
        f"{args.model}, {args.clients} streaming clients (bench/serve_load.py: Python threads over",
        f"httpx), {args.tokens} tokens a request; CPU time per thread of the server from /proc, of",
        f"the client from its rusage; medians of {len(rows)} runs.",
        "",
        "| part | CPU µs per streamed token | most tokens/s on one core |",
        "|---|---|---|",
        f"| server event loop (HTTP, SSE, event hand-over) | {loop:.0f} | {1e6 / loop:.0f} |",
        f"| Python client (httpx, one JSON parse a chunk) | {client:.0f} | {1e6 / client:.0f} |",
        f"| engine and llama.cpp (this CPU) | {med('engine_us_per_token'):.0f} | — |",
        "",
        f"Streamed: {med('output_tps', 1):.0f} tok/s with one client process, "
        f"{med('output_tps', 2):.0f} with two (the engine is the limit on this CPU).",
        "A Python client process tops out near a quarter of what the server's loop carries, so",
        "a load from one such process measures the client on a fast engine: run bench/serve_load.py",
        "with `--processes N` against a GPU. About half of the loop's time is the socket write of",
        "each chunk (a sampling profile of the server under this load).",
        "",
        "![stream cost](stream_cost.png)",
        "",
    ]
    (RESULTS / "stream_cost.md").write_text("\n".join(lines))
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    names = ["server event loop", "Python client"]
    values = [1e6 / loop, 1e6 / client]
    ax.barh(names, values, color=["#1f4fd1", "#9aa4b2"])
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.0f}", va="center")
    ax.set_xlabel("streamed tokens/s one core can carry")
    ax.margins(x=0.15)
    ax.set_title(f"per-token CPU outside the engine ({args.clients} streams)")
    fig.tight_layout()
    fig.savefig(RESULTS / "stream_cost.png", dpi=120)


if __name__ == "__main__":
    main()
