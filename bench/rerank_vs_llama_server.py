"""Reranking throughput: `localinfer serve` against `llama-server --reranking`.

The model is a cross-encoder of ms-marco-MiniLM-L6-v2's shape (bench/random_gguf.py's
"minilm-rerank": BERT, six layers of 384, a one-label classifier, bge's WordPiece vocabulary
from llama.cpp's source) with random Q8_0 weights, as llama.cpp's converter writes one (no
pooling key: llama-server's --reranking sets rank pooling; localinfer knows it by its head).
Each request is what a retrieval step sends: one query and --documents chunks of ~256
tokens, `/v1/rerank` in the Jina/Cohere shape both servers serve. N clients (1, 4, 16) send
--requests each, one after another. Measured outside the servers: documents scored a second
over the level's wall time, and each request's latency (p50, p99). Rounds alternate between
the servers; medians. Both servers are started as a user would, with one --parallel / -np
for both (4) and the same context.

Build llama-server once (see bench/serve_fast_steps.py's docstring); its source tree gives
the vocabulary.

    python3 bench/rerank_vs_llama_server.py --llama-server PATH [--reps 3]
                                            [--clients 1 4 16] [--documents 64]
                                            [--model GGUF --out NAME]

--model takes another reranker (its file's stem names it to both servers): a causal one
shows what the output rows cost (backends/native/embeddings.py), which an encoder has few of.

Writes bench/results/rerank_vs_llama_server.{json,md,png} (--out names them).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness
import httpx
from random_gguf import ARCH_SHAPES, read_tokenizer, write_arch

SERVERS = ("llama-server", "localinfer")
MODEL = "minilm-rerank-random"  # the file's stem: localinfer's name for it
SLOTS = 4
CTX = 4 * 512  # per slot: a pair of ~270 tokens with room
_WORDS = ("river bank loan interest harbour ferry ledger signal lantern keeper storm tide "
          "island rope window candle evening gull stone market price").split()


def model_file(source: Path, folder: Path) -> Path:
    tokenizer = read_tokenizer(source / "models" / "ggml-vocab-bert-bge.gguf")
    path = folder / f"{MODEL}.gguf"
    write_arch(ARCH_SHAPES["minilm-rerank"], path, tokenizer, "random minilm-rerank Q8_0")
    return path


def documents(seed: int, count: int) -> list[str]:
    """`count` chunks of ~256 tokens (190 words of one WordPiece token or two)."""
    return [" ".join(_WORDS[(seed * 13 + d * 7 + w * 5) % len(_WORDS)] for w in range(190))
            for d in range(count)]


def _request(client: httpx.Client, url: str, model: str, query: str, docs: list[str]
             ) -> float:
    start = time.perf_counter()
    response = client.post(url + "/v1/rerank", json={"model": model, "query": query,
                                                     "documents": docs, "top_n": 5})
    if response.status_code != 200:
        raise SystemExit(f"{url}: HTTP {response.status_code}: {response.text[:300]}")
    results = response.json()["results"]
    if len(results) != min(5, len(docs)):
        raise SystemExit(f"{url}: {len(results)} results for top_n 5")
    return time.perf_counter() - start


def level(url: str, clients: int, requests: int, n_docs: int, seed: int,
          model: str = MODEL) -> dict:
    def client(i: int) -> list[float]:
        with httpx.Client(timeout=900) as http:
            return [_request(http, url, model, f"where is the ferry {i} {j}?",
                             documents(seed + i * requests + j, n_docs))
                    for j in range(requests)]

    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        latencies = sorted(t for ts in pool.map(client, range(clients)) for t in ts)
    wall = time.perf_counter() - began
    return {"clients": clients, "documents": clients * requests * n_docs, "wall_s": wall,
            "docs_per_s": clients * requests * n_docs / wall,
            "p50_s": statistics.median(latencies),
            "p99_s": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]}


def main() -> None:
    parser = harness.arguments(__doc__, reps=3, clients=[1, 4, 16])
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--source", type=Path,
                        help="llama.cpp's source tree [the one llama-server was built in]")
    parser.add_argument("--documents", type=int, default=64, help="per request")
    parser.add_argument("--requests", type=int, default=1, help="per client")
    parser.add_argument("--model", type=Path,
                        help="a reranker GGUF in place of the MiniLM-shaped one, e.g. a "
                             "Qwen3-Reranker-0.6B shape: python3 -c \"from tests.families "
                             "import reranker_model as r; print(r('qwen3', '0.6b'))\"")
    parser.add_argument("--out", default="rerank_vs_llama_server", help="file names")
    args = parser.parse_args()
    source = args.source or args.llama_server.resolve().parents[2]
    runs: dict[int, dict[str, list]] = {n: {s: [] for s in SERVERS} for n in args.clients}
    with tempfile.TemporaryDirectory() as home:
        model = args.model or model_file(source, Path(home))
        servers = harness.start_servers({
            "llama-server": lambda: harness.start_server(
                [str(args.llama_server)], ["-m", str(model), "--reranking", "-np", str(SLOTS),
                                           "-c", str(CTX * SLOTS)]),
            "localinfer": lambda: harness.start_serve(harness.SERVE, str(model), SLOTS, CTX, home)})
        try:
            for rep in range(args.reps):
                for clients in args.clients:
                    order = SERVERS if rep % 2 == 0 else SERVERS[::-1]
                    for name in order:
                        row = level(servers[name][1], clients, args.requests, args.documents,
                                    seed=rep * 1000 + clients, model=model.stem)
                        runs[clients][name].append(row)
                        print(name, rep, clients, f"{row['docs_per_s']:.3g} docs/s",
                              f"p50 {row['p50_s']:.2f} s", flush=True)
        finally:
            harness.stop_servers(servers)
    report(args, runs)


def report(args, runs: dict) -> None:
    med = statistics.median
    summary, rows = {}, []
    fig, axes = harness.figure()
    for clients, by_server in runs.items():
        summary[clients] = {}
        for name in SERVERS:
            rounds = by_server[name]
            summary[clients][name] = {
                "docs_per_s": med(r["docs_per_s"] for r in rounds),
                "p50_s": med(r["p50_s"] for r in rounds),
                "p99_s": med(r["p99_s"] for r in rounds),
                "rounds_docs_per_s": [r["docs_per_s"] for r in rounds]}
        ours, theirs = summary[clients]["localinfer"], summary[clients]["llama-server"]
        ratios = [a["docs_per_s"] / b["docs_per_s"]
                  for a, b in zip(by_server["localinfer"], by_server["llama-server"])]
        summary[clients]["ratio"] = med(ratios)
        rows.append([clients, f"{theirs['docs_per_s']:.3g}", f"{ours['docs_per_s']:.3g}",
                     f"**{med(ratios):.2f}** ({min(ratios):.2f}–{max(ratios):.2f})",
                     f"{1000 * theirs['p50_s']:.0f} / {1000 * theirs['p99_s']:.0f}",
                     f"{1000 * ours['p50_s']:.0f} / {1000 * ours['p99_s']:.0f}"])
    for name in SERVERS:
        axes[0][0].plot(list(runs), [summary[c][name]["docs_per_s"] for c in runs], "o-",
                        label=name)
    axes[0][0].set(xscale="log", xlabel="concurrent clients", ylabel="documents / s",
                   title="reranking throughput")
    axes[0][0].legend()
    lines = ["# Reranking: localinfer against llama-server --reranking", "",
             (f"`{args.model.name}`" if args.model else
              "A cross-encoder of ms-marco-MiniLM-L6-v2's shape") + ", random Q8_0 weights; each "
             f"request one query and {args.documents} documents of ~256 tokens, top_n 5; "
             f"{args.requests} request(s) per client; both servers with {SLOTS} slots of "
             f"{CTX} tokens; medians of {args.reps} alternating rounds (the ratio's range in "
             "brackets). Latency is one request's, at the client.", "",
             *harness.markdown_table(
                 ["clients", "llama-server docs/s", "localinfer docs/s",
                  "localinfer ÷ llama-server", "llama-server p50 / p99 ms",
                  "localinfer p50 / p99 ms"], rows)]
    meta = harness.run_facts(reps=args.reps, documents=args.documents, requests=args.requests,
                             slots=SLOTS, ctx=CTX, llama_server=str(args.llama_server),
                             model=args.model.name if args.model else MODEL)
    harness.write(args.out, meta, summary, lines, fig, args.results)


if __name__ == "__main__":
    main()
