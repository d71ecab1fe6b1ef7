"""`localinfer worker`: this machine's devices, served to a head over llama.cpp's RPC.

ggml's RPC server listens on a loopback port only; the world meets `WorkerFront`, which checks
the key and relays one head at a time (backends/rpc/workers.py). The head plans with what the
front reports (a CPU's available RAM, a GPU's free memory) and loads its model's layers here.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from localinfer.backends.rpc.workers import DEFAULT_PORT, WorkerFront
from localinfer.errors import LocalinferError
from localinfer.settings import binds_loopback

__all__ = ["DEFAULT_PORT", "start_worker"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_listening(port: int, thread: threading.Thread, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise LocalinferError("llama.cpp's RPC server did not start — run with --verbose "
                                  "to see why")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise LocalinferError("llama.cpp's RPC server did not start listening in 30 s")


def start_worker(host: str, port: int, key: str | None, threads: int | None,
                 cache: Path | None, say: Callable[[str], None] = print) -> WorkerFront:
    """Start ggml's RPC server on this machine's GPUs (or its CPU where it has none) and the
    front before it; the front is returned bound, not yet serving (`serve_forever`)."""
    if not binds_loopback(host) and key is None:
        raise LocalinferError(f"a worker listening on {host} takes a key: set "
                              f"LOCALINFER_WORKER_KEY (at least 8 characters) here and on the "
                              f"head")
    from localinfer.backends.rpc import library as rpc
    from localinfer.backends.native.ggml import devices as ggml_devices

    if rpc.built() is None:
        say("building llama.cpp's RPC backend for this llama.cpp (once, a few seconds) …")
    build = rpc.library()
    found = ggml_devices()
    gpus = [i for i, d in enumerate(found) if d.kind in ("gpu", "igpu")]
    chosen = gpus or [i for i, d in enumerate(found) if d.kind == "cpu"][:1]
    if not chosen:
        raise LocalinferError("llama.cpp found no device to serve on this machine")
    n_threads = threads or psutil.cpu_count(logical=False) or 1
    ggml_port = _free_port()
    thread = threading.Thread(target=rpc.serve, daemon=True, name="ggml-rpc",
                              args=(f"127.0.0.1:{ggml_port}", cache, n_threads, chosen))
    thread.start()
    _wait_listening(ggml_port, thread)

    def report() -> list[dict]:
        from localinfer.backends.native.ggml import devices as now

        current = now()
        return [{"name": d.name, "description": d.description, "kind": d.kind,
                 # ggml says a CPU's total as its free memory: what is available is what counts
                 "free_bytes": (psutil.virtual_memory().available if d.kind == "cpu"
                                else d.free_bytes),
                 "total_bytes": d.total_bytes}
                for d in (current[i] for i in chosen)]

    try:
        front = WorkerFront(host, port, ggml_port, key, report, *rpc.identity())
    except OSError as exc:
        raise LocalinferError(f"cannot listen on {host}:{port} ({exc.strerror or exc}) — "
                              f"choose another --port") from None
    where = f"{front.address[0]}:{front.address[1]}"
    served = ", ".join(f"{d['name']} ({d['description']}, {d['free_bytes'] / 2**30:.1f} GiB "
                       f"free)" for d in report())
    say(f"worker at {where} serving {served}; RPC {build.protocol}"
        + (", key required" if key else ""))
    say(f"on the head: localinfer serve --workers {where}")
    if not binds_loopback(host):
        say("the traffic is not encrypted: use a network you trust (or an SSH tunnel / VPN)")
    return front
