"""`localinfer serve` refuses unsafe or impossible setups with one line, before loading anything."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from localinfer.service import usable_cpus

SERVE = [sys.executable, "-m", "localinfer", "serve"]


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVE, *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def _one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for word in words:
        assert word in lines[0]


def test_listening_beyond_loopback_needs_an_api_key(monkeypatch):
    monkeypatch.delenv("LOCALINFER_API_KEY", raising=False)
    _one_line_error(_serve("--host", "0.0.0.0"), "--api-key", "network")
    _one_line_error(_serve("--host", "0.0.0.0", "--api-key", "   "), "blank")  # was accepted


def test_a_busy_port_is_one_clear_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _one_line_error(_serve("--port", str(port)), str(port), "--port")


def test_a_host_that_names_no_address_is_one_line_about_the_host(monkeypatch):
    """Not "set an API key" first, then "pick another --port"."""
    monkeypatch.delenv("LOCALINFER_API_KEY", raising=False)
    _one_line_error(_serve("--host", "garbage!!"), "'garbage!!'", "check --host")
    _one_line_error(_serve("--host", "999.1.1.1"), "check --host")
    _one_line_error(_serve("--host", ""), "--host is empty")
    # an address of another machine: the bind says so, with the key given
    _one_line_error(_serve("--host", "192.0.2.1", "--api-key", "secretsecret"), "check --host")


def test_more_threads_than_cpus_is_refused_at_the_start():
    """Not at each model's load, as a 400 to every client."""
    cpus = usable_cpus()
    _one_line_error(_serve("--threads", str(cpus + 1)), f"use --threads {cpus} or less")
    worker = subprocess.run([sys.executable, "-m", "localinfer", "worker", "--threads",
                             str(cpus + 1)], capture_output=True, text=True, timeout=60)
    _one_line_error(worker, f"use --threads {cpus} or less")


@pytest.mark.parametrize("value", ["soon", "5 minutes"])
def test_a_bad_keep_alive_is_refused(value):
    _one_line_error(_serve("--keep-alive", value), "keep_alive")


def test_an_unknown_startup_model_is_one_clear_line():
    _one_line_error(_serve("--model", "no-such-model"), "not found")


@pytest.mark.slow
def test_a_context_past_what_a_model_was_trained_on_is_capped_for_that_model(tmp_path):
    """A server runs many models: --ctx 99999 gives an 8K-trained one 8,192, as Ollama caps
    it, where it made every request to such a model a 400."""
    from .api.conftest import start_server, stop_server

    server = start_server(tmp_path / "home", "--model", "smollm2:135m", "--ctx", "99999",
                          "--parallel", "1")
    try:
        models = server.get("/api/ps").json()["models"]
        assert [m["context_length"] for m in models] == [8192]
    finally:
        stop_server(server)


def test_a_step_budget_of_one_or_less_is_refused():
    _one_line_error(_serve("--step-budget", "0.5"), "step budget")


@pytest.mark.slow
def test_a_startup_model_given_as_a_path_is_loaded_before_the_first_request(
        tmp_path, smollm2_path):
    from .api.conftest import start_server, stop_server

    server = start_server(tmp_path / "home", "--model", str(smollm2_path), "--parallel", "1",
                          "--ctx", "256")
    try:
        loaded = [m["name"] for m in server.get("/api/ps").json()["models"]]
        assert loaded == [smollm2_path.stem], server.log.read_text()
        reply = server.post("/v1/chat/completions", json={
            "model": smollm2_path.stem, "max_tokens": 2,
            "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200, reply.text
        unload = server.post("/api/generate", json={"model": smollm2_path.stem, "keep_alive": 0})
        assert unload.status_code == 200 and unload.json()["done_reason"] == "unload", unload.text
        assert server.get("/api/ps").json()["models"] == []
    finally:
        stop_server(server)
    log = server.log.read_text()
    assert "Traceback" not in log and "could not load" not in log, log


def test_a_bad_environment_variable_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("LOCALINFER_PORT", "abc")
    _one_line_error(_serve(), "LOCALINFER_PORT", "'abc'", "unset")


@pytest.mark.slow
def test_serve_options_read_their_environment_variables(tmp_path):
    from .api.conftest import start_server, stop_server

    server = start_server(tmp_path / "home", env={
        "LOCALINFER_MODEL": "smollm2:135m", "LOCALINFER_CTX": "256", "LOCALINFER_PARALLEL": "1",
        "LOCALINFER_KV_TYPE": "q8_0",
        "LOCALINFER_ALLOWED_ORIGINS": "https://a.example, https://b.example"})
    try:
        loaded = server.get("/api/ps").json()["models"]
        assert [m["name"] for m in loaded] == ["smollm2:135m"]  # preloaded from the variable
        assert loaded[0]["context_length"] == 256
        for origin, status in (("https://b.example", 200), ("https://c.example", 403)):
            assert server.get("/api/version", headers={"Origin": origin}).status_code == status
    finally:
        stop_server(server)


def test_a_startup_model_that_fails_to_load_is_one_line_in_the_log(tmp_path, smollm2_path):
    """The server serves on (requests retry the load) and says why in one line: a load cut
    short by LOCALINFER_LOAD_TIMEOUT is the user's error to fix, not a traceback."""
    from .api.conftest import start_server, stop_server

    server = start_server(tmp_path / "home", "--model", str(smollm2_path), "--parallel", "1",
                          "--ctx", "256", env={"LOCALINFER_LOAD_TIMEOUT": "0.01"})
    try:
        reply = server.post("/v1/chat/completions", json={
            "model": smollm2_path.stem, "max_tokens": 1,
            "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code >= 500 and "LOCALINFER_LOAD_TIMEOUT" in reply.text, reply.text
    finally:
        stop_server(server)
    log = server.log.read_text()
    lines = [line for line in log.splitlines() if "could not load" in line]
    assert len(lines) == 1 and "LOCALINFER_LOAD_TIMEOUT" in lines[0], log
    assert "Traceback" not in log, log


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stopping_the_server_while_its_model_loads_stops_the_load(tmp_path, smollm2_path, sig):
    """Ctrl-C (or SIGTERM) while the served model loads ends the server at once: the load's
    runner is killed, not waited for (a big model's load takes minutes; it had waited for
    the load to end, here its time limit)."""
    from .api.conftest import free_port

    fault = tmp_path / "fault"
    fault.write_text("hang")  # the runner's load never ends
    port = free_port()
    env = {**os.environ, "LOCALINFER_HOME": str(tmp_path / "home"),
           "LOCALINFER_RUNNER_FAULT": str(fault), "LOCALINFER_LOAD_TIMEOUT": "120"}
    # (Ctrl-C as in a terminal: a process started in the background ignores SIGINT, and
    # uvicorn then ends with 0)
    process = subprocess.Popen([*SERVE, "--model", str(smollm2_path), "--port", str(port),
                                "--ctx", "256", "--parallel", "1"], env=env, text=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while True:  # serving, its model loading
            assert time.monotonic() < deadline and process.poll() is None, process.returncode
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                if health.status_code == 503:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert health.json()["models_loading"] == [smollm2_path.stem], health.text
        while fault.exists():  # the runner removes it as its load begins
            assert time.monotonic() < deadline and process.poll() is None, process.returncode
            time.sleep(0.05)
        runners = psutil.Process(process.pid).children(recursive=True)
        assert runners
        process.send_signal(sig)
        log, _ = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == {signal.SIGINT: 130, signal.SIGTERM: -sig}[sig], log
    assert "Traceback" not in log, log
    _, left = psutil.wait_procs(runners, timeout=5)
    assert not left, [r.cmdline() for r in left]


@pytest.mark.slow
def test_a_request_that_names_no_model_gets_the_served_one(tmp_path):
    from .api.conftest import start_server, stop_server

    server = start_server(tmp_path / "home", "--model", "gemma3:270m", "--parallel", "1",
                          "--ctx", "256")
    try:
        reply = server.post("/v1/chat/completions", json={
            "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200 and reply.json()["model"] == "gemma3:270m", reply.text
        assert [m["name"] for m in server.get("/api/ps").json()["models"]] == ["gemma3:270m"]
    finally:
        stop_server(server)
