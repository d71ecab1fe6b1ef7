"""The chat app as a client of a real `localinfer serve`, and pulling from the picker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from huggingface_hub import constants

from localinfer.backends.base import LoadOptions
from localinfer.settings import Settings
from localinfer.tui.chat_app import ChatApp
from localinfer.tui.client import LocalClient, RemoteClient
from localinfer.tui.screens import ModelPicker, TextPrompt
from localinfer.tui.conversations import ConversationStore

from ..api.conftest import start_server, stop_server
from ..fake_hub import FakeHub
from .test_chat_app import GREEDY, ask, chat_prompt, wait_until

REPO = "testorg/SmolLM2-135M-Instruct-GGUF"
STORY = "Write a long story about a lighthouse keeper."  # goes on past 12 tokens


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("tui-serve"), "--model", "smollm2:135m",
                          "--parallel", "2", "--ctx", "512")
    yield server
    stop_server(server)


@pytest.mark.slow
async def test_chat_through_a_running_server(served, _private_home, smollm2, smollm2_reference):
    app = ChatApp(RemoteClient(served.url), ConversationStore(_private_home / "chats.db"),
                  "smollm2", status_interval=0.2)
    app.pending_settings = GREEDY
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        assert app.sub_title == served.url
        assert app.model_name == "smollm2:135m"  # the server's name for it
        await ask(app, pilot, STORY)
        figures = app.history[-1].figures
        assert app.history[-1].content.strip()
        # the server's own measurements, carried in its `timings` field
        assert figures.generated_tokens == 12 and figures.ttft_s > 0
        assert figures.prompt_tokens > 0 and figures.finish_reason == "length"
        # the status polls every 0.2 s: a reading taken before the question may still show
        await wait_until(pilot, lambda: "KV " in app.status_bar.render() and (
            app.status_bar.model.kv_cells_used or 0) >= figures.prompt_tokens)
        status = app.status_bar.model
        assert status.n_ctx == 512 and status.kv_cells_total == 1024
        reply = served.post("/v1/chat/completions", json={
            "model": "smollm2:135m", "temperature": 0, "max_tokens": 12,
            "messages": [{"role": "user", "content": STORY}]}).json()
        # both the greedy reply, which on no CPU could have ended within its 12 tokens
        prompt = chat_prompt(smollm2, STORY)
        for text in (reply["choices"][0]["message"]["content"], app.history[-1].content):
            assert smollm2_reference.follows(prompt, text, "length", sure_length=True) > 6


@pytest.mark.slow
async def test_no_model_named_uses_the_one_the_server_has_loaded(served, _private_home):
    """`localinfer chat --url URL` (no model): it started on model "" and could not send."""
    app = ChatApp(RemoteClient(served.url), ConversationStore(_private_home / "chats.db"),
                  None, status_interval=0.2)
    app.pending_settings = GREEDY
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        assert app.model_name == "smollm2:135m"
        await ask(app, pilot, "Say hello.")
        assert app.history[-1].content.strip()


async def test_no_server_is_one_clear_notice(_private_home):
    app = ChatApp(RemoteClient("http://127.0.0.1:9"), ConversationStore(_private_home / "c.db"))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app._notifications)
        (note,) = list(app._notifications)
        assert "localinfer serve" in note.message and note.severity == "error"
        assert "no model" in app.status_bar.render()


@pytest.fixture
def hub(quant_files, monkeypatch):
    fake = FakeHub()
    fake.add(REPO, "SmolLM2-135M-Instruct-Q8_0.gguf", quant_files["Q8_0"])
    fake.start()
    # what HF_ENDPOINT sets when the hub library is imported (this process imported it already)
    monkeypatch.setattr(constants, "ENDPOINT", fake.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        fake.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setenv("HF_HOME", str(Path(Settings().home).parent / "hf"))
    yield fake
    fake.stop()


async def _pull_by_name(app, pilot, name: str) -> ModelPicker:
    """Open the picker, press p, type `name`: the pull starts; the picker is returned."""
    await wait_until(pilot, app.model_ready.is_set)
    await pilot.press("ctrl+t")
    await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker) and app.screen.rows)
    picker = app.screen
    await pilot.press("p")
    await wait_until(pilot, lambda: isinstance(app.screen, TextPrompt))
    await pilot.press(*name, "enter")
    return picker


async def test_pull_from_the_picker_with_progress(hub, _private_home):
    client = LocalClient(Settings(), LoadOptions(n_ctx=512))
    app = ChatApp(client, ConversationStore(_private_home / "chats.db"), "smollm2:135m")
    reports: list[tuple[int, int | None]] = []
    pull = client.pull

    async def recorded(name, progress):
        return await pull(name, lambda done, total: (reports.append((done, total)),
                                                     progress(done, total)))
    client.pull = recorded
    async with app.run_test(size=(100, 30)) as pilot:
        name = f"hf.co/{REPO}:Q8_0"
        picker = await _pull_by_name(app, pilot, name)
        await wait_until(pilot, lambda: any(r.name == name for r in picker.rows))
        size = hub.repos[REPO]["SmolLM2-135M-Instruct-Q8_0.gguf"].size
        assert reports[-1] == (size, size)  # the bar saw every byte
        assert [d for d, _ in reports] == sorted(d for d, _ in reports)
        row = next(r for r in picker.rows if r.name == name)
        assert row.installed and row.quant == "Q8_0" and row.fit == "CPU"
        picker.query_one("DataTable").move_cursor(row=picker.rows.index(row))
        await pilot.press("enter")  # and use it
        await wait_until(pilot, lambda: app.model_name == name and app.model_ready.is_set())
        assert "Q8_0" in app.status_bar.render()


@pytest.mark.slow
async def test_the_servers_own_error_reaches_the_user(served, _private_home):
    app = ChatApp(RemoteClient(served.url), ConversationStore(_private_home / "chats.db"),
                  "no-such-model")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: not app.loading and app._notifications)
        (note,) = list(app._notifications)
        assert "no-such-model" in note.message and "not found" in note.message
        assert note.severity == "error" and not app.model_ready.is_set()


async def test_a_pull_that_fails_says_so_in_the_picker(_private_home, monkeypatch):
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    monkeypatch.setenv("HF_HOME", str(_private_home.parent / "hf"))
    app = ChatApp(LocalClient(Settings(), LoadOptions(n_ctx=512)),
                  ConversationStore(_private_home / "chats.db"), "smollm2:135m")
    async with app.run_test(size=(100, 30)) as pilot:
        picker = await _pull_by_name(app, pilot, f"hf.co/{REPO}:Q8_0")
        detail = picker.query_one("#detail")
        await wait_until(pilot, lambda: "was not pulled" in str(detail.render()), timeout=60)
        assert "pulling" not in str(detail.render())
        assert not picker.query_one("#progress").display


async def test_a_file_llama_cpp_refuses_after_planning_brings_the_old_model_back(
        smollm2_path, tmp_path):
    """The planner reads only the header; a tensor that does not match it is found by
    llama.cpp after the current model was closed: that model is loaded again."""
    import struct

    from localinfer.backends.base import SamplingParams
    from localinfer.errors import ModelLoadFailed

    data = bytearray(smollm2_path.read_bytes())
    key = b"llama.embedding_length"
    at = data.index(key) + len(key) + 4  # past the key and its value's type (uint32)
    (width,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<I", data, at, width - 64)  # the embedding tensor no longer fits
    bad = tmp_path / "wrong-shape.gguf"
    bad.write_bytes(data)

    client = LocalClient(Settings(), LoadOptions(n_ctx=256))
    await client.load("smollm2:135m")
    first = client.backend
    with pytest.raises(ModelLoadFailed):
        await client.load(str(bad))
    assert client.backend is not None and client.backend is not first  # loaded again
    assert client.backend.info.name == "smollm2:135m"
    backend = client.backend  # (its replies are read on this loop: asked from a thread)
    reply = await asyncio.to_thread(backend.generate, "Hi", SamplingParams(max_tokens=4))
    assert await asyncio.to_thread(reply.text)
    await client.close()
