"""A real `localinfer serve` process on a free loopback port, started once per session."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

# smollm2's end-of-generation tokens as a logit bias: a reply runs to its limit, on any CPU
NO_END = {"0": -100, "2": -100, "4": -100}


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log: Path

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, timeout=60, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(home: Path, *args: str, ready_timeout: float = 60,
                 env: dict[str, str] | None = None) -> Server:
    port = free_port()
    log = home / f"serve-{port}.log"
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LOCALINFER_HOME": str(home), **(env or {})}
    env.pop("LOCALINFER_API_KEY", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "localinfer", "serve", "--port", str(port), *args],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    server = Server(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    stop_server(server)
    raise RuntimeError(f"server not ready in {ready_timeout} s:\n{log.read_text()}")


def stop_server(server: Server) -> None:
    """Stop the server, and wait for its runners too: they end once they read that their
    parent has gone, and until then hold its files (its log) open."""
    try:
        runners = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.Error:
        runners = []
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
    _, left = psutil.wait_procs(runners, timeout=15)
    for runner in left:
        runner.kill()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, _session_store: Path) -> Iterator[Server]:
    """smollm2 preloaded, 4 slots of 512 tokens: shared by all API tests of the session."""
    home = tmp_path_factory.mktemp("serve-home")
    srv = start_server(home, "--model", "smollm2:135m", "--parallel", "4", "--ctx", "512")
    yield srv
    stop_server(srv)
    assert srv.process.returncode in (0, -15), srv.log.read_text()
