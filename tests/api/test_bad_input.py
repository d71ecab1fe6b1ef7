"""Bad requests get the right 4xx in the dialect's shape, and the server keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import start_server, stop_server

CHAT = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
OLLAMA_CHAT = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "hi"}],
               "stream": False, "options": {"num_predict": 2}}

CASES = [
    ("/v1/chat/completions", b"{not json", 400),
    ("/v1/chat/completions", {**CHAT, "messages": "hello"}, 400),
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, 400),
    ("/v1/chat/completions", {**CHAT, "model": "no-such-model"}, 404),
    ("/v1/chat/completions", {**CHAT, "model": "../../etc/passwd"}, 400),
    ("/v1/chat/completions", {**CHAT, "model": "/tmp/x.gguf"}, 400),
    ("/v1/chat/completions", {**CHAT, "max_tokens": -5}, 400),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"999999999": 5}}, 400),
    ("/v1/chat/completions", {**CHAT, "n": 3}, 400),
    ("/v1/chat/completions", {**CHAT, "tool_choice": {"type": "function",
                                                      "function": {"name": "nope"}},
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, 400),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x" * 4000}]}, 400),
    ("/v1/embeddings", {"model": "smollm2:135m", "input": []}, 400),
    ("/api/chat", b"[1, 2", 400),
    ("/api/chat", {**OLLAMA_CHAT, "model": "nope"}, 404),
    ("/api/chat", {**OLLAMA_CHAT, "options": {"temperature": -1}}, 400),
    ("/api/chat", {**OLLAMA_CHAT, "format": "yaml"}, 400),
    ("/api/chat", {**OLLAMA_CHAT, "keep_alive": "soon"}, 400),
    ("/api/generate", {"model": "smollm2:135m", "prompt": "hi", "images": ["aGk="]}, 400),
    ("/api/show", {}, 400),
    ("/v1/chat/completions", b'{"model": "smollm2:135m", "max_tokens": 2, "messages": '
                             b'[{"role": "user", "content": "\\ud800 hi"}]}', 400),
    ("/api/generate", b'{"model": "smollm2:135m", "prompt": "\\udfff", "stream": false}', 400),
    ("/api/generate", {"model": "smollm2:135m", "prompt": "hi", "options": {"num_predict": 0}},
     400),
    ("/api/pull", {}, 400),
    ("/api/pull", {"model": "hf.co/owner/repo:banana"}, 404),
    # schemas whose grammar would overflow llama.cpp's parser (the process died), explode
    # its parse stacks (minutes a token, every stream stalled) or never end
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "maxLength": 20000}}}}, 400),
    ("/api/generate", {"model": "smollm2:135m", "prompt": "hi", "stream": False,
                       "format": {"type": "array", "items": {"type": "integer"},
                                  "maxItems": 20000}}, 400),
    ("/api/chat", {**OLLAMA_CHAT, "format": {"type": "string",
                                             "pattern": "^((a{0,100}){0,100}){0,100}$"}}, 400),
    ("/api/chat", {**OLLAMA_CHAT, "format": {"enum": list(range(100_000))}}, 400),
    ("/api/chat", {**OLLAMA_CHAT, "format": {"$defs": {"n": {"$ref": "#/$defs/n"}},
                                             "$ref": "#/$defs/n"}}, 400),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {
            "x": {"type": "string", "minLength": 5000}}}}}], "tool_choice": "required"}, 400),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": "x"}}], "tool_choice": "required"}, 400),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "integer", "minimum": 10, "maximum": 1}}}}, 400),
]


@pytest.mark.parametrize("path,body,status", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_request_gets_a_clear_error_and_the_server_keeps_serving(server, path, body, status):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    response = server.post(path, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    message = error["message"] if path.startswith("/v1/") else error
    assert isinstance(message, str) and 10 < len(message) < 400
    assert "object has no attribute" not in message and "Traceback" not in message
    assert server.post("/v1/chat/completions", json=CHAT).status_code == 200


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat", "/v1/messages"])
def test_a_body_that_is_not_json_or_nothing_is_named_so(server, path):
    def message(content: bytes) -> str:
        reply = server.post(path, content=content, headers={"content-type": "application/json"})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        return error if isinstance(error, str) else error["message"]

    assert message(b'{"model": "smollm2:135m", oops}').startswith("the body is not valid JSON")
    assert "at character" in message(b"{not json")
    assert message(b"") == "the body is empty — send a JSON object"


@pytest.mark.parametrize("path", ["/v1/embeddings", "/api/embed"])
def test_an_embedding_read_whose_client_hung_up_stops(server, path):
    """A client that gives up on a huge embedding request does not leave the model's reads
    busy for nobody: the runner stops at its next decode and the next request is read."""
    import time

    huge = {"model": "smollm2:135m", "input": ["hello world"] * 100_000}  # minutes, read on
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + path, json=huge, timeout=httpx.Timeout(60, read=3))
    started = time.monotonic()
    reply = httpx.post(server.url + path, json={"model": "smollm2:135m", "input": "hi"},
                       timeout=120)
    assert reply.status_code == 200, reply.text
    assert time.monotonic() - started < 30  # (read on, the huge one held it for minutes)


def test_a_prompt_far_too_long_is_refused_before_it_is_read(server):
    """100,000 messages (2.4 MB) were templated and tokenized for minutes, the client long
    gone; its size alone says it cannot fit (smollm2: no token stands for more than 81 bytes)."""
    many = {**CHAT, "messages": [{"role": "user", "content": "hello there, " * 20}] * 10_000}
    response = server.post("/v1/chat/completions", json=many)
    assert response.status_code == 400, response.text
    error = response.json()["error"]  # (OpenAI's words and code, which its clients read)
    assert "resulted in at least" in error["message"]
    assert error["code"] == "context_length_exceeded"
    one = {**OLLAMA_CHAT, "messages": [{"role": "user", "content": "word " * 600_000}]}
    response = server.post("/api/chat", json=one)
    assert response.status_code == 400 and "at least" in response.json()["error"]
    assert server.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_a_body_of_countless_objects_is_refused_before_it_is_validated(server):
    """Validating 100,000 tiny messages held the event loop, and every stream, for 0.5 s;
    braces inside text are not objects and do not count."""
    many = {**CHAT, "messages": [{"role": "user", "content": "hi"}] * 100_000}
    response = server.post("/v1/chat/completions", json=many)
    assert response.status_code == 413, response.text
    assert "more than 20000 JSON objects" in response.json()["error"]["message"]
    parts = {**OLLAMA_CHAT, "messages": [{"role": "user", "content": "hi"}] * 30_000}
    response = server.post("/api/chat", json=parts)
    assert response.status_code == 413 and "JSON objects" in response.json()["error"]
    code = {**CHAT, "messages": [{"role": "user", "content": "f() { return {}; }" * 30_000}]}
    response = server.post("/v1/chat/completions", json=code)
    assert response.status_code == 400, response.text  # too long a prompt, not too many objects
    assert "resulted in at least" in response.json()["error"]["message"]
    assert server.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_oversized_body_is_413(server):
    huge = {**CHAT, "messages": [{"role": "user", "content": "x" * (9 * 1024 * 1024)}]}
    assert server.post("/v1/chat/completions", json=huge).status_code == 413
    chunks = (b"x" * 65536 for _ in range(160))  # 10 MiB, chunked: no Content-Length
    response = server.post("/api/chat", content=chunks)
    assert response.status_code == 413 and "larger than" in response.json()["error"]
    assert server.post("/v1/chat/completions", json=CHAT).status_code == 200


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/api/chat"])
def test_a_body_too_large_is_one_error_sized_or_chunked(server, path):
    """The guard refuses a sized body, the route a chunked one as it reads it: the client
    sees one error, its type included (OpenAI's was request_too_large, then
    invalid_request_error)."""
    sized = server.post(path, content=b"x" * (9 * 1024 * 1024))
    chunked = server.post(path, content=(b"x" * 65536 for _ in range(160)))
    assert sized.status_code == chunked.status_code == 413
    assert sized.json() == chunked.json(), (sized.json(), chunked.json())


# one rule per sampling parameter, whichever dialect carries it: (parameter, value, status)
RULES = [
    ("temperature", 2.5, 400), ("temperature", 1.5, 200), ("temperature", "NaN", 400),
    ("top_p", 0, 400), ("top_p", 1.5, 400),
    ("top_k", -1, 200), ("top_k", 1, 200), ("top_k", 2**70, 400), ("top_k", 2**31, 400),
    ("min_p", 1.5, 400), ("repeat_penalty", "1e309", 400), ("repeat_penalty", 0, 400),
    ("repeat_penalty", 1.2, 200), ("presence_penalty", 3, 400), ("seed", -1, 200),
    ("seed", 2**32, 400),
]
# where each dialect takes them: the route, a body around them, and those it reads
DIALECTS = {
    "openai": ("/v1/chat/completions", '{"model": "smollm2:135m", "max_tokens": 1, '
               '"messages": [{"role": "user", "content": "hi"}], %s}', None),
    "ollama": ("/api/chat", '{"model": "smollm2:135m", "stream": false, "messages": [{"role": '
               '"user", "content": "hi"}], "options": {"num_predict": 1, %s}}', None),
    "anthropic": ("/v1/messages", '{"model": "smollm2:135m", "max_tokens": 1, "messages": '
                  '[{"role": "user", "content": "hi"}], %s}', {"temperature", "top_p", "top_k"}),
    "responses": ("/v1/responses", '{"model": "smollm2:135m", "max_output_tokens": 1, '
                  '"input": "hi", "store": false, %s}', {"temperature", "top_p"}),
}


@pytest.mark.parametrize("name,value,status", RULES, ids=[f"{r[0]}={r[1]}" for r in RULES])
def test_one_rule_per_sampling_parameter_in_every_dialect(server, name, value, status):
    """OpenAI's top_k -1 passed (unread) where Ollama's was a 400, and Ollama's top_k 2**70
    and repeat_penalty 1e309 were taken silently: each parameter now has one rule."""
    seen = {}
    for dialect, (path, body, reads) in DIALECTS.items():
        if reads is None or name in reads:
            response = server.post(path, content=(body % f'"{name}": {value}').encode())
            seen[dialect] = response.status_code
            if response.status_code == 400:
                error = response.json()["error"]
                assert name in (error if isinstance(error, str) else error["message"])
    assert set(seen.values()) == {status}, seen


@pytest.mark.parametrize("host", ["evil.example", "attacker.com:11435", "192.168.1.10",
                                  # a URL's reader takes the name after the user part
                                  "127.0.0.1:11435@attacker.com", "localhost@evil.example",
                                  "127.0.0.1/evil", "127.0.0.1:11435:80"])
def test_foreign_host_header_is_refused(server, host):
    response = server.post("/api/chat", json=OLLAMA_CHAT, headers={"Host": host})
    assert response.status_code == 403 and "not allowed" in response.json()["error"]


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1:8080", "[::1]:11435", "app.localhost"])
def test_loopback_host_names_pass(server, host):
    assert server.get("/api/version", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("path,body", [
    ("/api/pull", b'{"model": "hf.co/someone/big-model-GGUF:Q8_0"}'),
    ("/api/generate", b'{"model": "smollm2:135m", "prompt": "hi", "stream": false}'),
    ("/v1/chat/completions", b'{"model": "smollm2:135m", "messages": []}'),
])
def test_a_page_on_another_site_cannot_post_to_the_server(server, path, body):
    """A 'simple' cross-site request (text/plain, no preflight) is refused before it runs."""
    response = server.post(path, content=body, headers={
        "Origin": "https://evil.example", "Content-Type": "text/plain"})
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert "--allow-origin https://evil.example" in (error if isinstance(error, str)
                                                     else error["message"])
    assert server.post("/api/show", json={"model": "smollm2:135m"}).status_code == 200
    assert not (server.log.parent / "models" / "hub").exists()  # nothing was pulled


@pytest.mark.parametrize("origin", ["null", "http://127.0.0.1.evil.example", "file://",
                                    "http://127.0.0.1:1@evil.example",
                                    "http://localhost@evil.example:80"])
def test_odd_origins_are_refused(server, origin):
    assert server.get("/api/version", headers={"Origin": origin}).status_code == 403


@pytest.mark.parametrize("origin", ["http://localhost:5173", "http://127.0.0.1:11435",
                                    "http://[::1]:3000"])
def test_loopback_pages_may_use_the_server(server, origin):
    assert server.get("/api/version", headers={"Origin": origin}).status_code == 200


def _raw(server, head: bytes) -> bytes:
    """A request sent byte for byte as given (no client merges or drops its headers)."""
    import socket

    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(head)
        got = b""
        while chunk := conn.recv(4096):
            got += chunk
    return got


@pytest.mark.parametrize("headers", [
    b"Host: evil.example\r\nHost: 127.0.0.1\r\n",  # the guard read the last one
    b"Host: 127.0.0.1\r\nHost: evil.example\r\n",
    b"Host: 127.0.0.1\r\nOrigin: https://evil.example\r\nOrigin: http://localhost\r\n",
])
def test_two_hosts_or_two_origins_are_refused(server, headers):
    answer = _raw(server, b"GET /api/version HTTP/1.1\r\n" + headers
                  + b"Connection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"].startswith("the request has 2 ") and body["error"].endswith("send one")


def test_cors_is_closed_by_default(server):
    response = server.get("/api/tags", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in response.headers


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("keyed"), "--api-key", "s3cret", "--parallel", "1",
                       "--ctx", "256", "--allow-origin", "https://ok.example")
    yield srv
    stop_server(srv)


def test_api_key_is_required_when_set(keyed_server):
    assert keyed_server.post("/v1/chat/completions", json=CHAT).status_code == 401
    wrong = keyed_server.post("/api/chat", json=OLLAMA_CHAT, headers={"Authorization": "Bearer x"})
    assert wrong.status_code == 401 and "API key" in wrong.json()["error"]
    right = keyed_server.post("/v1/chat/completions", json=CHAT,
                              headers={"Authorization": "Bearer s3cret"})
    assert right.status_code == 200
    assert keyed_server.get("/health").status_code == 200  # probes need no key


def test_the_web_apps_files_are_open_and_its_data_needs_the_key(keyed_server):
    page = keyed_server.get("/", headers={"Accept": "text/html,application/xhtml+xml"})
    assert page.status_code == 200 and "<title>localinfer</title>" in page.text
    assert keyed_server.get("/").text == "localinfer is running"  # as Ollama's root, to programs
    script = keyed_server.get("/ui/app.js")
    assert script.status_code == 200 and "chat/completions" in script.text
    assert keyed_server.get("/ui/vendor/purify.min.js").status_code == 200
    assert keyed_server.get("/localinfer/models").status_code == 401
    rows = keyed_server.get("/localinfer/models", headers={"Authorization": "Bearer s3cret"})
    assert rows.status_code == 200
    smollm2 = next(r for r in rows.json()["models"] if r["name"] == "smollm2:135m")
    assert smollm2["installed"] and smollm2["fit"] == "CPU" and smollm2["quant"] == "Q4_1"
    assert keyed_server.get("/ui/../api/tags").status_code in (401, 404)  # no way around


def test_a_configured_origin_may_post(keyed_server):
    ok = keyed_server.post("/v1/chat/completions", json=CHAT, headers={
        "Origin": "https://ok.example", "Authorization": "Bearer s3cret"})
    assert ok.status_code == 200


def test_configured_origin_gets_cors_headers(keyed_server):
    response = httpx.options(keyed_server.url + "/v1/models", timeout=10, headers={
        "Origin": "https://ok.example", "Access-Control-Request-Method": "GET"})
    assert response.headers.get("access-control-allow-origin") == "https://ok.example"


def test_a_client_slow_to_send_its_headers_is_cut_off(tmp_path):
    """Connections that send their headers a byte at a time stayed open as long as their
    clients liked: enough of them and no one else could connect."""
    import socket
    import time

    srv = start_server(tmp_path / "home", "--parallel", "1", "--ctx", "256",
                       env={"LOCALINFER_HEADER_TIMEOUT": "1", "LOCALINFER_BODY_TIMEOUT": "2"})
    try:
        port = int(srv.url.rsplit(":", 1)[1])
        slow = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(20)]
        for s in slow:
            s.sendall(b"GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and no more
        time.sleep(0.5)
        assert srv.get("/api/version").status_code == 200  # meanwhile others are served
        started = time.monotonic()
        assert all(s.recv(100) == b"" for s in slow)  # closed by the server
        assert time.monotonic() - started < 5
        kept = socket.create_connection(("127.0.0.1", port), timeout=10)

        def answer() -> bytes:
            kept.sendall(b"GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            got = b""
            while not got.endswith(b"}"):
                got += kept.recv(4096)
            return got

        assert answer().startswith(b"HTTP/1.1 200")
        time.sleep(1.5)  # an answered, kept-alive connection is not cut by the header timer
        assert answer().startswith(b"HTTP/1.1 200")
        # a body sent a byte at a time is cut off too, once LOCALINFER_BODY_TIMEOUT has passed
        dribble = socket.create_connection(("127.0.0.1", port), timeout=10)
        dribble.sendall(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Content-Length: 1000\r\n\r\n")
        started, closed = time.monotonic(), False
        while time.monotonic() - started < 8 and not closed:
            try:
                dribble.sendall(b" ")
                dribble.settimeout(0.3)
                closed = dribble.recv(100) == b""
            except socket.timeout:
                pass
            except OSError:  # reset: closed as well
                closed = True
        assert closed and 1.5 < time.monotonic() - started < 5
        for s in (*slow, kept, dribble):
            s.close()
    finally:
        stop_server(srv)
