"""RPC workers as real processes on loopback: `localinfer worker` serving its CPU through
llama.cpp's RPC backend, a head splitting smollm2 across two of them, and every way a worker
can fail a head — not running, busy, the wrong key, killed mid-stream — as one clear line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import ollama
import pytest

from localinfer.backends.rpc.workers import WorkerUnusable, parse_endpoint, probe

from .api.conftest import free_port, start_server, stop_server

LOCALINFER = [sys.executable, "-m", "localinfer"]
PROMPT = "The capital of France is"


@dataclass
class Worker:
    endpoint: str
    process: subprocess.Popen
    lines: list[str]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def start_worker(*args: str, key: str | None = None) -> Worker:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "LOCALINFER_WORKER_KEY"}
    if key:
        env["LOCALINFER_WORKER_KEY"] = key
    process = subprocess.Popen([*LOCALINFER, "worker", "--port", str(port), "--threads", "1",
                                *args], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("on the head:"):
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    # (the first worker of a machine builds the RPC backend: a download from pip's cache and
    # a compile of two files)
    if not ready.wait(300) or process.poll() is not None:
        process.kill()
        raise RuntimeError("worker did not start:\n" + "".join(lines))
    return Worker(f"127.0.0.1:{port}", process, lines)


@pytest.fixture(scope="module")
def two_workers() -> Iterator[tuple[Worker, Worker]]:
    first = start_worker()
    second = start_worker()
    yield first, second
    first.stop()
    second.stop()


def _run(*args: str, key: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LOCALINFER_WORKER_KEY"}
    if key:
        env["LOCALINFER_WORKER_KEY"] = key
    return subprocess.run([*LOCALINFER, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _one_line_error(result: subprocess.CompletedProcess, *words: str) -> str:
    assert result.returncode == 1, result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_a_model_split_over_two_workers_answers_as_it_does_here(two_workers, smollm2,
                                                                  smollm2_reference):
    endpoints = ",".join(w.endpoint for w in two_workers)
    shown = _run("show", "--workers", endpoints, "--json")
    assert shown.returncode == 0, shown.stderr
    plan = json.loads(shown.stdout)["plan"]
    on = {p["device"]: p["layers"] for p in plan["placement"]}
    # the head's RAM and each worker take a share of smollm2's 31 layers (30 and the output)
    assert set(on) == {f"worker {w.endpoint}/CPU" for w in two_workers} | {"RAM"}, on
    assert all(n > 0 for n in on.values()) and sum(on.values()) == 31, on
    # (the output layer, which llama.cpp would put on the last worker, stays here)
    assert plan["n_gpu_layers"] == 31 - on["RAM"] + 1 and len(plan["tensor_split"]) == 2

    args = ("run", "--temperature", "0", "--max-tokens", "24", "--ctx", "256", "-p", PROMPT)
    split = _run(*args, "--workers", endpoints)
    assert split.returncode == 0, split.stderr
    # the greedy reply, up to near-ties (a worker's CPU runs without the repacked weights
    # some CPUs give a local model: its floats may differ where two tokens are nearly tied)
    prompt = smollm2.tokenize(smollm2.apply_chat_template([{"role": "user",
                                                            "content": PROMPT}]))
    reply = split.stdout.removesuffix("\n")
    assert reply.strip() and smollm2_reference.follows(prompt, reply) > 10, reply
    for worker in two_workers:  # each worker did its share
        assert any("Accepted client connection" in line for line in worker.lines)


def test_a_worker_that_is_not_running_is_one_line_naming_it():
    endpoint = f"127.0.0.1:{free_port()}"
    _one_line_error(_run("run", "--workers", endpoint, "-p", "hi"), endpoint, "not answering",
                    "localinfer worker")
    _one_line_error(_run("show", "--workers", "no-port-here:x", "--json"), "host:port")


def test_something_else_on_the_port_is_not_taken_for_a_worker():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never speaks
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        _one_line_error(_run("run", "--workers", endpoint, "-p", "hi"), endpoint,
                        "does not answer as a localinfer worker")
        assert time.monotonic() - started < 30  # a timeout, not a hang


def test_a_worker_with_a_key_refuses_a_head_without_it_or_with_another():
    worker = start_worker(key="right-key-1")
    try:
        _one_line_error(_run("run", "--workers", worker.endpoint, "-p", "hi"), "takes a key",
                        "LOCALINFER_WORKER_KEY")
        _one_line_error(_run("run", "--workers", worker.endpoint, "-p", "hi", key="wrong-key-2"),
                        "key is wrong")
        with pytest.raises(WorkerUnusable, match="key is wrong"):
            probe(worker.endpoint, "wrong-key-2")
        answered = _run("run", "--workers", worker.endpoint, "--max-tokens", "4", "--ctx", "256",
                        "-p", "hi", key="right-key-1")
        assert answered.returncode == 0 and answered.stdout.strip(), answered.stderr
    finally:
        worker.stop()


def test_a_worker_beyond_loopback_needs_a_key():
    _one_line_error(_run("worker", "--host", "0.0.0.0", "--port", str(free_port())),
                    "takes a key", "LOCALINFER_WORKER_KEY")


def test_garbage_at_a_worker_is_dropped_and_it_keeps_serving():
    worker = start_worker()
    try:
        host, port = parse_endpoint(worker.endpoint)
        for junk in (b"\x0e" + b"\x00" * 64, b"x" * 200_000, b"{\"want\": 3}\n", b"[1]\n"):
            with socket.create_connection((host, port), timeout=5) as sock:
                sock.recv(4096)  # the greeting
                try:
                    sock.sendall(junk)
                    sock.recv(4096)
                except OSError:
                    pass  # closed on us: as it should be
        info = probe(worker.endpoint)
        assert info.devices and info.devices[0].kind == "cpu" and info.busy is None
        assert info.devices[0].free_bytes <= info.devices[0].total_bytes
    finally:
        worker.stop()


@pytest.mark.slow
def test_a_busy_worker_and_a_worker_lost_mid_stream_cost_one_model_not_the_server(tmp_path):
    worker = start_worker()
    server = start_server(tmp_path / "home", "--workers", worker.endpoint, "--ctx", "512",
                          "--parallel", "1")
    try:
        client = ollama.Client(host=server.url)
        first = client.generate(model="smollm2:135m", prompt="Hi", options={"num_predict": 3})
        assert first.response
        # a second model of the same server: planned without the worker its first model
        # holds, loaded beside it (not refused as busy, nothing evicted)
        second = client.generate(model="gemma3:270m", prompt="Hi", options={"num_predict": 3})
        assert second.response
        assert {m.model for m in client.ps().models} == {"smollm2:135m", "gemma3:270m"}
        # the worker serves this server's model: another head is turned away, by name
        _one_line_error(_run("run", "--workers", worker.endpoint, "-p", "hi"), "busy")
        assert probe(worker.endpoint).busy

        stream = client.generate(model="smollm2:135m", prompt="Write a long story.",
                                 stream=True, options={"num_predict": 4000})
        next(stream)
        worker.stop()  # mid-stream
        with pytest.raises(ollama.ResponseError, match="runner"):
            for _ in stream:
                pass
        # the server lives, and says what is missing
        assert server.get("/api/tags").status_code == 200
        with pytest.raises(ollama.ResponseError, match=worker.endpoint):
            client.generate(model="smollm2:135m", prompt="Hi", options={"num_predict": 3})
    finally:
        stop_server(server)
        worker.stop()


def test_hw_says_whether_this_machine_can_serve_and_use_workers(two_workers, monkeypatch):
    shown = _run("hw", "--json")
    rpc = json.loads(shown.stdout)["rpc"]
    assert rpc["built"] and rpc["protocol"] == probe(two_workers[0].endpoint).protocol
    assert "RPC workers: yes" in _run("hw").stdout

    from localinfer.backends.rpc import library as backend

    monkeypatch.setattr(backend, "built", lambda: None)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "needs a C++ compiler" in backend.status()["summary"]
    with pytest.raises(backend.RpcUnavailable, match="C\\+\\+ compiler"):
        backend._compile(backend._folder(), backend._folder() / "x.so")


def test_workers_and_their_key_are_settings(monkeypatch):
    from localinfer.settings import Settings, SettingsError

    monkeypatch.setenv("LOCALINFER_WORKERS", "10.0.0.5:50052, 10.0.0.6:50052")
    assert Settings.read().workers == ["10.0.0.5:50052", "10.0.0.6:50052"]
    assert Settings.read({"workers": "a:1"}).workers == ["a:1"]  # the flag wins
    monkeypatch.setenv("LOCALINFER_WORKER_KEY", "short")
    with pytest.raises(SettingsError, match="LOCALINFER_WORKER_KEY"):
        Settings.read()
    assert parse_endpoint("[::1]:7000") == ("::1", 7000)
    assert parse_endpoint("gpu-box") == ("gpu-box", 50052)


def test_a_packaged_app_finds_the_rpc_backend_it_carries(tmp_path, monkeypatch):
    from localinfer.backends.rpc import library as backend

    carried = tmp_path / "localinfer_rpc"
    carried.mkdir()
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    monkeypatch.setattr(backend, "_folder", lambda: tmp_path / "cache-empty")
    assert backend.built() is None  # nothing carried, nothing built
    (carried / backend._LIB).write_bytes(b"\x7fELF")
    (carried / "build.json").write_text("[]")  # damaged: as if none
    assert backend.built() is None
    (carried / backend._LIB).write_bytes(b"\x7fELF")
    (carried / "build.json").write_text(json.dumps({"protocol": "7.0.0"}))
    found = backend.built()
    assert found is not None and found.library == carried / backend._LIB
    assert found.protocol == "7.0.0"
