"""`localinfer serve` against llama-cpp-python's bundled server, with concurrent streaming clients.

Both servers run as real processes on loopback with the same model file, context per request
and threads; the unmodified `openai` client streams chat completions from N threads at once
(N = 1, 4, 8; each client sends its requests one after another). Measured outside the servers:
TTFT per request, aggregate output tokens/s (content chunks over wall time), and how many
replies came back empty. Runs alternate between the servers so machine noise hits both.

    python3 bench/serve_vs_llama_server.py [--requests-per-client 2] [--max-tokens 64]
                                           [--levels 1,4,8] [--results FOLDER]

Needs the bench extra (`pip install -e ".[bench]"`). Writes
bench/results/serve_vs_llama_server.{json,png,md}.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness
import openai

from localinfer.model_store.sources import resolve

N_CTX = 1024
THREADS = 2
TOPICS = ["lighthouses", "volcanoes", "honeybees", "glaciers", "trains", "coral reefs",
          "comets", "bridges", "owls", "deserts", "violins", "tides", "maps", "salt",
          "windmills", "octopuses"]


def _start(kind: str, model: Path, parallel: int) -> tuple[subprocess.Popen, str]:
    if kind == "localinfer":
        return harness.start_server(
            [sys.executable, "-m", "localinfer", "serve"],
            ["--model", "smollm2:135m", "--parallel", str(parallel), "--ctx", str(N_CTX),
             "--threads", str(THREADS)], path="/health")
    # the bundled server with its defaults, as a user starts it
    return harness.start_server(
        [sys.executable, "-m", "llama_cpp.server"],
        ["--model", str(model), "--n_ctx", str(N_CTX), "--n_threads", str(THREADS)],
        path="/v1/models")


def _one(url: str, model: str, topic: str, max_tokens: int) -> dict:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    start = time.monotonic()
    first, chunks, error = None, 0, None
    try:
        for chunk in client.chat.completions.create(
                model=model, temperature=0, max_tokens=max_tokens, stream=True,
                messages=[{"role": "user", "content": f"Write a short essay about {topic}."}]):
            for choice in chunk.choices:
                if choice.delta.content:
                    first = first or time.monotonic()
                    chunks += 1
    except Exception as exc:  # a cut-off stream is a result here, not a crash of the bench
        error = type(exc).__name__
    return {"ttft": None if first is None else first - start, "chunks": chunks,
            "end": time.monotonic(), "start": start, "error": error}


def _level(url: str, model: str, clients: int, per_client: int, max_tokens: int) -> dict:
    def client(i: int) -> list[dict]:
        return [_one(url, model, TOPICS[(i * per_client + j) % len(TOPICS)], max_tokens)
                for j in range(per_client)]

    began = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client, range(clients)) for r in rs]
    wall = time.monotonic() - began
    ttfts = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    return {
        "clients": clients, "requests": len(results),
        "empty": sum(1 for r in results if r["chunks"] == 0),
        "errors": sum(1 for r in results if r["error"]),
        "output_tokens": sum(r["chunks"] for r in results),
        "wall_s": wall,
        "aggregate_tps": sum(r["chunks"] for r in results) / wall,
        "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
        "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None,
    }


def main() -> None:
    parser = harness.arguments(__doc__)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--levels", default="1,4,8")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    model = resolve("smollm2:135m", harness.STORE).path
    results: dict[str, list[dict]] = {"localinfer": [], "llama_cpp.server": []}
    for clients in levels:
        for kind in results:  # alternate: each level runs on both before the next
            server = _start("localinfer" if kind == "localinfer" else "bundled", model,
                            parallel=max(levels))
            _, url = server
            try:
                name = "smollm2:135m" if kind == "localinfer" else str(model)
                _one(url, name, "warm-up", 4)
                level = _level(url, name, clients, args.requests_per_client, args.max_tokens)
            finally:
                harness.stop_servers({kind: server})
            results[kind].append(level)
            print(f"{kind:17s} clients={clients}: {level['aggregate_tps']:6.1f} tok/s  "
                  f"TTFT p50 {level['ttft_p50_s'] or float('nan'):.3f} s  "
                  f"p99 {level['ttft_p99_s'] or float('nan'):.3f} s  "
                  f"empty {level['empty']}/{level['requests']}", flush=True)
    _write(results, args, levels)


def _write(results: dict, args, levels: list[int]) -> None:
    meta = harness.run_facts(threads=THREADS, n_ctx=N_CTX, max_tokens=args.max_tokens,
                             requests_per_client=args.requests_per_client, levels=levels,
                             model="smollm2:135m")
    ours, theirs = results["localinfer"], results["llama_cpp.server"]
    lines = ["# `localinfer serve` vs llama-cpp-python's bundled server", "",
             f"smollm2:135m, {THREADS} threads, context {N_CTX} per request, greedy, "
             f"{args.max_tokens} max tokens, {args.requests_per_client} streaming requests per "
             f"client, measured by the clients.", "",
             "| clients | localinfer tok/s | bundled tok/s | ratio | localinfer TTFT p50 / p99 (s) "
             "| bundled TTFT p50 / p99 (s) | bundled empty replies |",
             "|---|---|---|---|---|---|---|"]
    fmt = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    for a, b in zip(ours, theirs):
        ratio = a["aggregate_tps"] / b["aggregate_tps"] if b["aggregate_tps"] else float("inf")
        lines.append(f"| {a['clients']} | {a['aggregate_tps']:.1f} | {b['aggregate_tps']:.1f} | "
                     f"{ratio:.2f} | {fmt(a['ttft_p50_s'])} / {fmt(a['ttft_p99_s'])} | "
                     f"{fmt(b['ttft_p50_s'])} / {fmt(b['ttft_p99_s'])} | "
                     f"{b['empty']} of {b['requests']} |")
    fig, axes = harness.figure(2, 1, size=(5, 4))
    left, right = axes[0]
    for name, rows in results.items():
        left.plot(levels, [r["aggregate_tps"] for r in rows], marker="o", label=name)
        right.plot(levels, [r["ttft_p99_s"] or 0 for r in rows], marker="o", label=name)
    left.set(xlabel="concurrent streaming clients", ylabel="output tok/s (all clients)")
    right.set(xlabel="concurrent streaming clients", ylabel="P99 TTFT (s)")
    left.legend()
    harness.write("serve_vs_llama_server", meta, results, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
