"""Pull and delete through the Ollama API, from a fake hub over real HTTP."""

from __future__ import annotations

import ollama
import pytest

from ..fake_hub import FakeHub
from .conftest import start_server, stop_server

REPO = "testorg/SmolLM2-135M-Instruct-GGUF"


@pytest.fixture(scope="module")
def hub_server(quant_files, tmp_path_factory):
    hub = FakeHub()
    for label, path in quant_files.items():
        hub.add(REPO, f"SmolLM2-135M-Instruct-{label}.gguf", path)
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
    statuses = [p.status for p in client.pull(name, stream=True)]
    assert statuses[-1] == "success" and any("sha256 verified" in s for s in statuses)
    assert name in [m.model for m in client.list().models]
    reply = client.chat(model=name, messages=[{"role": "user", "content": "Hi"}],
                        options={"num_predict": 3})
    assert reply.eval_count == 3
    client.delete(name)
    assert name not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model=name, messages=[{"role": "user", "content": "Hi"}])
    assert err.value.status_code == 404 and "pull" in str(err.value)
    with pytest.raises(ollama.ResponseError) as err:
        client.pull(f"hf.co/{REPO}:Q3_K_M")
    assert "Q4_1" in str(err.value)
