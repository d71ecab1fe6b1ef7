"""What a streamed token costs outside the engine: the server's event loop, and the client.

`localinfer serve --parallel N` answers N streaming clients (bench/serve_load.py, in a
process of its own). The model is bench/random_gguf.py's fast-step shape (one thin layer over
smollm2's vocabulary): a CPU decodes it at GPU-like step rates, so the engine does not hide
what surrounds it. CPU time is read per thread of the server from /proc: the main thread runs
the event loop (HTTP, SSE encoding, hand-over of the engine's events), the others llama.cpp
and the engine. Divided by the tokens streamed, each gives CPU µs per token.

Three servers run side by side, measured in turns: the baseline (as localinfer was: a ctypes
call per token for its end flag and bytes; uvicorn on h11 and asyncio's loop), then with the
token facts cached, then also on httptools and uvloop (as localinfer is now). The load comes
from serve_load's raw-socket client, cheap enough not to be the limit; its httpx client runs
once per level against the current server, to show what a Python client costs.

    python3 bench/stream_cost.py [--levels 8,32] [--tokens 256] [--model PATH|NAME] [--reps 3]
                                 [--results FOLDER]

Writes bench/results/stream_cost.{json,md,png}.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

import harness
import psutil
from clients import level_in_subprocess
from random_gguf import fast_step_model  # bench/, the script's own folder

# The same `localinfer serve`, as it was before, a change at a time: the baseline asked
# llama.cpp for each token's end-of-generation flag and bytes (a ctypes call each, which lets
# go of the GIL), and ran uvicorn on its pure-Python HTTP parser and asyncio's own loop.
_UNCACHED_TOKENS = (
    f"import sys\nsys.path.insert(0, {str(harness.ROOT / 'bench')!r})\n"
    "import harness\nharness.uncache_token_calls()\n")
_PURE_PYTHON_HTTP = (
    "import uvicorn\n"
    "init = uvicorn.Config.__init__\n"
    "def pure(self, app, **kw):\n"
    "    init(self, app, **{**kw, 'http': 'h11', 'loop': 'asyncio'})\n"
    "uvicorn.Config.__init__ = pure\n")
VARIANTS = {
    "before: ctypes per token, h11 + asyncio":
        ["-c", _UNCACHED_TOKENS + _PURE_PYTHON_HTTP + harness.MAIN],
    "token facts cached, h11 + asyncio": ["-c", _PURE_PYTHON_HTTP + harness.MAIN],
    "now: cached, httptools + uvloop": ["-m", "localinfer"],
}
BASELINE, NOW = "before: ctypes per token, h11 + asyncio", "now: cached, httptools + uvloop"


def thread_seconds(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a process."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def measure(url: str, pid: int, model_name: str, clients: int, tokens: int, requests: int,
            client: str) -> dict:
    before = thread_seconds(pid)
    client_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    row = level_in_subprocess(url, model_name, clients, requests, tokens, client)
    client_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    after = thread_seconds(pid)
    tokens_total = row["output_tokens"]  # the tokens the streams' usage counts
    loop = after.get(pid, 0) - before.get(pid, 0)
    others = sum(after[t] - before.get(t, 0) for t in after if t != pid)
    client_cpu = ((client_after.ru_utime + client_after.ru_stime)
                  - (client_before.ru_utime + client_before.ru_stime))
    per_token = lambda s: 1e6 * s / tokens_total  # noqa: E731
    return {"clients": clients, "client": client, "tokens": tokens_total,
            "output_tps": row["output_tps"], "ttft_p50_s": row["ttft_p50_s"],
            "loop_us_per_token": per_token(loop), "engine_us_per_token": per_token(others),
            "client_us_per_token": per_token(client_cpu)}


def main() -> None:
    parser = harness.arguments(__doc__, tokens=256, reps=3)
    parser.add_argument("--model", help="a GGUF path or model name [a fast-step random model]")
    parser.add_argument("--levels", default="8,32", help="concurrent clients")
    parser.add_argument("--requests", type=int, default=3, help="per client")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    with tempfile.TemporaryDirectory() as home:
        model = args.model or str(fast_step_model(Path(home)))
        model_name = Path(model).stem if model.endswith(".gguf") else model
        servers = harness.start_servers({
            name: (lambda launch=launch: harness.start_serve(
                [sys.executable, *launch, "serve"], model, max(levels), args.tokens + 128, home))
            for name, launch in VARIANTS.items()})
        rows = []
        try:
            for _ in range(args.reps):
                for clients in levels:
                    for name, (server, url) in servers.items():  # in turns: noise hits all
                        for client in ("raw", "httpx") if name == NOW else ("raw",):
                            row = measure(url, server.pid, model_name, clients, args.tokens,
                                          args.requests, client)
                            rows.append({"variant": name, **row})
                            print(f"{name:40s} {clients:3d} {client:5s} clients: "
                                  f"{row['output_tps']:6.0f} tok/s · CPU per token: loop "
                                  f"{row['loop_us_per_token']:.0f} µs, client "
                                  f"{row['client_us_per_token']:.0f} µs", flush=True)
        finally:
            harness.stop_servers(servers)
    meta = harness.run_facts(model=model_name, levels=levels, tokens=args.tokens,
                             requests=args.requests, reps=args.reps)
    write_report(meta, rows, args, model_name, levels)


def _median(rows: list[dict], key: str, **match) -> float:
    return statistics.median(r[key] for r in rows
                             if all(r[k] == v for k, v in match.items()))


def write_report(meta: dict, rows: list[dict], args, model_name: str,
                 levels: list[int]) -> None:
    top = max(levels)
    tps = {(v, n): _median(rows, "output_tps", variant=v, clients=n, client="raw")
           for v in VARIANTS for n in levels}
    loop = {v: _median(rows, "loop_us_per_token", variant=v, clients=top, client="raw")
            for v in VARIANTS}
    lines = [
        "# What a streamed token costs around the engine",
        "",
        f"`python3 bench/stream_cost.py`: `localinfer serve --parallel {top}` with "
        f"{model_name} (one thin layer: a CPU steps it at a GPU's rate), streaming clients "
        f"of {args.tokens} tokens a request (bench/serve_load.py's raw-socket client); "
        f"medians of {args.reps} runs, the servers in turns. {os.cpu_count()} CPUs, shared by "
        "the server, llama.cpp and the client.",
        "",
        "| server | " + " | ".join(f"tok/s, {n} clients" for n in levels)
        + f" | × before ({top}) | event loop CPU µs/token ({top}) |",
        "|---|" + "---|" * (len(levels) + 2),
    ]
    for v in VARIANTS:
        lines.append(f"| {v} | " + " | ".join(f"{tps[v, n]:.0f}" for n in levels)
                     + f" | {tps[v, top] / tps[BASELINE, top]:.2f} | {loop[v]:.0f} |")
    httpx_cost = _median(rows, "client_us_per_token", client="httpx")
    raw_cost = _median(rows, "client_us_per_token", client="raw")
    lines += [
        "",
        "- **Token facts cached**: the engine asked llama.cpp, per token, whether it ends the "
        "reply and what its bytes are. Each ctypes call lets go of the GIL, and at fast steps "
        "the event loop takes it; getting it back cost the engine thread ~20% of a step "
        "(a native profile of the server). Each token id is now asked once.",
        "- **httptools + uvloop**: uvicorn's C HTTP parser and libuv loop, picked up when "
        f"installed; the loop's CPU per token goes {loop[BASELINE]:.0f} → {loop[NOW]:.0f} µs.",
        f"- A Python client on httpx (one JSON parse a chunk) costs ~{httpx_cost:.0f} µs of CPU "
        f"per token, the raw client ~{raw_cost:.0f}: a load from one httpx process measures the "
        "client, not a fast server (`bench/serve_load.py --client raw`, or `--processes N`).",
    ]
    fig, axes = harness.figure(1, 1, size=(8, 3.4))
    ax = axes[0][0]
    names = list(VARIANTS)
    width = 0.8 / len(levels)
    for i, n in enumerate(levels):
        values = [tps[v, n] for v in names]
        ys = [y + i * width for y in range(len(names))]
        ax.barh(ys, values, height=width, label=f"{n} clients")
        for y, v in zip(ys, values):
            ax.text(v, y, f" {v:.0f}", va="center", fontsize=8)
    ax.set_yticks([y + width * (len(levels) - 1) / 2 for y in range(len(names))], names)
    ax.invert_yaxis()
    ax.set_xlabel("streamed tokens/s (raw client)")
    ax.margins(x=0.15)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(f"localinfer serve at GPU-like step rates ({model_name})")
    harness.write("stream_cost", meta, {"runs": rows}, lines, fig, folder=args.results)


if __name__ == "__main__":
    main()
