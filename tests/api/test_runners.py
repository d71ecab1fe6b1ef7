"""Each model in a runner process: a runner that dies (SIGKILL, llama.cpp's own abort, a hang)
costs its own requests a clean error, never the server or another model's streams."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import ollama
import openai
import psutil
import pytest

from .conftest import NO_END, start_server, stop_server

QUESTION = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
LONG = 400  # tokens: a stream still runs when the runner is killed


@pytest.fixture(scope="module")
def fault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fault") / "fault"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, fault: Path, _session_store: Path):
    home = tmp_path_factory.mktemp("runners-home")
    srv = start_server(home, "--model", "smollm2:135m", "--parallel", "4", "--ctx", "1024",
                       env={"LOCALINFER_RUNNER_FAULT": str(fault),
                            "LOCALINFER_RUNNER_TIMEOUT": "3"})
    yield srv
    stop_server(srv)


def inject(fault: Path, what: str) -> None:
    """Whole or absent: a runner polls the file every pass, and one that read it empty (made,
    not yet written) let its streams run to the end."""
    part = fault.with_suffix(".part")
    part.write_text(what)
    part.replace(fault)


def runners(server) -> list[psutil.Process]:
    children = psutil.Process(server.process.pid).children()
    return [p for p in children if "localinfer.backends.runner.child" in " ".join(p.cmdline())]


def runner_of(server, name: str) -> psutil.Process:
    """The runner whose process maps this model's file."""
    for process in runners(server):
        if any(name in m.path for m in process.memory_maps()):
            return process
    raise AssertionError(f"no runner maps {name}")


class Streams:
    """Streams run in threads; each records its chunks and how it ended."""

    def __init__(self) -> None:
        self.chunks: dict[str, int] = {}
        self.ended: dict[str, str] = {}
        self.threads: list[threading.Thread] = []

    def start(self, name: str, run) -> None:
        def body() -> None:
            self.chunks[name] = 0
            try:
                for _ in run():
                    self.chunks[name] += 1
                self.ended[name] = "done"
            except Exception as exc:  # noqa: BLE001 - the test reads it
                self.ended[name] = f"{type(exc).__name__}: {exc}"
        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        self.threads.append(thread)

    def wait_for_chunks(self, names: list[str], n: int = 3, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while any(self.chunks.get(k, 0) < n for k in names):
            assert time.monotonic() < deadline, f"streams did not start: {self.chunks}"
            time.sleep(0.02)

    def join(self, timeout: float = 60) -> None:
        for thread in self.threads:
            thread.join(timeout)
            assert not thread.is_alive(), f"a stream hangs: {self.chunks} {self.ended}"


def openai_stream(server, model: str = "smollm2:135m"):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    return lambda: client.chat.completions.create(
        model=model, messages=QUESTION, stream=True, max_tokens=LONG,
        logit_bias=NO_END if model.startswith("smollm2") else None)


def ollama_stream(server, model: str = "smollm2:135m"):
    # Ollama has no logit_bias: greedy, whose reply to QUESTION runs past LONG tokens
    client = ollama.Client(host=server.url)
    return lambda: client.chat(model=model, messages=QUESTION, stream=True,
                               options={"num_predict": LONG, "temperature": 0,
                                        "repeat_penalty": 1.0})


def openai_whole(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    return lambda: [client.chat.completions.create(
        model="smollm2:135m", messages=QUESTION, max_tokens=LONG, logit_bias=NO_END)]


def serves_again(server) -> None:
    reply = server.post("/v1/chat/completions", json={
        "model": "smollm2:135m", "max_tokens": 4, "messages": QUESTION})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"]
    assert server.get("/health").status_code == 200


def test_a_killed_runner_ends_its_streams_and_not_the_other_models(server):
    # gemma3 loads in a runner of its own beside smollm2's
    assert server.post("/api/generate", json={"model": "gemma3:270m"}).status_code == 200
    smollm2 = runner_of(server, "SmolLM2")
    assert runner_of(server, "gemma-3").pid != smollm2.pid
    streams = Streams()
    streams.start("openai", openai_stream(server))
    streams.start("ollama", ollama_stream(server))
    streams.start("whole", openai_whole(server))
    streams.start("gemma3", ollama_stream(server, "gemma3:270m"))
    streams.wait_for_chunks(["openai", "ollama", "gemma3"])
    time.sleep(0.2)  # the non-streamed request is under way too
    smollm2.send_signal(signal.SIGKILL)
    streams.join()
    assert streams.ended["gemma3"] == "done", streams.ended  # the other model streamed on
    for name in ("openai", "ollama", "whole"):
        assert "SIGKILL" in streams.ended[name], streams.ended
    assert "InternalServerError" in streams.ended["whole"] and "503" in streams.ended["whole"]
    log = server.log.read_text()
    assert "the runner of smollm2:135m ended (killed by SIGKILL)" in log
    assert "Traceback" not in log
    serves_again(server)
    assert runner_of(server, "SmolLM2").pid != smollm2.pid  # started anew


def test_an_abort_inside_llama_cpp_costs_only_its_runner(server, fault):
    streams = Streams()
    streams.start("openai", openai_stream(server))
    streams.start("ollama", ollama_stream(server))
    streams.wait_for_chunks(["openai", "ollama"])
    inject(fault, "abort")  # the runner calls ggml_abort, as a failed GGML_ASSERT does
    streams.join()
    for name in ("openai", "ollama"):
        assert "SIGABRT" in streams.ended[name], streams.ended
    assert "fault injected by a test" in server.log.read_text()  # llama.cpp's own message
    serves_again(server)


def test_a_runner_that_makes_no_progress_is_stopped(server, fault):
    streams = Streams()
    streams.start("openai", openai_stream(server))
    streams.wait_for_chunks(["openai"])
    began = time.monotonic()
    inject(fault, "hang")  # the engine stops inside a pass; LOCALINFER_RUNNER_TIMEOUT=3
    streams.join()
    assert "made no progress for 3 s" in streams.ended["openai"], streams.ended
    assert 2.5 < time.monotonic() - began < 15
    serves_again(server)


def test_no_runner_outlives_a_killed_server(tmp_path, _session_store):
    srv = start_server(tmp_path, "--model", "smollm2:135m", "--ctx", "512")
    try:
        (runner,) = runners(srv)
        srv.process.send_signal(signal.SIGKILL)
        srv.process.wait(10)
        runner.wait(10)  # it reads end-of-file on its pipe and exits
        assert not runner.is_running()
    finally:
        if srv.process.poll() is None:
            stop_server(srv)
