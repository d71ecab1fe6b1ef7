"""Many clients at once through the server: same greedy text as alone, slots freed on disconnect."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from .conftest import NO_END, start_server, stop_server

PROMPTS = ["What is the capital of France?", "Name three colours.", "Count to five.",
           "What is 2 + 2?", "Say hello in Spanish.", "What is the largest ocean?",
           "Name a fruit.", "What colour is the sky?"]


def _stream(url: str, prompt: str) -> tuple[str, float, float]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    start, first, pieces = time.monotonic(), None, []
    for chunk in client.chat.completions.create(
            model="smollm2:135m", temperature=0, max_tokens=24, stream=True,
            messages=[{"role": "user", "content": prompt}]):
        for choice in chunk.choices:
            if choice.delta.content:
                first = first or time.monotonic()
                pieces.append(choice.delta.content)
    return "".join(pieces), first - start, time.monotonic() - start


@pytest.mark.slow
def test_eight_concurrent_streams_match_their_solo_replies(server, smollm2, smollm2_reference):
    """Eight streams share the server's four slots: each reply is the greedy reply to its
    own prompt, as the reference decodes it alone (up to near-ties: tests/greedy.py)."""
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: _stream(server.url, p), PROMPTS))
    assert all(text for text, _, _ in together)  # none came back empty
    for question, (text, _, _) in zip(PROMPTS, together):
        prompt = smollm2.tokenize(smollm2.apply_chat_template(
            [{"role": "user", "content": question}]))
        assert smollm2_reference.follows(prompt, text) > 4, question


def _metric(server, name: str) -> float:
    text = server.get("/metrics").text
    match = re.search(rf'^{name}{{model="smollm2:135m"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def test_a_client_that_disconnects_frees_its_slot(server):
    body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 400, "temperature": 0, "stream": True,
            "logit_bias": NO_END}  # it would run all 400 tokens
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()  # next(), not a for/break: leaving the loop would disconnect
        assert json.loads(next(line for line in lines if line.startswith("data: {"))[6:])
        time.sleep(0.2)
        assert _metric(server, "localinfer_slots_active") >= 1
        r.close()
    deadline = time.monotonic() + 5
    while _metric(server, "localinfer_slots_active") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _metric(server, "localinfer_slots_active") == 0
    generated = _metric(server, "localinfer_decode_steps")
    time.sleep(0.3)
    assert _metric(server, "localinfer_decode_steps") == generated  # nothing decodes for it


def test_metrics_count_requests_by_route_and_status(server):
    server.post("/v1/chat/completions", json={"model": "smollm2:135m", "max_tokens": 1,
                                               "messages": [{"role": "user", "content": "hi"}]})
    server.post("/v1/chat/completions", json={"model": "smollm2:135m"})
    text = server.get("/metrics").text
    assert re.search(r'localinfer_http_requests_total\{method="POST",'
                     r'route="/v1/chat/completions",status="200"\} [1-9]', text)
    assert re.search(r'route="/v1/chat/completions",status="400"\} [1-9]', text)
    assert re.search(r'^localinfer_ttft_seconds_count\{model="smollm2:135m"\} [1-9]', text, re.M)
    decode = _metric(server, "localinfer_llama_decode_seconds_total")
    assert 0 < decode < _metric(server, "localinfer_engine_step_seconds_total")
    # the runner's count reaches the server: at least one, at most the machine's CPUs
    assert 1 <= _metric(server, "localinfer_threads") <= (os.cpu_count() or 1)


def test_a_bad_prompt_in_a_batch_leaves_nothing_running(server):
    body = {"model": "smollm2:135m", "max_tokens": 200, "temperature": 0,
            "prompt": ["Tell a long story.", "x " * 2000]}  # the second is longer than the context
    assert server.post("/v1/completions", json=body).status_code == 400
    time.sleep(0.3)
    assert _metric(server, "localinfer_slots_active") == 0


def test_serve_with_one_kv_pool_takes_a_prompt_longer_than_a_share(tmp_path):
    """--kv-unified: 2 slots × 128 tokens make one pool of 256 cells, and one chat may use it."""
    server = start_server(tmp_path, "--model", "smollm2:135m", "--parallel", "2", "--ctx", "128",
                          "--kv-unified")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        story = "The sea was calm and the boat moved on. " * 16  # about 170 tokens
        reply = client.chat.completions.create(
            model="smollm2:135m", temperature=0, max_tokens=8,
            messages=[{"role": "user", "content": story + "Where was the boat?"}])
        assert reply.usage.prompt_tokens > 128 and reply.choices[0].message.content
        assert _metric(server, "localinfer_kv_cells") == 256
        metrics = server.get("/metrics").text
        assert "localinfer_preemptions" in metrics
        # (a transformer's memory is cut anywhere: it never needs a checkpoint)
        assert 'localinfer_checkpoints_restored_total{model="smollm2:135m"} 0.0' in metrics
    finally:
        stop_server(server)


def test_a_chat_whose_slot_took_another_finds_its_prompt_saved(tmp_path):
    """One slot, two chats in turns (an agent's main chat and a subagent): each turn's slot
    held the other chat, so every turn read its whole prompt again; now the chat's prompt,
    saved to RAM when the other took the slot, comes back cached (--cache-ram)."""
    server = start_server(tmp_path, "--model", "smollm2:135m", "--parallel", "1")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        chats = [[{"role": "system", "content": f"You are agent {name}. " + text * 6}]
                 for name, text in (("one", "Answer in short sentences. "),
                                    ("two", "List the files you would read first. "))]
        cached = []
        for turn in range(2):
            for messages in chats:
                messages.append({"role": "user", "content": f"Step {turn}: go on."})
                reply = client.chat.completions.create(
                    model="smollm2:135m", temperature=0, max_tokens=4, messages=messages)
                messages.append({"role": "assistant",
                                 "content": reply.choices[0].message.content})
                cached.append((reply.usage.prompt_tokens_details.cached_tokens,
                               reply.usage.prompt_tokens))
        assert all(c < 16 for c, _ in cached[:2])  # (two chats new to the server)
        assert all(c > p / 2 for c, p in cached[2:]), cached
        assert _metric(server, "localinfer_prompts_restored_total") == 2
    finally:
        stop_server(server)


@pytest.mark.slow
def test_a_huge_prompt_is_refused_by_its_size_while_the_server_answers(server):
    """Templating and tokenizing ~7 MB took seconds (off the event loop); now its size alone
    refuses it, before it is read, and the server answers others meanwhile."""
    import threading

    huge = {"model": "smollm2:135m", "prompt": "lighthouse keeper " * 390_000, "stream": False}
    result = {}
    big = threading.Thread(target=lambda: result.update(r=server.post("/api/generate", json=huge)))
    big.start()
    health = server.get("/health")
    big.join()
    assert health.status_code == 200
    assert result["r"].status_code == 400  # longer than the context: refused, not crashed
    # by its size, not tokenized (in Ollama's words)
    assert "exceeds the context length (at least " in result["r"].json()["error"]


@pytest.mark.slow
def test_sigterm_ends_running_streams_properly_and_exits(tmp_path):
    import signal

    srv = start_server(tmp_path / "home", "--model", "smollm2:135m", "--parallel", "2",
                       "--ctx", "2048")
    try:
        lines: list[str] = []
        body = {"model": "smollm2:135m", "stream": True, "max_tokens": 1500,
                "messages": [{"role": "user", "content": "Count from one to a thousand."}],
                "logit_bias": NO_END}  # keep writing
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body,
                          timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                if len(lines) == 5:
                    srv.process.send_signal(signal.SIGTERM)
        assert lines[-1] == "[DONE]", lines[-3:]
        last = json.loads(lines[-2])
        assert last["choices"][0]["finish_reason"] == "stop"
        assert len(lines) < 300  # it stopped when told, not at max_tokens
        # uvicorn ends by raising the signal again once it has shut down: exit by SIGTERM
        assert srv.process.wait(timeout=15) in (0, -signal.SIGTERM)
    finally:
        if srv.process.poll() is None:
            stop_server(srv)
    assert "Traceback" not in srv.log.read_text()


@pytest.mark.slow
def test_sigterm_during_a_first_load_ends_the_requests_waiting_for_it(tmp_path):
    """The shutdown ended only loaded models' requests: those waiting for a load were cut
    after the 5-second grace, without a status or a last chunk (CancelledError tracebacks in
    the log). Now each gets its dialect's 503 at once. (The load never ends here: a fault the
    runner reads makes it hang until the shutdown stops it.)"""
    import signal
    import threading

    import anthropic
    import ollama

    fault = tmp_path / "fault"
    fault.write_text("hang")
    srv = start_server(tmp_path / "home", "--parallel", "4", "--ctx", "256",
                       env={"LOCALINFER_RUNNER_FAULT": str(fault),
                            "LOCALINFER_LOAD_TIMEOUT": "8"})
    hi = [{"role": "user", "content": "hi"}]
    asks = {
        "openai": lambda: list(openai.OpenAI(base_url=srv.url + "/v1", api_key="-",
                                             max_retries=0).chat.completions.create(
            model="smollm2:135m", messages=hi, max_tokens=8, stream=True)),
        "ollama": lambda: list(ollama.Client(host=srv.url).chat(
            model="smollm2:135m", messages=hi, stream=True)),
        "anthropic": lambda: list(anthropic.Anthropic(base_url=srv.url, api_key="-",
                                                      max_retries=0).messages.create(
            model="smollm2:135m", messages=hi, max_tokens=8, stream=True)),
    }
    answers: dict[str, tuple[object, float]] = {}

    def ask(name: str) -> None:
        try:
            asks[name]()
            answers[name] = ("no error", time.monotonic())
        except Exception as exc:  # noqa: BLE001 - what each client raised is the answer
            answers[name] = (exc, time.monotonic())

    threads = [threading.Thread(target=ask, args=(name,)) for name in asks]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while not srv.get("/health").json()["models_loading"]:
            assert time.monotonic() < deadline, "the load never began"
            time.sleep(0.05)
        time.sleep(1.0)  # every request waits for the load now (it hangs)
        told = time.monotonic()
        srv.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(timeout=20)
        for name, (error, when) in answers.items():
            status = getattr(error, "status_code", None)
            assert status == 503, (name, error)
            assert "shutting down" in str(error), (name, error)
            assert when - told < 2, (name, when - told)  # at once, not after the grace
        assert srv.process.wait(timeout=20) in (0, -signal.SIGTERM)
    finally:
        if srv.process.poll() is None:
            stop_server(srv)
    log = srv.log.read_text()
    assert "Traceback" not in log and "CancelledError" not in log, log


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_server_streams_on_the_c_http_parser_and_the_libuv_loop(server):
    """uvicorn takes httptools and uvloop when they are installed (and not when told h11 or
    asyncio): they carry a streamed token with ~1.6x less of the event loop's CPU
    (bench/results/stream_cost.md)."""
    maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    assert "/httptools/" in maps and "/uvloop/" in maps
