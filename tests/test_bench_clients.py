"""bench/clients.py's raw-socket client against a real HTTP server on loopback: the first token
counts where it comes (TTFT), whether the server writes it with the role in one delta and
spaces after the commas (Python's json) or compactly after a delta of its own (llama-server)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def clients():
    sys.path.insert(0, str(_BENCH))  # (clients.py imports its neighbours by name)
    try:
        spec = importlib.util.spec_from_file_location("bench_clients", _BENCH / "clients.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(_BENCH))


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


SPACED = [  # localinfer: Python's json.dumps, the role with the first text
    {"choices": [{"delta": {"role": "assistant", "content": "Once"}}]},
    {"choices": [{"delta": {"content": " upon"}}]},
    {"choices": [{"delta": {}, "finish_reason": "length"}]},
]
COMPACT = [  # llama-server: the role in a delta of its own, then compact JSON
    {"choices": [{"delta": {"role": "assistant", "content": None}}]},
    {"choices": [{"delta": {"content": "Once"}}]},
    {"choices": [{"delta": {"content": " upon"}}]},
]


@pytest.mark.parametrize("events,separators", [(SPACED, None), (COMPACT, (",", ":"))])
def test_the_first_token_is_timed_where_it_arrives(clients, events, separators):
    async def run() -> dict:
        async def serve(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            for i, event in enumerate(events):
                body = json.dumps(event, separators=separators).encode()
                writer.write(_chunk(b"data: " + body + b"\n\n"))
                await writer.drain()
                if i == 0:
                    await asyncio.sleep(0.3)  # the next token comes a step later
            writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await clients._raw_one("127.0.0.1", port, "m", "", "Hi", {})

    result = asyncio.run(run())
    assert result["error"] is None and result["chunks"] == 2
    first_text_late = events is COMPACT  # (its first event carries no text)
    assert (result["ttft"] >= 0.3) == first_text_late, result


USAGE_END = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5,
                                      "total_tokens": 14}}


@pytest.mark.parametrize("usage", [True, False])
def test_a_reply_counts_the_tokens_its_usage_says_not_its_chunks(clients, usage):
    """Five tokens streamed as two chunks (byte tokens held back until their character is
    whole) are five tokens; a server that sends no usage has its chunks counted. Both
    clients ask for the usage."""
    bodies = []
    events = [*SPACED, *([USAGE_END] if usage else [])]

    async def serve(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        bodies.append(json.loads(await reader.readexactly(length)))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        for event in events:
            writer.write(_chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
        writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def run() -> list[dict]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            raw = await clients._raw_one("127.0.0.1", port, "m", "", "Hi", {})
            with clients.httpx.Client(timeout=10) as http:
                parsed = await asyncio.to_thread(clients.one, http, f"http://127.0.0.1:{port}",
                                                 "m", "", "Hi", {})
        return [raw, parsed]

    for result in asyncio.run(run()):
        assert result["error"] is None and result["chunks"] == 2, result
        assert result["tokens"] == (5 if usage else 2), result
    assert [b.get("stream_options") for b in bodies] == [{"include_usage": True}] * 2
