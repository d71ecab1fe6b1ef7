"""Concurrent streaming chat clients against any OpenAI-compatible server, measured outside it.

N client threads each send requests one after another to /v1/chat/completions (streaming,
greedy, a fixed max_tokens); optionally every prompt starts with the same long prefix (a
shared system prompt), which a server that reuses cached prefixes reads once. Reported per
level: output tok/s over wall time (content chunks), TTFT p50/p99, empty replies and errors.
Used to compare `localinfer serve` with llama.cpp's own server on the same model and GPU.

    python3 bench/serve_load.py --url http://127.0.0.1:11435 --model NAME --levels 8,32
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import httpx

_WORDS = ("harbour lantern keeper tide rope gull stone window evening storm ledger candle "
          "island signal ferry").split()


def prefix_text(n_words: int) -> str:
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(n_words))


def one(client: httpx.Client, url: str, model: str, system: str, question: str,
        max_tokens: int) -> dict:
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": question}]
    body = {"model": model, "messages": messages, "stream": True, "temperature": 0,
            "max_tokens": max_tokens}
    start = time.perf_counter()
    first, chunks, error = None, 0, None
    try:
        with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                return {"ttft": None, "chunks": 0, "error": f"HTTP {response.status_code}"}
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices", []):
                    if (choice.get("delta") or {}).get("content"):
                        first = first or time.perf_counter()
                        chunks += 1
    except httpx.HTTPError as exc:  # a cut-off stream is a result here, not a crash
        error = type(exc).__name__
    return {"ttft": None if first is None else first - start, "chunks": chunks, "error": error}


def _client_requests(url: str, model: str, system: str, i: int, per_client: int,
                     max_tokens: int) -> list[dict]:
    with httpx.Client(timeout=600) as client:
        return [one(client, url, model, system, f"Question {i}-{j}: tell me a story.",
                    max_tokens) for j in range(per_client)]


def _clients(url: str, model: str, system: str, ids: list[int], per_client: int,
             max_tokens: int) -> list[dict]:
    """Some of the clients, one thread each, in this process."""
    with ThreadPoolExecutor(len(ids)) as pool:
        return [r for rs in pool.map(lambda i: _client_requests(url, model, system, i,
                                                                per_client, max_tokens), ids)
                for r in rs]


def level(url: str, model: str, clients: int, per_client: int, max_tokens: int,
          prefix_words: int, processes: int = 1) -> dict:
    """`processes` > 1 spreads the client threads over that many processes: one Python
    process parses SSE for at most ~1500 tokens a second (bench/stream_cost.py), which a
    fast server outruns."""
    system = prefix_text(prefix_words) if prefix_words else ""
    groups = [list(range(clients))[p::processes] for p in range(processes)]
    began = time.perf_counter()
    if processes == 1:
        results = _clients(url, model, system, groups[0], per_client, max_tokens)
    else:
        with ProcessPoolExecutor(processes) as pool:
            parts = pool.map(_clients, *zip(*[(url, model, system, g, per_client, max_tokens)
                                              for g in groups if g]))
            results = [r for part in parts for r in part]
    wall = time.perf_counter() - began
    ttfts = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    return {"clients": clients, "requests": len(results), "prefix_words": prefix_words,
            "wall_s": wall, "output_tokens": sum(r["chunks"] for r in results),
            "output_tps": sum(r["chunks"] for r in results) / wall,
            "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
            "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None,
            "empty": sum(1 for r in results if not r["chunks"]),
            "errors": sum(1 for r in results if r["error"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prefix-words", type=int, default=0,
                        help="a shared system prompt of this many words before each question")
    parser.add_argument("--processes", type=int, default=1,
                        help="spread the clients over this many processes (a fast server "
                             "outruns one Python client process)")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", help="append the results as JSON lines here")
    args = parser.parse_args()
    one(httpx.Client(timeout=600), args.url, args.model, "", "warm-up", 4)
    for n in (int(x) for x in args.levels.split(",")):
        row = {"label": args.label, "processes": args.processes,
               **level(args.url, args.model, n, args.requests_per_client, args.max_tokens,
                       args.prefix_words, args.processes)}
        print(f"{args.label:24s} clients={n:3d} prefix={args.prefix_words:4d}w: "
              f"{row['output_tps']:8.1f} tok/s  TTFT p50 {row['ttft_p50_s'] or 0:.3f} s "
              f"p99 {row['ttft_p99_s'] or 0:.3f} s  empty {row['empty']} errors {row['errors']}",
              flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
