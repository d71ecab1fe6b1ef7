"""Embeddings: `localinfer serve` against llama-server `--embedding`, on the same model and pooling.

The embedded SmolLM2-135M (mean pooling on both sides: llama-server `--pooling mean`;
localinfer pools by mean where a file names no pooling). Two loads through /v1/embeddings:
one request of 32 documents of ~140 tokens, and 8 clients at once each sending a request
of 4 such documents. Both servers run side by side (llama-server with 8 slots, as it needs
for 8 requests at once; localinfer's embedding context is its own) and take the load in
turns, round after round. Reported: input tokens a second (the servers' own token counts
over the wall time), each round's ratio and their median.

Build llama-server once (see bench/serve_fast_steps.py's docstring).

    python3 bench/embed_vs_llama_server.py --llama-server PATH [--reps 5]

Writes bench/results/embed_vs_llama_server.{json,md,png}.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness
import httpx

from random_gguf import embedded_smollm2

SERVERS = ("llama-server", "localinfer")
WORDS = ("harbour lantern keeper tide rope gull stone window evening storm ledger candle "
         "island signal ferry north bell copper mill river orchard winter letter bridge").split()
LOADS = {"one request of 32": (1, 32), "8 requests of 4 at once": (8, 4)}


def documents(seed: int, n: int) -> list[str]:
    """n documents of ~140 tokens (140 words), each its own words in its own order."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(140)) for _ in range(n)]


def one_request(url: str, model: str, texts: list[str]) -> int:
    reply = httpx.post(url + "/v1/embeddings", json={"model": model, "input": texts},
                       headers={"Connection": "close"}, timeout=600)
    reply.raise_for_status()
    body = reply.json()
    assert len(body["data"]) == len(texts)
    return body["usage"]["prompt_tokens"]


def load(url: str, model: str, clients: int, per_request: int, seed: int) -> dict:
    batches = [documents(seed * 100 + i, per_request) for i in range(clients)]
    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(lambda texts: one_request(url, model, texts), batches))
    wall = time.perf_counter() - began
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}


def main() -> None:
    parser = harness.arguments(__doc__, reps=5)
    parser.add_argument("--llama-server", type=Path, required=True)
    args = parser.parse_args()
    model = embedded_smollm2()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as home:
        servers = harness.start_servers({
            "llama-server": lambda: harness.start_server(
                [str(args.llama_server)], ["-m", str(model), "--embedding", "--pooling", "mean",
                                           "-np", "8", "-c", "8192"]),
            "localinfer": lambda: harness.start_serve(harness.SERVE, str(model), 1, 2048, home)})
        names = {"llama-server": model.stem, "localinfer": model.stem}
        try:
            for name, (_, url) in servers.items():
                load(url, names[name], 1, 4, 999)  # warm-up: the embedding context is made
            for rep in range(args.reps):
                for label, (clients, per_request) in LOADS.items():
                    order = SERVERS if rep % 2 == 0 else SERVERS[::-1]
                    for name in order:
                        row = load(servers[name][1], names[name], clients, per_request, rep)
                        rows.append({"server": name, "load": label, "rep": rep, **row})
                        print(f"{rep} {name:12s} {label}: {row['tokens_per_s']:7.1f} tok/s "
                              f"({row['tokens']} tokens)", flush=True)
        finally:
            harness.stop_servers(servers)
    report(args, rows)


def report(args, rows: list[dict]) -> None:
    med = statistics.median
    summary, table = {}, []
    fig, axes = harness.figure(len(LOADS))
    for column, label in enumerate(LOADS):
        pick = lambda server: sorted((r for r in rows if r["server"] == server  # noqa: E731
                                      and r["load"] == label), key=lambda r: r["rep"])
        ours, theirs = pick("localinfer"), pick("llama-server")
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(ours, theirs)]
        summary[label] = {"ratio_median": med(ratios), "ratio_min": min(ratios),
                          "ratios": ratios,
                          "localinfer_tps": med(r["tokens_per_s"] for r in ours),
                          "llama_server_tps": med(r["tokens_per_s"] for r in theirs)}
        table.append([label, f"{summary[label]['llama_server_tps']:.0f}",
                      f"{summary[label]['localinfer_tps']:.0f}",
                      f"**{med(ratios):.2f}** (lowest {min(ratios):.2f})",
                      " ".join(f"{x:.2f}" for x in ratios)])
        ax = axes[0][column]
        ax.plot(range(1, len(ratios) + 1), ratios, "o-")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(title=label, xlabel="round", ylabel="localinfer ÷ llama-server tokens/s")
    lines = ["# Embeddings: localinfer against llama-server --embedding", "",
             "The embedded SmolLM2-135M, mean pooling on both sides; documents of ~140 tokens "
             f"through /v1/embeddings; {args.reps} rounds with the servers in turns.", "",
             *harness.markdown_table(["load", "llama-server tokens/s (median)",
                                      "localinfer tokens/s (median)",
                                      "localinfer ÷ llama-server", "each round"], table)]
    meta = harness.run_facts(reps=args.reps, llama_server=str(args.llama_server))
    harness.write("embed_vs_llama_server", meta, {"summary": summary, "runs": rows}, lines,
                  fig, args.results)


if __name__ == "__main__":
    main()
