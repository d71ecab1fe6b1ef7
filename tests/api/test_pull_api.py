"""Pull and delete through the Ollama API, from a fake hub over real HTTP."""

from __future__ import annotations

import json
import time

import httpx
import ollama
import pytest

from ..fake_hub import FakeHub
from .conftest import start_server, stop_server

REPO = "testorg/SmolLM2-135M-Instruct-GGUF"
BAD_REPO = "testorg/corrupted-GGUF"
CRAFTED_REPO = "attacker/crafted-GGUF"


def _zero_alignment(source, dest):
    """The smollm2 file with general.alignment 0 (it once divided by zero): its uint32
    llama.block_count, a key of the same length, renamed and zeroed."""
    data = bytearray(source.read_bytes())
    key = b"llama.block_count"
    at = data.find(key) + len(key)
    assert at > len(key) and data[at:at + 4] == b"\x04\x00\x00\x00"  # a uint32
    data[at - len(key):at] = b"general.alignment"
    data[at + 4:at + 8] = bytes(4)
    dest.write_bytes(bytes(data))
    return dest


@pytest.fixture(scope="module")
def hub_server(quant_files, tmp_path_factory):
    hub = FakeHub()
    for label, path in quant_files.items():
        hub.add(REPO, f"SmolLM2-135M-Instruct-{label}.gguf", path)
    hub.add(BAD_REPO, "SmolLM2-135M-Instruct-Q8_0.gguf", quant_files["Q8_0"]).corrupt = True
    crafted = _zero_alignment(quant_files["Q4_1"], tmp_path_factory.mktemp("crafted") / "m.gguf")
    hub.add(CRAFTED_REPO, "crafted-Q4_K_M.gguf", crafted)
    hub.start()
    home = tmp_path_factory.mktemp("pull-home")
    srv = start_server(home, "--parallel", "1", "--ctx", "256",
                       env={"HF_ENDPOINT": hub.url, "HF_HOME": str(home / "hf"),
                            "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    yield srv, hub
    stop_server(srv)
    hub.stop()


@pytest.mark.slow
def test_pull_list_chat_delete(hub_server):
    server, hub = hub_server
    client = ollama.Client(host=server.url)
    name = f"hf.co/{REPO}:Q4_1"
    lines = list(client.pull(name, stream=True))
    statuses = [p.status for p in lines]
    assert statuses[-1] == "success" and any("sha256 verified" in s for s in statuses)
    size = hub.repos[REPO]["SmolLM2-135M-Instruct-Q4_1.gguf"].size
    progress = [(p.completed, p.total) for p in lines if p.total]
    assert progress and progress[-1] == (size, size)  # the bytes, as Ollama reports them
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)
    assert name in [m.model for m in client.list().models]
    reply = client.chat(model=name, messages=[{"role": "user", "content": "Hi"}],
                        options={"num_predict": 3})
    assert reply.message.content and 1 <= reply.eval_count <= 3  # (sampled: it may end sooner)
    client.delete(name)
    assert name not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model=name, messages=[{"role": "user", "content": "Hi"}])
    assert err.value.status_code == 404 and "pull" in str(err.value)
    with pytest.raises(ollama.ResponseError) as err:
        client.pull(f"hf.co/{REPO}:Q3_K_M")
    assert "Q4_1" in str(err.value)


@pytest.mark.slow
def test_a_download_that_fails_midway_ends_the_stream_with_the_error(hub_server):
    server, _ = hub_server
    client = ollama.Client(host=server.url)
    seen = []
    with pytest.raises(ollama.ResponseError, match="checksum"):
        for line in client.pull(f"hf.co/{BAD_REPO}:Q8_0", stream=True):
            seen.append(line)
    assert any(line.completed for line in seen)  # it had begun: a 200 stream, then the error
    assert f"hf.co/{BAD_REPO}:Q8_0" not in [m.model for m in client.list().models]


@pytest.mark.slow
def test_a_crafted_file_is_never_installed_and_listing_goes_on(hub_server):
    """With the quant named, no header was read before the download: a file with
    general.alignment 0 was installed as verified, and every listing then answered 500."""
    server, _ = hub_server
    client = ollama.Client(host=server.url)
    name = f"hf.co/{CRAFTED_REPO}:Q4_K_M"
    with pytest.raises(ollama.ResponseError, match="not a usable GGUF file.*power of two"):
        list(client.pull(name, stream=True))
    assert name not in [m.model for m in client.list().models]  # the listing answers
    assert server.get("/localinfer/models").status_code == 200
    assert server.post("/api/show", json={"model": name}).status_code == 404


@pytest.fixture(scope="module")
def offline_server(tmp_path_factory):
    home = tmp_path_factory.mktemp("offline-home")
    srv = start_server(home, "--parallel", "1", "--ctx", "256",
                       env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(home / "hf")})
    yield srv, home
    stop_server(srv)


def test_a_hub_that_cannot_be_reached_is_a_502_that_says_so(offline_server):
    server, _ = offline_server
    response = server.post("/api/pull", json={"model": "hf.co/someone/x-GGUF:Q4_K_M"})
    assert response.status_code == 502, response.text
    assert "cannot reach" in response.json()["error"]


def test_pull_does_not_tell_whether_a_path_exists(offline_server):
    """The server runs in this directory: a name that is a file here must get the same answer
    as one that is not (it was 'is a local file')."""
    from pathlib import Path

    server, _ = offline_server
    assert Path("bench/results/gpu_h100.md").is_file()
    answers = [server.post("/api/pull", json={"model": name})
               for name in ("bench/results/gpu_h100.md", "bench/results/no_such.md")]
    assert [a.status_code for a in answers] == [404, 404]
    assert all("is a local file" not in a.text for a in answers)


def test_a_pull_onto_a_full_disk_is_a_507_that_says_what_to_do(hub_server, small_disk):
    _, hub = hub_server
    server = start_server(small_disk / "home", "--parallel", "1", "--ctx", "256",
                          env={"HF_ENDPOINT": hub.url, "HF_HOME": str(small_disk / "hf")})
    try:
        name = f"hf.co/{REPO}:Q4_1"
        response = server.post("/api/pull", json={"model": name, "stream": False})
        assert response.status_code == 507, response.text
        assert "free some space" in response.json()["error"]
        with pytest.raises(ollama.ResponseError) as raised:  # streamed: refused before a byte
            list(ollama.Client(host=server.url).pull(name, stream=True))
        assert raised.value.status_code == 507
        assert name not in [m.model for m in ollama.Client(host=server.url).list().models]
    finally:
        stop_server(server)


def _hang_up_once_bytes_flow(url: str, body: dict) -> None:
    with httpx.stream("POST", url + "/api/pull", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if json.loads(line).get("completed"):
                return  # leaving the block closes the connection


def _settled(file, quiet: float = 2.0, within: float = 15.0) -> int:
    """The bytes the hub sent of `file`, once they stop growing for `quiet` seconds."""
    deadline = time.monotonic() + within
    sent = file.sent
    while time.monotonic() < deadline:
        time.sleep(quiet)
        if file.sent == sent:
            return sent
        sent = file.sent
    raise AssertionError(f"the hub is still sending ({sent} of {file.size} bytes)")


@pytest.mark.slow
@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_cancels_its_pull(hub_server, quant_files, stream):
    """As Ollama's: the download stops (at its next 10 MiB chunk), nothing is installed, and
    nothing it left behind stands in the way of the next pull."""
    server, hub = hub_server
    repo = f"testorg/slow-{'stream' if stream else 'json'}-GGUF"
    file = hub.add(repo, "SmolLM2-135M-Instruct-Q4_1.gguf", quant_files["Q4_1"])
    file.rate = 4 * 2**20  # the whole file would take ~25 s
    name = f"hf.co/{repo}:Q4_1"
    if stream:
        _hang_up_once_bytes_flow(server.url, {"model": name})
    else:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up while bytes flow
            httpx.post(server.url + "/api/pull", json={"model": name, "stream": False},
                       timeout=4)
    sent = _settled(file)
    assert sent < file.size / 2
    assert name not in [m["model"] for m in server.get("/api/tags").json()["models"]]
    file.rate = None
    assert list(ollama.Client(host=server.url).pull(name, stream=True))[-1].status == "success"
    assert name in [m.model for m in ollama.Client(host=server.url).list().models]
    assert "Traceback" not in server.log.read_text()  # a cancel is not a server error
