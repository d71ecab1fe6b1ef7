"""Code completion for editors through every dialect: Ollama's `suffix` (the unmodified
`ollama` client), OpenAI's legacy completions `suffix` (the unmodified `openai` client) and
llama-server's `/infill` (raw HTTP, as the llama.vscode and llama.vim plugins send it), on a
random-weight Qwen2.5-Coder (its real vocabulary and FIM tokens: tests/families.py)."""

from __future__ import annotations

import re
import time

import httpx
import ollama
import openai
import pytest

from ..families import QWEN_CODER_ADDED, family_model, install, saying
from .conftest import start_server, stop_server

pytestmark = pytest.mark.slow

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nprint(add(1, 2))\n"
# every end-of-generation token of the vocabulary (llama.cpp's list for this file: the FIM
# pad, repo and file marks end a reply too), so that replies run on
NO_END = {str(t): -100 for t in (128247, 151643, 151645, 151662, 151663, 151664)}


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    home = tmp_path_factory.mktemp("coder-home")
    name = install(home, family_model("Qwen-Qwen2.5-7B-Instruct", "qwen2", QWEN_CODER_ADDED,
                                      "-coder"), "qwen2.5-coder-tiny")
    server = start_server(home, "--model", name, "--ctx", "4096", "--parallel", "2",
                          ready_timeout=120)
    yield server, name
    stop_server(server)


def _infill(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/infill", timeout=60, json=body)


def test_infill_answers_as_llama_server_does(coder):
    server, name = coder
    reply = _infill(server, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=8,
                    input_extra=[{"filename": "util.py", "text": "X = 1\n"}])
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["stop"] is True and data["model"] == name
    assert 0 < data["tokens_predicted"] <= 8 and data["tokens_evaluated"] > 20
    assert {"prompt_n", "predicted_n", "predicted_per_second"} <= set(data["timings"])
    with httpx.stream("POST", server.url + "/infill", timeout=60, json={
            "input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 6,
            "stream": True}) as streamed:
        lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert '"stop": true' in lines[-1] and all('"stop": false' in x for x in lines[:-1])


def test_a_keystroke_later_the_file_comes_from_the_cache(coder):
    """An editor sends nearly the same prefix on every keystroke: the second request on a
    2,000-token file reuses the cached prompt up to the edit."""
    server, _ = coder
    prefix = "".join(f"def f_{i}(x):\n    return x * {i}\n\n" for i in range(160))
    first = _infill(server, input_prefix=prefix, input_suffix=SUFFIX, n_predict=4).json()
    assert first["tokens_evaluated"] > 2000
    typed = _infill(server, input_prefix=prefix + "val", input_suffix=SUFFIX,
                    n_predict=4).json()
    suffix_tokens = 20  # the suffix and marks after the edit are read again
    assert typed["tokens_cached"] >= first["tokens_evaluated"] - suffix_tokens
    assert typed["timings"]["prompt_n"] < 40


def test_ollama_client_fills_the_middle_with_suffix(coder):
    server, name = coder
    client = ollama.Client(host=server.url)
    reply = client.generate(model=name, prompt=PREFIX, suffix=SUFFIX,
                            options={"num_predict": 6, "temperature": 0})
    assert reply.done and 0 < reply.eval_count <= 6
    # the same prompt /infill builds: the model's FIM tokens around the two texts
    built = _infill(server, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=1).json()
    assert reply.prompt_eval_count == built["tokens_evaluated"]
    parts = list(client.generate(model=name, prompt=PREFIX, suffix=SUFFIX, stream=True,
                                 options={"num_predict": 6}))
    assert parts[-1].done and sum(1 for p in parts if p.response) >= 1
    assert "insert" in client.show(name).capabilities
    assert "insert" not in client.show("smollm2:135m").capabilities
    with pytest.raises(ollama.ResponseError, match="fill-in-the-middle") as refused:
        client.generate(model="smollm2:135m", prompt=PREFIX, suffix=SUFFIX)
    assert refused.value.status_code == 400


def test_openai_client_fills_the_middle_with_suffix(coder):
    server, name = coder
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    reply = client.completions.create(model=name, prompt=PREFIX, suffix=SUFFIX, max_tokens=6,
                                      temperature=0)
    built = _infill(server, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=1).json()
    assert reply.usage.prompt_tokens == built["tokens_evaluated"]
    assert 0 < reply.usage.completion_tokens <= 6
    with pytest.raises(openai.BadRequestError, match="fill-in-the-middle"):
        client.completions.create(model="smollm2:135m", prompt=PREFIX, suffix=SUFFIX)


def _active_slots(server, name: str) -> float:
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    found = re.search(rf'localinfer_slots_active\{{model="{re.escape(name)}"\}} ([\d.]+)',
                      metrics)
    return float(found.group(1)) if found else 0.0


def test_infill_stops_at_a_line_indented_less_and_after_its_time(coder):
    """llama-server's n_indent and t_max_predict_ms, as llama.vscode sends them: a
    completion ends before the first line that leaves the block; one past its time ends at
    the next newline."""
    server, _ = coder
    code = "x = 1\n    y = 2\n\n    w = 4\nz = 3\n"
    reply = _infill(server, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=200,
                    grammar=saying(code), n_indent=4).json()
    assert reply["content"] == "x = 1\n    y = 2\n\n    w = 4"
    whole = _infill(server, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=200,
                    grammar=saying(code)).json()
    assert whole["content"] == code
    lines = "value = compute(1, 2, 3, 4, 5, 6, 7, 8)\nresult = value * 2\nprint(result)\n"
    reply = _infill(server, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=300,
                    grammar=saying(lines), t_max_predict_ms=1).json()
    assert reply["content"].endswith("\n") and len(reply["content"]) < len(lines)
    assert reply["stop_type"] == "limit"


def test_infill_ignore_eos_writes_to_the_limit(coder):
    server, _ = coder
    ending = [[151643, 100]]  # the end token made all but certain
    reply = _infill(server, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=12,
                    logit_bias=ending).json()
    assert reply["tokens_predicted"] == 1 and reply["stop_type"] == "eos"
    reply = _infill(server, input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=12,
                    logit_bias=ending, ignore_eos=True).json()
    assert reply["tokens_predicted"] == 12 and reply["stop_type"] == "limit"


@pytest.mark.parametrize("route", ["/infill", "/v1/completions", "/api/generate"])
def test_an_abandoned_completion_is_cancelled_at_once(coder, route):
    """Editors give up on most completions a keystroke later: a client that hangs up frees
    its slot within a moment, though its reply had thousands of tokens to go."""
    server, name = coder
    body = {"/infill": {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 3000,
                        "logit_bias": [[int(t), False] for t in NO_END]},
            "/v1/completions": {"model": name, "prompt": PREFIX, "suffix": SUFFIX,
                                "max_tokens": 3000, "logit_bias": NO_END},
            # (a grammar that never ends: Ollama's options have no logit_bias)
            "/api/generate": {"model": name, "prompt": PREFIX, "suffix": SUFFIX,
                              "stream": False, "options": {"num_predict": 3000,
                                                           "grammar": 'root ::= "a" root'}},
            }[route]
    with pytest.raises(httpx.ReadTimeout):  # (its 3,000 tokens take ~5 s here)
        httpx.post(server.url + route, json=body, timeout=httpx.Timeout(60, read=0.5))
    deadline = time.monotonic() + 1
    while _active_slots(server, name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _active_slots(server, name) == 0
