"""Drive a server with concurrent streaming clients: N clients each send chat completions
one after another to any OpenAI-compatible server and time them from outside it.

Two clients: httpx (a JSON parse a chunk) and `raw`, plain asyncio sockets that find the
content chunks in the bytes, no JSON parsed (~3x less CPU per token, so a fast server on a
small machine is not measured against its own client). Both time the first content chunk
(TTFT) and count the reply's tokens from the usage the stream ends with (`USAGE`).
bench/serve_load.py is their command line; `level_in_subprocess` runs it in a process of
its own, apart from the caller's CPU.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil

SERVE_LOAD = Path(__file__).resolve().parent / "serve_load.py"
# a streamed chat ends with its usage: the reply's tokens counted by the server. Content
# chunks are not tokens where a token is part of a character (a random-weight model's byte
# tokens: a Llama-3.2-1B shape streamed 27 chunks for 64 tokens, from either server)
USAGE = {"stream_options": {"include_usage": True}}

_WORDS = ("harbour lantern keeper tide rope gull stone window evening storm ledger candle "
          "island signal ferry").split()


def prefix_text(n_words: int) -> str:
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(n_words))


_CHAT_WORDS = ("the ledger shows a harbour storm where ferries wait by the island signal while "
               "keepers light lanterns and count rope tides gulls and stones at evening").split()


def chat_text(seed: int, words: int) -> str:
    """Words of a chat turn, in an order of `seed`'s own."""
    return " ".join(_CHAT_WORDS[(seed * 7 + i * 3) % len(_CHAT_WORDS)] for i in range(words))


def shuffled_prompt(seed: int, words: int) -> str:
    """Words in a random order of their own, a token each with smollm2's tokenizer: no run of
    one prompt repeats in another (a server that reuses moved chunks of its cache, as
    localinfer does, finds nothing)."""
    rng = random.Random(seed)
    return f"Note {seed}: " + " ".join(rng.choice(_WORDS) for _ in range(words))


def stream_times(url: str, model: str, prompt: str, max_tokens: int,
                 times: list[float], **more: object) -> float:
    """Stream a greedy completion, appending each token's arrival to `times`; the send time.
    `more`: more fields of the request (a logit_bias, say)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "temperature": 0, **more}
    start = time.perf_counter()
    with httpx.Client(timeout=600) as client, client.stream(
            "POST", url + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise SystemExit(f"{url}: HTTP {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                times.append(time.perf_counter())
    return start


def chat_turn(client: httpx.Client, url: str, model: str, messages: list[dict],
              thinking: bool, tokens: int) -> dict:
    """One streamed chat turn (greedy, `tokens` at most, the template's thinking switch):
    its TTFT at the client, the reply's text, the cached and prompt tokens the server
    reported (OpenAI's usage, or llama-server's timings)."""
    body = {"model": model, "messages": messages, "stream": True, "temperature": 0,
            "max_tokens": tokens, "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": thinking}}
    start = time.perf_counter()
    first, content, cached, prompt = None, [], None, None
    with client.stream("POST", url + "/v1/chat/completions", json=body,
                       headers={"Connection": "close"}) as response:  # one per turn
        if response.status_code != 200:
            raise SystemExit(f"{url}: HTTP {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    first = first or time.perf_counter()
                content.append(delta.get("content") or "")
            usage = event.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            if "cached_tokens" in details:
                cached = details["cached_tokens"]
            elif "cache_n" in (event.get("timings") or {}):
                cached = event["timings"]["cache_n"]
            prompt = usage.get("prompt_tokens")
    end = time.perf_counter()
    return {"ttft_s": (first or end) - start, "reply": "".join(content), "cached": cached,
            "prompt_tokens": prompt}


def growing_chat(url: str, model: str, seed: int, thinking: bool, tokens: int,
                 turns: int = 6) -> dict:
    """A chat of `turns` turns (a 300-word system prompt, ~90-word questions, each reply sent
    back as the client got it), then its last prompt once more with a new first word, which
    nothing cached matches (the full re-read): each turn's chat_turn and the re-read's."""
    messages = [{"role": "system", "content": f"Session {seed}. " + chat_text(seed, 300)}]
    done = []
    with httpx.Client(timeout=900) as client:
        for turn in range(turns):
            messages.append({"role": "user", "content": f"Question {turn}: " +
                             chat_text(seed + turn, 90)})
            result = chat_turn(client, url, model, messages, thinking, tokens)
            done.append(result)
            messages.append({"role": "assistant", "content": result["reply"]})
        last = messages[:-1]
        fresh = [{"role": "system", "content": f"Fresh {seed}. " + last[0]["content"]},
                 *last[1:]]
        cold = chat_turn(client, url, model, fresh, thinking, tokens)
    return {"turns": done, "cold": cold}


def one(client: httpx.Client, url: str, model: str, system: str, question: str,
        sampling: dict) -> dict:
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": question}]
    body = {"model": model, "messages": messages, "stream": True, **USAGE, **sampling}
    start = time.perf_counter()
    first, chunks, tokens, error = None, 0, None, None
    try:
        with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                return {"ttft": None, "chunks": 0, "tokens": 0,
                        "error": f"HTTP {response.status_code}"}
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                for choice in event.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        first = first or time.perf_counter()
                        chunks += 1
                tokens = (event.get("usage") or {}).get("completion_tokens", tokens)
    except httpx.HTTPError as exc:  # a cut-off stream is a result here, not a crash
        error = type(exc).__name__
    return {"ttft": None if first is None else first - start, "chunks": chunks,
            "tokens": chunks if tokens is None else tokens, "error": error}


# a delta that carries text: `"content":"x` or `"role": "assistant", "content": "x` (a space
# after each comma, as Python's json writes it), not `"content":""`, null or
# "reasoning_content"
_CONTENT = re.compile(rb'[{,]\s*"content":\s*"(?!")')
# the reply's length in tokens, in the usage that ends a stream
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')


async def _raw_one(host: str, port: int, model: str, system: str, question: str,
                   sampling: dict) -> dict:
    """One streamed chat over a bare socket: HTTP/1.1, chunked or not, SSE events counted."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": question}]
    body = json.dumps({"model": model, "messages": messages, "stream": True, **USAGE,
                       **sampling}).encode()
    start = time.perf_counter()
    first, chunks, tokens = None, 0, None
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        return {"ttft": None, "chunks": 0, "tokens": 0, "error": type(exc).__name__}
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % (host.encode(), port, len(body)) + body)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")):
            return {"ttft": None, "chunks": 0, "tokens": 0,
                    "error": head.split(b"\r\n")[0].decode()}
        chunked = b"transfer-encoding: chunked" in head.lower()
        pending = b""
        while True:
            if chunked:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    break
                data = (await reader.readexactly(size + 2))[:-2]
            else:
                data = await reader.read(65536)
                if not data:
                    break
            *events, pending = (pending + data).split(b"\n\n")
            for event in events:
                if _CONTENT.search(event):
                    first = first or time.perf_counter()
                    chunks += 1
                elif (used := _COMPLETION_TOKENS.search(event)) is not None:
                    tokens = int(used[1])
            if b"data: [DONE]" in data:
                break
        error = None
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        error = type(exc).__name__
    finally:
        writer.close()
    return {"ttft": None if first is None else first - start, "chunks": chunks,
            "tokens": chunks if tokens is None else tokens, "error": error}


def _raw_clients(url: str, model: str, system: str, ids: list[int], per_client: int,
                 sampling: dict) -> list[dict]:
    """Some of the clients, one coroutine each, on one event loop in this process."""
    host, port = url.split("://", 1)[-1].rstrip("/").rsplit(":", 1)

    async def client(i: int) -> list[dict]:
        return [await _raw_one(host, int(port), model, system,
                               f"Question {i}-{j}: tell me a story.", sampling)
                for j in range(per_client)]

    async def every() -> list[list[dict]]:
        return await asyncio.gather(*(client(i) for i in ids))

    return [r for rs in asyncio.run(every()) for r in rs]


def _client_requests(url: str, model: str, system: str, i: int, per_client: int,
                     sampling: dict) -> list[dict]:
    with httpx.Client(timeout=600) as client:
        return [one(client, url, model, system, f"Question {i}-{j}: tell me a story.",
                    sampling) for j in range(per_client)]


def _clients(url: str, model: str, system: str, ids: list[int], per_client: int,
             sampling: dict) -> list[dict]:
    """Some of the clients, one thread each, in this process."""
    with ThreadPoolExecutor(len(ids)) as pool:
        return [r for rs in pool.map(lambda i: _client_requests(url, model, system, i,
                                                                per_client, sampling), ids)
                for r in rs]


def level(url: str, model: str, clients: int, per_client: int, max_tokens: int,
          prefix_words: int, processes: int = 1, client: str = "httpx",
          temperature: float = 0.0, system: str | None = None) -> dict:
    """`processes` > 1 spreads the client threads over that many processes: one Python
    process parses SSE for at most ~1500 tokens a second (bench/stream_cost.py), which a
    fast server outruns. `system`: every request's system prompt, in place of
    `prefix_words` words."""
    if system is None:
        system = prefix_text(prefix_words) if prefix_words else ""
    sampling = {"max_tokens": max_tokens, "temperature": temperature}
    groups = [list(range(clients))[p::processes] for p in range(processes)]
    run = _raw_clients if client == "raw" else _clients
    began = time.perf_counter()
    if processes == 1:
        results = run(url, model, system, groups[0], per_client, sampling)
    else:
        with ProcessPoolExecutor(processes) as pool:
            parts = pool.map(run, *zip(*[(url, model, system, g, per_client, sampling)
                                              for g in groups if g]))
            results = [r for part in parts for r in part]
    wall = time.perf_counter() - began
    ttfts = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    return {"clients": clients, "requests": len(results), "prefix_words": prefix_words,
            "temperature": temperature,
            "wall_s": wall, "output_tokens": sum(r["tokens"] for r in results),
            "output_tps": sum(r["tokens"] for r in results) / wall,
            "content_chunks": sum(r["chunks"] for r in results),
            "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
            "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None,
            "empty": sum(1 for r in results if not r["chunks"]),
            "errors": sum(1 for r in results if r["error"])}


def level_in_subprocess(url: str, model: str, clients: int, requests: int, tokens: int,
                        client: str = "raw") -> dict:
    """One level of bench/serve_load.py in a process of its own (the caller counts its CPU
    among its children's): its row. A load with errors or empty replies ends the run."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as out:
        subprocess.run(
            [sys.executable, str(SERVE_LOAD), "--url", url, "--model", model, "--levels",
             str(clients), "--requests-per-client", str(requests), "--max-tokens", str(tokens),
             "--client", client, "--out", out.name],
            check=True, capture_output=True)
        row = json.loads(Path(out.name).read_text().splitlines()[-1])
    if row["errors"] or row["empty"]:
        raise SystemExit(f"the load had errors or empty replies: {row}")
    return row


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def level_with_cpu(url: str, server: subprocess.Popen, model: str, clients: int, tokens: int,
                   requests: int) -> dict:
    """`level_in_subprocess` (the raw-socket client) against `localinfer serve` started as
    `server`, with the CPU it cost per streamed token: the server process (the parent) and
    its runners."""
    parent = psutil.Process(server.pid)
    runners = parent.children()
    before = cpu_seconds(parent), sum(cpu_seconds(r) for r in runners)
    row = level_in_subprocess(url, model, clients, requests, tokens, "raw")
    after = cpu_seconds(parent), sum(cpu_seconds(r) for r in runners)
    n = row["output_tokens"]
    return {"clients": clients, "tokens": n, "output_tps": row["output_tps"],
            "ttft_p50_s": row["ttft_p50_s"], "ttft_p99_s": row["ttft_p99_s"],
            "parent_us_per_token": 1e6 * (after[0] - before[0]) / n,
            "runner_us_per_token": 1e6 * (after[1] - before[1]) / n}
