"""Concurrent streaming chat clients against any OpenAI-compatible server, measured outside it.

N client threads (bench/clients.py) each send requests one after another to
/v1/chat/completions (streaming, greedy unless --temperature says, a fixed max_tokens);
optionally every prompt starts with the same long prefix (a shared system prompt), which a
server that reuses cached prefixes reads once. Reported per level: output tok/s over wall
time (the tokens each stream's usage counts), TTFT p50/p99, empty replies and errors.
Used to compare `localinfer serve` with llama.cpp's own server on the same model and GPU.

    python3 bench/serve_load.py --url http://127.0.0.1:11435 --model NAME --levels 8,32

`--client raw` streams over plain asyncio sockets and finds content chunks in the bytes,
no JSON parsed: ~3x less CPU per token than the httpx client, so a fast server on a small
machine is not measured against its own client.
"""

from __future__ import annotations

import json

import harness
import httpx
from clients import level, one


def main() -> None:
    parser = harness.arguments(__doc__, writes=False)
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
    parser.add_argument("--client", choices=("httpx", "raw"), default="httpx",
                        help="raw: bare sockets, no JSON parsing (for fast servers)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy; above, llama.cpp's sampler chain in either server")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", help="append the results as JSON lines here")
    args = parser.parse_args()
    one(httpx.Client(timeout=600), args.url, args.model, "", "warm-up", {"max_tokens": 4})
    for n in (int(x) for x in args.levels.split(",")):
        row = {"label": args.label, "processes": args.processes, "client": args.client,
               **level(args.url, args.model, n, args.requests_per_client, args.max_tokens,
                       args.prefix_words, args.processes, args.client,
                       args.temperature)}
        print(f"{args.label:24s} clients={n:3d} prefix={args.prefix_words:4d}w: "
              f"{row['output_tps']:8.1f} tok/s  TTFT p50 {row['ttft_p50_s'] or 0:.3f} s "
              f"p99 {row['ttft_p99_s'] or 0:.3f} s  empty {row['empty']} errors {row['errors']}",
              flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
