"""The unmodified `ollama` client against a real `localinfer serve`."""

from __future__ import annotations

import math

import httpx
import localinfer
import ollama
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 16}


@pytest.fixture(scope="module")
def client(server) -> ollama.Client:
    return ollama.Client(host=server.url)


def test_chat_with_ollama_numbers(client):
    reply = client.chat(model="smollm2:135m", messages=QUESTION, options=GREEDY)
    assert reply.message.role == "assistant" and reply.message.content
    assert reply.done and reply.done_reason in ("stop", "length")
    assert reply.prompt_eval_count > 10 and 1 <= reply.eval_count <= 16
    # durations are nanoseconds, and the parts fit inside the whole
    assert 0 < reply.eval_duration < reply.total_duration < 60e9
    assert reply.prompt_eval_duration < reply.total_duration


def test_streamed_chat_equals_the_whole(client, smollm2, smollm2_reference):
    plain = {**GREEDY, "repeat_penalty": 1.0}  # Ollama's default is 1.1: greedy with a penalty
    whole = client.chat(model="smollm2:135m", messages=QUESTION, options=plain)
    parts = list(client.chat(model="smollm2:135m", messages=QUESTION, options=plain, stream=True))
    assert len(parts) > 3 and parts[-1].done and not any(p.done for p in parts[:-1])
    # both are the greedy reply (up to near-ties: the second finds its prompt cached)
    prompt = smollm2.tokenize(smollm2.apply_chat_template(QUESTION))
    for text, reply in (("".join(p.message.content for p in parts), parts[-1]),
                        (whole.message.content, whole)):
        assert smollm2_reference.follows(prompt, text, reply.done_reason) > 3


def test_generate_with_system_and_raw(client, smollm2, smollm2_reference):
    reply = client.generate(model="smollm2", prompt="Name a colour.", system="Answer in one word.",
                            options=GREEDY)
    assert reply.response and reply.done
    raw = client.generate(model="smollm2", prompt="1, 2, 3, 4,", raw=True,
                          options={"temperature": 0, "num_predict": 4, "repeat_penalty": 1.0})
    assert raw.response.strip().startswith("5")
    assert smollm2_reference.follows(smollm2.tokenize("1, 2, 3, 4,"), raw.response,
                                     raw.done_reason)


def test_generate_on_a_base_model_continues_the_prompt_as_it_is(client, gemma3,
                                                                gemma3_reference):
    """gemma3:270m's file has no chat template: /api/generate must not wrap the prompt in
    turns it never learned (Ollama's template for such a model is the prompt itself)."""
    prompt = "1, 2, 3, 4,"
    greedy = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 4}
    reply = client.generate(model="gemma3:270m", prompt=prompt, options=greedy)
    assert reply.prompt_eval_count == len(gemma3.tokenize(prompt))  # the prompt, and no turns
    assert reply.response.strip().startswith("5")
    assert gemma3_reference.follows(gemma3.tokenize(prompt), reply.response, reply.done_reason)
    raw = client.generate(model="gemma3:270m", prompt=prompt, raw=True, options=greedy)
    assert raw.prompt_eval_count == reply.prompt_eval_count
    client.generate(model="gemma3:270m", keep_alive=0)  # unloaded again


def test_format_json_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    reply = client.chat(model="smollm2:135m", messages=QUESTION, format=schema,
                        options={"temperature": 0, "num_predict": 40})
    import json
    assert isinstance(json.loads(reply.message.content)["city"], str)


def test_list_show_ps(client):
    names = [m.model for m in client.list().models]
    assert "smollm2:135m" in names
    shown = client.show("smollm2:135m")
    assert shown.details.format == "gguf" and shown.details.quantization_level == "Q4_1"
    assert shown.modelinfo["general.architecture"] == "llama"
    running = client.ps().models
    entry = next(m for m in running if m.model == "smollm2:135m")
    assert entry.size > 90_000_000 and entry.expires_at is not None


def test_every_model_has_its_files_digest(client, smollm2_path, gemma3_path):
    """Clients tell models apart by digest (llm-ollama: an empty one made every model the
    same): the file's sha256, in /api/tags and /api/ps alike, computed once and kept."""
    import hashlib

    digests = {m.model: m.digest for m in client.list().models}
    for name, path in (("smollm2:135m", smollm2_path), ("gemma3:270m", gemma3_path)):
        assert digests[name] == hashlib.sha256(path.read_bytes()).hexdigest()
    client.generate("smollm2:135m", "Hi", options={"num_predict": 1})
    running = {m.model: m.digest for m in client.ps().models}
    assert running["smollm2:135m"] == digests["smollm2:135m"]


def test_show_and_tags_read_the_file_without_loading_it(client):
    shown = client.show("gemma3:270m")
    assert shown.modelinfo["general.architecture"] == "gemma3"
    assert shown.modelinfo["general.parameter_count"] > 200_000_000
    assert shown.details.quantization_level == "Q4_K_M" and shown.template
    assert "gemma3:270m" not in [m.model for m in client.ps().models]  # still not loaded
    families = {m.model: m.details.family for m in client.list().models}
    # from the file's header, loaded (smollm2) or not (gemma3): the same before and after
    assert families["smollm2:135m"] == "llama" and families["gemma3:270m"] == "gemma3"


def test_embed(client):
    result = client.embed(model="smollm2:135m", input=["hello world", "goodbye"])
    assert len(result.embeddings) == 2
    assert math.isclose(sum(x * x for x in result.embeddings[0]), 1.0, rel_tol=1e-4)


def test_an_embedding_request_with_no_input_loads_the_model(client, server):
    """As Ollama's: empty embeddings, the model loaded (it was a 400, "input is required")."""
    assert client.embed(model="smollm2:135m", input=[]).embeddings == []
    assert client.embed(model="smollm2:135m", input="").embeddings == []
    older = httpx.post(server.url + "/api/embeddings", json={"model": "smollm2:135m"})
    assert older.status_code == 200 and older.json() == {"embedding": []}
    assert "smollm2:135m" in [m.model for m in client.ps().models]


def test_embed_truncates_an_input_past_the_context_unless_told_not_to(client, server):
    """Ollama's default: the input cut to the context (the server's is 512 a slot); with
    truncate false, a 400 that says why. dimensions: the first N, normalised again."""
    long = "word " * 3000
    cut = client.embed(model="smollm2:135m", input=[long, "hello"])
    assert len(cut.embeddings) == 2 and 500 <= cut.prompt_eval_count - 2 <= 512 + 2
    assert math.isclose(sum(x * x for x in cut.embeddings[0]), 1.0, rel_tol=1e-4)
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model="smollm2:135m", input=long, truncate=False)
    assert refused.value.status_code == 400 and "context" in refused.value.error
    short = client.embed(model="smollm2:135m", input="hello", dimensions=8).embeddings[0]
    assert len(short) == 8 and math.isclose(sum(x * x for x in short), 1.0, rel_tol=1e-4)
    whole = client.embed(model="smollm2:135m", input="hello").embeddings[0]
    norm = math.sqrt(sum(x * x for x in whole[:8]))
    assert short == pytest.approx([x / norm for x in whole[:8]], abs=1e-5)
    reply = httpx.post(server.url + "/api/embed", json={"model": "smollm2:135m", "input": "hi",
                                                        "dimensions": 100_000})
    assert reply.status_code == 400 and "576" in reply.json()["error"]


def test_a_chat_past_the_context_loses_its_oldest_messages_unless_told_not_to(client, server):
    """As Ollama's /api/chat: the oldest messages go (the server's context is 512 a slot),
    and with truncate false a 400 in Ollama's words, which its clients look for."""
    chat = [{"role": "system", "content": "You are terse."}]
    for i in range(20):
        chat += [{"role": "user", "content": f"Message {i}: " + "more words here " * 12},
                 {"role": "assistant", "content": f"Noted {i}."}]
    chat.append({"role": "user", "content": "Say hello."})
    reply = client.chat(model="smollm2:135m", messages=chat,
                        options={"temperature": 0, "num_predict": 4})
    assert reply.done and 512 // 2 < reply.prompt_eval_count < 512
    refused = httpx.post(server.url + "/api/chat", json={
        "model": "smollm2:135m", "messages": chat, "stream": False, "truncate": False},
        timeout=60)
    assert refused.status_code == 400
    assert refused.json()["error"].startswith("the input length exceeds the context length (")
    assert "--ctx" not in refused.json()["error"]  # (a client sets options.num_ctx)


def test_pull_of_an_embedded_model_succeeds(client):
    assert client.pull("smollm2:135m").status == "success"
    statuses = [p.status for p in client.pull("smollm2:135m", stream=True)]
    assert statuses[-1] == "success"


# every option LangChain's OllamaEmbeddings and ChatOllama send, unset ones as null
LANGCHAIN_OPTIONS = dict.fromkeys(
    ["mirostat", "mirostat_eta", "mirostat_tau", "num_ctx", "num_gpu", "num_thread",
     "repeat_last_n", "repeat_penalty", "temperature", "stop", "tfs_z", "top_k", "top_p",
     "seed", "num_predict"])


def test_null_options_are_as_if_unsent(client):
    """Ollama ignores a null option; they were a 400 ("Input should be a valid number")."""
    embedded = client.embed(model="smollm2:135m", input=["hello"], options=LANGCHAIN_OPTIONS)
    assert len(embedded.embeddings) == 1
    short = {**LANGCHAIN_OPTIONS, "num_predict": 2}
    reply = client.chat(model="smollm2:135m", messages=QUESTION, options=short)
    assert reply.done and 1 <= reply.eval_count <= 2
    generated = client.generate(model="smollm2:135m", prompt="Hi", options=short)
    assert generated.done and 1 <= generated.eval_count <= 2


def test_logprobs_as_ollama_gives_them_streamed_and_whole(client):
    whole = client.chat(model="smollm2:135m", messages=QUESTION, logprobs=True, top_logprobs=2,
                        options={"temperature": 0, "num_predict": 5})
    assert "".join(e.token for e in whole.logprobs) == whole.message.content
    assert len(whole.logprobs) == whole.eval_count
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 2
               and e.top_logprobs[0].logprob == e.logprob for e in whole.logprobs)
    parts = list(client.generate(model="smollm2:135m", prompt="Once upon a time",
                                 logprobs=True, stream=True,
                                 options={"temperature": 0, "num_predict": 5}))
    entries = [e for part in parts for e in (part.logprobs or ())]
    assert "".join(e.token for e in entries) == "".join(part.response for part in parts)
    plain = client.chat(model="smollm2:135m", messages=QUESTION, options={"num_predict": 2})
    assert not plain.logprobs


def test_think_asked_of_a_model_that_does_not_think_is_a_400_as_ollama_says(client):
    """Its clients learn from it that the model does not think (it was taken silently)."""
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="smollm2:135m", messages=QUESTION, think=True, options=GREEDY)
    assert refused.value.status_code == 400
    assert refused.value.error == '"smollm2:135m" does not support thinking'
    with pytest.raises(ollama.ResponseError):
        client.generate(model="smollm2:135m", prompt="Hi", think=True, options=GREEDY)
    assert client.chat(model="smollm2:135m", messages=QUESTION, think=False,
                       options=GREEDY).message.content  # (off: taken)


def test_unknown_model_raises_response_error(client):
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="no-such-model", messages=QUESTION)
    assert err.value.status_code == 404


def test_version_and_root(server):
    # as an Ollama of the API served: clients compare it (Copilot wants 0.6.4 or later)
    answer = server.get("/api/version").json()
    assert tuple(map(int, answer["version"].split("."))) >= (0, 9, 0)
    assert answer["localinfer"] == localinfer.__version__
    assert server.get("/").status_code == 200
    assert httpx_head(server.url + "/").status_code == 200


def httpx_head(url: str):
    import httpx
    return httpx.head(url, timeout=10)


def test_ps_command_asks_the_running_server(server):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "localinfer", "ps", "--url", server.url],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "smollm2:135m" in result.stdout and "CPU" in result.stdout
    gone = subprocess.run([sys.executable, "-m", "localinfer", "ps", "--url", "http://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 1 and "localinfer serve" in gone.stderr


def test_an_endless_keep_alive_is_forever_and_nan_is_refused(server):
    """An infinite or huge keep_alive made /api/ps a 500 (OverflowError) for as long as the
    model stayed; NaN passed and unloaded the model at its first idle second. As Ollama: a
    negative or huge one is forever, and NaN is no duration (a 400)."""
    import subprocess
    import sys

    def load(keep_alive: str):
        return server.post("/api/generate", content=(
            '{"model": "smollm2:135m", "keep_alive": %s}' % keep_alive).encode())

    try:
        for endless in ("1e309", "Infinity", '"99999999999999999999h"', "-1e309"):
            assert load(endless).status_code == 200, endless
            ps = server.get("/api/ps")
            assert ps.status_code == 200, ps.text
            entry = next(m for m in ps.json()["models"] if m["name"] == "smollm2:135m")
            assert entry["expires_at"].startswith("2318-"), entry  # Ollama's "forever"
        shown = subprocess.run([sys.executable, "-m", "localinfer", "ps", "--url", server.url],
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "2318-01-01" in shown.stdout, shown.stderr
        for nan in ("NaN", '"nan"'):
            refused = load(nan)
            assert refused.status_code == 400 and "keep_alive" in refused.json()["error"]
            assert "Traceback" not in refused.text
        entry = next(m for m in server.get("/api/ps").json()["models"]
                     if m["name"] == "smollm2:135m")
        assert entry["expires_at"].startswith("2318-")  # the refused requests changed nothing
    finally:
        assert load('"5m"').status_code == 200  # as the other tests found it


def test_num_predict_beyond_the_context_shifts_instead_of_refusing(client, server):
    """As Ollama: the context (512 here) is not a cap on the reply; the older half is dropped."""
    counting = ", ".join(str(i) for i in range(1, 41)) + ","
    reply = client.generate(model="smollm2:135m", raw=True, prompt=counting,
                            options={"temperature": 0, "num_predict": 700, "num_keep": 8})
    assert reply.done and reply.done_reason == "length"
    assert reply.eval_count == 700 > 512  # past the whole context
    assert "150, 151, 152" in reply.response  # and still counting after the shifts


def test_stop_command_unloads_a_model_from_the_running_server(tmp_path):
    """As `ollama stop`: by the name `ps` shows or a short one; a model not loaded is an error."""
    import subprocess
    import sys

    from .conftest import start_server, stop_server

    server = start_server(tmp_path / "home", "--model", "smollm2:135m", "--parallel", "1",
                          "--ctx", "256")

    def stop(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "localinfer", "stop", name, "--url",
                               server.url], capture_output=True, text=True, timeout=60)

    try:
        assert [m["name"] for m in server.get("/api/ps").json()["models"]] == ["smollm2:135m"]
        done = stop("smollm2")  # the short name: the server says which model it means
        assert done.returncode == 0 and not done.stderr, done.stderr
        assert server.get("/api/ps").json()["models"] == []
        again = stop("smollm2:135m")
        assert again.returncode == 1
        assert again.stderr.strip() == "Error: 'smollm2:135m' is not loaded — loaded: none"
        unknown = stop("no-such-model")
        assert unknown.returncode == 1 and "404" in unknown.stderr and "not found" in unknown.stderr
    finally:
        stop_server(server)


def test_an_embedded_model_not_unpacked_yet_is_listed_as_it_will_be(tmp_path, gemma3_path):
    """gemma3 ships in pieces joined on first use; `list` said 241 MiB and /api/tags 0, then
    its digest, quantization and size were empty until its first use: they are read from its
    package (the first piece holds the header; the package declares the sha256)."""
    import hashlib

    from .conftest import start_server, stop_server

    srv = start_server(tmp_path / "home", "--parallel", "1", "--ctx", "256")
    try:
        listed = {m.model: m for m in ollama.Client(host=srv.url).list().models}
        gemma3 = listed["gemma3:270m"]
        assert gemma3.size == gemma3_path.stat().st_size
        assert gemma3.digest == hashlib.sha256(gemma3_path.read_bytes()).hexdigest()
        assert gemma3.details.quantization_level == "Q4_K_M"
        assert gemma3.details.family == "gemma3" and gemma3.details.parameter_size == "268M"
        assert not list((tmp_path / "home").rglob("*.gguf*"))  # listed, not unpacked
    finally:
        stop_server(srv)


@pytest.mark.slow
def test_first_uses_at_once_unpack_gemma3_once_and_a_killed_ones_leftovers_go(tmp_path):
    """Four first requests at once each unpacked their own copy of gemma3, and a SIGKILL
    meanwhile left four 200 MB temporary files for good: now one unpacks while the others
    wait for it, and the next start removes what a killed one left."""
    import signal
    import threading
    import time

    import httpx

    from .conftest import start_server, stop_server

    home = tmp_path / "home"
    folder = home / "models" / "embedded"
    srv = start_server(home, "--parallel", "1", "--ctx", "256")
    body = {"model": "gemma3:270m", "prompt": "Once", "raw": True, "stream": False,
            "options": {"num_predict": 1}}

    def first_use() -> None:
        try:
            httpx.post(srv.url + "/api/generate", json=body, timeout=60)
        except httpx.TransportError:  # the server is killed under it
            pass

    requests = [threading.Thread(target=first_use) for _ in range(4)]
    for request in requests:
        request.start()
    most, deadline = 0, time.monotonic() + 60
    while time.monotonic() < deadline:
        temporaries = list(folder.glob("*.tmp")) if folder.exists() else []
        most = max(most, len(temporaries))
        if any(t.exists() and t.stat().st_size > 100 * 2**20 for t in temporaries):
            break  # halfway through
        time.sleep(0.002)
    srv.process.send_signal(signal.SIGKILL)
    srv.process.wait()
    for request in requests:
        request.join()
    left = list(folder.glob("*.tmp"))
    assert most == 1 and len(left) == 1, (most, left)  # one at a time
    stop_server(srv)  # (its spare runner)

    again = start_server(home, "--parallel", "1", "--ctx", "256")
    try:
        reply = again.post("/api/generate", json=body)
        assert reply.status_code == 200 and reply.json()["done"], reply.text
        assert not list(folder.glob("*.tmp"))  # the killed one's leftover went
        assert [f.name for f in folder.iterdir()] == ["gemma-3-270m-q4_k_m.gguf"]
    finally:
        stop_server(again)


def test_generate_returns_its_context_and_takes_it_back(client):
    """/api/generate gives the conversation as tokens (`context`); sent back, the next prompt
    continues it (a client such as llm-ollama keeps a conversation this way)."""
    first = client.generate(model="smollm2:135m", prompt="My name is Ada.", options=GREEDY)
    n_prompt = first.prompt_eval_count
    assert len(first.context) == n_prompt + first.eval_count
    follow = client.generate(model="smollm2:135m", prompt="What is my name?",
                             context=first.context, options=GREEDY)
    # the new prompt is the old conversation plus the new turn's tokens
    assert follow.prompt_eval_count > len(first.context)
    assert follow.context[:len(first.context)] == first.context
    streamed = list(client.generate(model="smollm2:135m", prompt="My name is Ada.",
                                    options=GREEDY, stream=True))
    last = streamed[-1]  # (the reply may differ by a near-tie: the prompt is cached now)
    assert last.done and last.context[:n_prompt] == first.context[:n_prompt]
    assert len(last.context) == n_prompt + last.eval_count
    assert not any(p.context for p in streamed[:-1])
    with pytest.raises(ollama.ResponseError, match="vocabulary"):
        client.generate(model="smollm2:135m", prompt="Hi", context=[10**7], options=GREEDY)
    with pytest.raises(ollama.ResponseError) as too_long:  # the server's slots hold 512
        client.generate(model="smollm2:135m", prompt="Hi", context=[1] * 600, options=GREEDY)
    assert too_long.value.status_code == 400 and "512" in str(too_long.value)
