"""The chat app driven with Textual's Pilot, on the real smollm2 model in-process."""

from __future__ import annotations

import asyncio
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest

from localinfer.backends.base import LoadOptions
from localinfer.settings import Settings
from localinfer.tui.chat_app import ChatApp
from localinfer.tui.client import LocalClient
from localinfer.tui.screens import ConversationList, ModelPicker, SettingsScreen
from localinfer.tui.conversations import ConversationStore
from localinfer.tui.widgets import MessageBox, PromptArea

GREEDY = {"system": "", "params": {"temperature": 0, "max_tokens": 12}}


async def wait_until(pilot, predicate: Callable[[], object], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {predicate.__doc__ or predicate}")
        await asyncio.sleep(0.02)  # not pilot.pause: it waits for a busy app to go idle


def make_app(home: Path, model: str = "smollm2:135m", n_ctx: int = 512) -> ChatApp:
    settings = Settings()
    client = LocalClient(settings, LoadOptions(n_ctx=n_ctx))
    return ChatApp(client, ConversationStore(home / "chats.db"), model, export_dir=home,
                   status_interval=0.2)


async def ask(app: ChatApp, pilot, text: str) -> None:
    await wait_until(pilot, app.model_ready.is_set)
    app.prompt.load_text(text)
    app.prompt.focus()
    before = len(app.history)
    await pilot.press("enter")
    await wait_until(pilot, lambda: len(app.history) == before + 2 and not app.replying)


def chat_prompt(backend, text: str) -> list[int]:
    """The tokens the chat app sends for one question with no system prompt."""
    return backend.tokenize(backend.apply_chat_template([{"role": "user", "content": text}]))


async def test_a_reply_streams_and_the_status_bar_fills(_private_home, smollm2,
                                                        smollm2_reference):
    app = make_app(_private_home)
    app.pending_settings = {"system": "", "params": {"temperature": 0, "max_tokens": 48}}
    question = "Write a long story about a lighthouse keeper."  # goes on past 48 tokens
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        assert "smollm2:135m" in app.status_bar.render() and "CPU" in app.status_bar.render()
        app.prompt.load_text(question)
        # the Enter key's own path is covered by the other tests; pilot.press would wait
        # for the app to go idle, which it is not while a reply streams
        app.prompt.post_message(PromptArea.Submitted(app.prompt.text))
        await wait_until(pilot, lambda: app.replying)
        assert app.prompt.text == ""  # the prompt is cleared at once
        seen: list[int] = []  # reply lengths observed while it was being written

        def grew() -> bool:
            boxes = app.query(MessageBox)
            if app.replying and len(boxes) == 2 and boxes.last().content:
                seen.append(len(boxes.last().content))
            return not app.replying and len(app.history) == 2
        await wait_until(pilot, grew)
        assert len(set(seen)) > 1, "the reply should appear piece by piece"
        reply = app.history[-1]
        figures = reply.figures
        assert reply.role == "assistant" and reply.content.strip()
        assert figures.generated_tokens == 48 and figures.finish_reason == "length"
        # the greedy reply, which on no CPU could have ended sooner (tests/greedy.py)
        assert smollm2_reference.follows(chat_prompt(smollm2, question), reply.content,
                                         "length", sure_length=True) > 30
        assert figures.ttft_s > 0 and figures.decode_tps > 0
        status = app.status_bar.render()
        assert f"TTFT {figures.ttft_s * 1000:,.0f} ms" in status
        assert f"{figures.decode_tps:.1f} tok/s" in status
        used = figures.prompt_tokens + figures.generated_tokens
        assert f"ctx {used}/512" in status
        await wait_until(pilot, lambda: "KV " in app.status_bar.render()
                         and "mem " in app.status_bar.render())
        # saved with its numbers
        stored = app.store.messages(app.conversation.id)
        assert [m.content for m in stored] == [question, reply.content]
        assert stored[1].figures == figures


async def test_escape_stops_the_reply_and_keeps_what_was_written(_private_home):
    app = make_app(_private_home)
    app.pending_settings = {"system": "", "params": {"temperature": 0, "max_tokens": 400}}
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        app.prompt.load_text("Write a long story about a lighthouse keeper.")
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.replying and len(app.query(MessageBox)) == 2
                         and len(app.query(MessageBox).last().content) > 20)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.replying, timeout=5)
        partial = app.history[-1]
        assert partial.role == "assistant" and len(partial.content) > 20
        assert partial.figures.finish_reason == "stopped"
        assert partial.figures.generated_tokens < 400
        # the engine's own figures, its prompt count among them, not the app's stopwatch
        assert partial.figures.prompt_tokens > 5 and partial.figures.ttft_s > 0
        assert app.store.messages(app.conversation.id)[-1].content == partial.content
        assert "stopped" in app.query(MessageBox).last().figures_label.render().plain
        backend = app.client.backend
        for _ in range(250):  # the runner's answers are read on this loop: ask from a thread
            if (await asyncio.to_thread(backend.stats)).active == 0:
                break  # the slot was freed
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the slot was not freed")


async def test_regenerate_edit_and_copy(_private_home, smollm2, smollm2_reference):
    app = make_app(_private_home)
    app.pending_settings = GREEDY
    async with app.run_test(size=(80, 24)) as pilot:
        await ask(app, pilot, "Say hello.")
        first = app.history[-1].content
        await pilot.press("ctrl+b")
        assert app.clipboard == first

        old = app.history[-1]
        await pilot.press("ctrl+r")  # greedy: the same reply again, replacing the old one
        await wait_until(pilot, lambda: app.history[-1] is not old and not app.replying)
        assert [m.role for m in app.history] == ["user", "assistant"]
        # the same greedy reply (up to near-ties: the prompt is cached the second time)
        prompt = chat_prompt(smollm2, "Say hello.")
        for reply in (old, app.history[-1]):
            assert smollm2_reference.follows(prompt, reply.content,
                                             reply.figures.finish_reason) > 4
        assert len(app.store.messages(app.conversation.id)) == 2

        await pilot.press("ctrl+l")  # edit: the question goes back into the prompt
        assert app.prompt.text == "Say hello." and app.history == []
        assert app.store.messages(app.conversation.id) == []
        assert len(app.query(MessageBox)) == 0


async def test_settings_screen_sets_the_system_prompt_and_parameters(_private_home):
    app = make_app(_private_home)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        screen = app.screen
        screen.query_one("#system").load_text("Answer in one word.")
        screen.query_one("#temperature").value = "0"
        screen.query_one("#max_tokens").value = "abc"
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SettingsScreen)  # a bad number is refused in place
        assert "not a number" in str(screen.query_one("#error").render())
        screen.query_one("#max_tokens").value = "5"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        await ask(app, pilot, "What colour is the sky?")
        saved = app.store.get(app.conversation.id)
        assert saved.system == "Answer in one word."
        assert saved.params == {"temperature": 0.0, "max_tokens": 5}
        assert app.history[-1].figures.generated_tokens <= 5


async def test_a_context_the_model_cannot_run_with_is_refused_in_settings(_private_home):
    app = make_app(_private_home)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        loaded = app.client.backend
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: isinstance(app.screen, SettingsScreen))
        screen = app.screen
        screen.query_one("#temperature").value = "7"
        await pilot.press("ctrl+s")
        assert "from 0.0 to 2.0" in str(screen.query_one("#error").render())
        screen.query_one("#temperature").value = "0.5"
        screen.query_one("#n_ctx").value = "99999999"
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: "context tokens:" in str(screen.query_one("#error")
                                                                 .render()))
        assert "trained" in str(screen.query_one("#error").render())  # the planner's reason
        assert app.screen is screen  # refused in place: nothing saved, nothing reloaded
        await pilot.press("escape")
        assert app.pending_settings["params"] == {}
        assert app.client.backend is loaded and app.model_ready.is_set()
        await ask(app, pilot, "Hi")  # the model loaded before is still in use


async def test_a_model_that_cannot_be_loaded_leaves_the_current_one_in_use(_private_home):
    app = make_app(_private_home)
    app.pending_settings = GREEDY
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        models = _private_home / "models"
        models.mkdir(parents=True, exist_ok=True)
        models.rename(_private_home / "models-aside")
        models.write_text("a file where the models folder should be")
        app.load_model("gemma3:270m")  # needs models/embedded to join its pieces into
        await wait_until(pilot, lambda: not app.loading and app._notifications)
        (note,) = list(app._notifications)
        assert "cannot use" in note.message and "still using smollm2:135m" in note.message
        assert "\n" not in note.message
        assert app.model_ready.is_set() and app.model_name == "smollm2:135m"
        assert app.status_bar.render().startswith("smollm2:135m")
        assert "loading" not in app.status_bar.render()
        await ask(app, pilot, "Hi")
        assert app.history[-1].content


async def test_a_reranker_chosen_to_chat_is_refused_and_the_chat_goes_on(_private_home):
    """A reranker writes no text (llama.cpp aborted its runner when asked to): choosing one
    says so in one line, before it loads, and the current model stays in use."""
    from ..families import reranker_model

    app = make_app(_private_home)
    app.pending_settings = GREEDY
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        app.load_model(str(reranker_model("bert")))
        await wait_until(pilot, lambda: not app.loading and app._notifications)
        (note,) = list(app._notifications)
        assert "is a reranker" in note.message and "/v1/rerank" in note.message
        assert "still using smollm2:135m" in note.message and "\n" not in note.message
        assert app.model_ready.is_set() and app.model_name == "smollm2:135m"
        await ask(app, pilot, "Hi")
        assert app.history[-1].content


async def test_a_full_disk_loses_no_message_and_no_reply(_private_home):
    app = make_app(_private_home)
    app.pending_settings = {"system": "", "params": {"temperature": 0, "max_tokens": 48}}
    async with app.run_test(size=(80, 24)) as pilot:
        await ask(app, pilot, "Hi")
        db = app.store.db
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full from here on
        question = "Please read this: " + "a long message that needs new pages " * 150
        app.prompt.load_text(question)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app._notifications)
        (note,) = list(app._notifications)
        assert "could not save the message" in note.message and "full" in note.message
        assert app.prompt.text == question and len(app.history) == 2  # as typed
        assert not app.replying
        db.execute("PRAGMA max_page_count = 1073741823")

        # a reply that cannot be saved stays on screen and in the chat
        app.prompt.load_text("Name a colour.")
        app.prompt.post_message(PromptArea.Submitted(app.prompt.text))  # not press: see above
        await wait_until(pilot, lambda: app.replying)
        db.execute("PRAGMA query_only = ON")  # a read-only file, this time
        await wait_until(pilot, lambda: not app.replying and len(app.history) == 4)
        reply = app.history[-1]
        assert reply.role == "assistant" and reply.content and reply.id is None
        assert app.query(MessageBox).last().content == reply.content
        # a notice is a message the app handles in its turn: wait for it, do not race it
        await wait_until(pilot, lambda: any("not saved" in n.message
                                            for n in app._notifications), timeout=10)
        db.execute("PRAGMA query_only = OFF")
        assert [m.role for m in app.store.messages(app.conversation.id)] == \
            ["user", "assistant", "user"]
        await ask(app, pilot, "Thanks")  # and the chat goes on
        assert len(app.store.messages(app.conversation.id)) == 5


async def test_conversations_survive_a_restart(_private_home):
    first = make_app(_private_home)
    first.pending_settings = GREEDY
    async with first.run_test(size=(80, 24)) as pilot:
        await ask(first, pilot, "What is 2 + 2?")
        saved = [(m.role, m.content) for m in first.history]

    second = make_app(_private_home)  # a new app on the same database
    async with second.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, second.model_ready.is_set)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(second.screen, ConversationList))
        await pilot.pause(0.1)
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(second.query(MessageBox)) == 2)
        assert [(m.role, m.content) for m in second.history] == saved
        assert [b.content for b in second.query(MessageBox)] == [c for _, c in saved]
        assert "TTFT" in second.status_bar.render()  # the last reply's numbers come back
        # and the conversation goes on from there
        await ask(second, pilot, "And 3 + 3?")
        assert len(second.store.messages(second.conversation.id)) == 4


async def test_switching_models_with_the_picker(_private_home):
    app = make_app(_private_home)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker)
                         and app.screen.rows)
        rows = {r.name: r for r in app.screen.rows}
        smollm2, gemma3 = rows["smollm2:135m"], rows["gemma3:270m"]
        assert smollm2.installed and smollm2.fit == "CPU" and smollm2.quant == "Q4_1"
        assert "runs on the CPU" in smollm2.detail
        # gemma3 ships in pieces joined on first use: no file to plan from yet
        assert gemma3.installed and gemma3.fit == "?" and "first use" in gemma3.detail
        assert rows["llama3.1:70b"].fit in ("~won't fit", "~CPU", "~partial")
        assert not rows["llama3.1:70b"].installed
        table = app.screen.query_one("DataTable")
        cells = "".join(str(cell) for key in table.rows for cell in table.get_row(key))
        assert "▸" in cells  # the model in use
        # one cell per character in every terminal, so rows line up under the header
        assert all(unicodedata.east_asian_width(c) in "NaH" for c in cells), cells
        table.move_cursor(row=[r.name for r in app.screen.rows].index("gemma3:270m"))
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.model_name == "gemma3:270m"
                         and app.model_ready.is_set())
        assert app.status_bar.render().startswith("gemma3:270m")
        await pilot.press("ctrl+t")  # now joined, it gets the planner's badge
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker) and app.screen.rows)
        gemma3 = next(r for r in app.screen.rows if r.name == "gemma3:270m")
        assert gemma3.fit == "CPU" and gemma3.quant == "Q4_K_M"
        await pilot.press("escape")
        assert app.client.backend.info.name == "gemma3:270m"


async def test_a_failed_reply_gives_the_question_back(_private_home):
    app = make_app(_private_home, n_ctx=64)
    app.pending_settings = GREEDY
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        question = "Please summarise this: " + "many words here " * 150
        app.prompt.load_text(question)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.prompt.text == question.strip())
        assert app.history == [] and len(app.query(MessageBox)) == 0
        assert app.store.messages(app.conversation.id) == []
        assert not app.replying
        assert any("context" in n.message for n in app._notifications)


async def test_a_damaged_database_is_reported_and_moved_aside(_private_home):
    _private_home.mkdir(parents=True, exist_ok=True)
    (_private_home / "chats.db").write_bytes(b"\x00garbage" * 512)
    app = make_app(_private_home)
    app.pending_settings = GREEDY
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: any("moved to" in n.message
                                            for n in app._notifications))
        assert list(_private_home.glob("chats.damaged-*.db"))
        await ask(app, pilot, "Hi")  # and the app works on the fresh database
        assert len(app.store.messages(app.conversation.id)) == 2


async def test_export_writes_markdown(_private_home):
    app = make_app(_private_home)
    app.pending_settings = GREEDY
    async with app.run_test(size=(80, 24)) as pilot:
        await ask(app, pilot, "Say hi.")
        path = app.export_conversation()
        again = app.export_conversation()
        assert path != again and path.parent == _private_home  # never overwritten
        text = path.read_text()
        assert text.startswith("# Say hi.") and app.history[-1].content in text
        assert "Model: `smollm2:135m`" in text


async def test_export_names_the_model_of_each_reply(_private_home):
    app = make_app(_private_home)
    app.pending_settings = GREEDY
    async with app.run_test(size=(80, 24)) as pilot:
        await ask(app, pilot, "Say hi.")
        app.load_model("gemma3:270m")
        await ask(app, pilot, "Say bye.")
        assert [m.model for m in app.history if m.role == "assistant"] == [
            "smollm2:135m", "gemma3:270m"]
        text = app.export_conversation().read_text()
        assert "Models: `smollm2:135m`, `gemma3:270m`" in text
        assert text.index("## Assistant (smollm2:135m)") < text.index("## Assistant (gemma3:270m)")


async def test_keys_help_theme_and_command_palette(_private_home):
    from textual.command import CommandPalette
    from textual.widgets import HelpPanel

    app = make_app(_private_home)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        await pilot.press("f1")
        assert app.screen.query(HelpPanel)
        await pilot.press("f1")
        await pilot.pause(0.1)
        assert not app.screen.query(HelpPanel)
        dark = app.current_theme.dark
        await pilot.press("f9")
        assert app.current_theme.dark is not dark
        await pilot.press("ctrl+p")
        await wait_until(pilot, lambda: isinstance(app.screen, CommandPalette))
        await pilot.press(*"Models")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker))


async def test_rename_export_and_delete_from_the_conversation_list(_private_home):
    from localinfer.tui.screens import ConfirmScreen, TextPrompt

    app = make_app(_private_home)
    app.pending_settings = GREEDY
    async with app.run_test(size=(80, 24)) as pilot:
        await ask(app, pilot, "First question")
        await pilot.press("ctrl+n")
        await ask(app, pilot, "Second question")
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, ConversationList))
        listing = app.screen
        assert [c.title for c in listing.items] == ["Second question", "First question"]
        await pilot.press("r")
        await wait_until(pilot, lambda: isinstance(app.screen, TextPrompt))
        await pilot.press(*["backspace"] * 20, *"Renamed", "enter")
        await wait_until(pilot, lambda: listing.items[0].title == "Renamed")
        assert app.store.get(listing.items[0].id).title == "Renamed"
        await pilot.press("x")
        exported = list(_private_home.glob("renamed*.md"))
        assert len(exported) == 1 and "Second question" in exported[0].read_text()
        await pilot.press("d")  # the open conversation: deleting it starts a new one
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_until(pilot, lambda: len(listing.items) == 1)
        assert [c.title for c in app.store.list()] == ["First question"]
        await wait_until(pilot, lambda: app.conversation is None and not app.history)
        await pilot.press("escape")
        assert not app.query(MessageBox)


def _installed_hub_model(home, quant_files):
    """An installed hub model, as a pull leaves it: the file and its manifest."""
    import json

    models = home / "models"
    target = models / "hub" / "testorg" / "repo" / "m-Q8_0.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(quant_files["Q8_0"].read_bytes())
    (models / "manifests").mkdir()
    (models / "manifests" / "testmodel.json").write_text(json.dumps({
        "name": "testmodel", "repo": "testorg/repo", "file": "m-Q8_0.gguf", "quant": "Q8_0",
        "sha256": "", "size": target.stat().st_size, "pulled_at": "2026-11-22T00:00:00+00:00",
        "source": "hub"}))
    return target


async def test_the_model_in_use_is_not_deleted(_private_home, quant_files):
    from localinfer.errors import LocalinferError

    target = _installed_hub_model(_private_home, quant_files)
    app = make_app(_private_home, model="testmodel")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        with pytest.raises(LocalinferError, match="in use"):
            await app.client.delete("testmodel")
        assert target.exists()


async def test_delete_from_the_picker(_private_home, quant_files):
    from localinfer.tui.screens import ConfirmScreen

    target = _installed_hub_model(_private_home, quant_files)
    app = make_app(_private_home)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: isinstance(app.screen, ModelPicker) and app.screen.rows)
        picker = app.screen
        names = [r.name for r in picker.rows]
        assert "testmodel" in names
        picker.query_one("DataTable").move_cursor(row=names.index("smollm2:135m"))
        await pilot.press("d", "y")  # in use and embedded: refused
        await wait_until(pilot, lambda: any("cannot be deleted" in n.message
                                            for n in app._notifications))
        picker.query_one("DataTable").move_cursor(row=names.index("testmodel"))
        await pilot.press("d")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_until(pilot, lambda: "testmodel" not in [r.name for r in picker.rows])
        assert not target.exists()


async def test_a_model_that_fails_to_load_keeps_the_message(_private_home):
    app = make_app(_private_home, model="no-such-model")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: not app.loading and app._notifications)
        assert "not found" in list(app._notifications)[0].message
        assert "no model" in app.status_bar.render()
        app.prompt.load_text("Hello?")
        await pilot.press("enter")
        assert app.prompt.text == "Hello?" and not app.replying and app.conversation is None
        assert any("Ctrl+T" in n.message for n in app._notifications)


async def test_a_runner_that_dies_mid_reply_is_one_notice_and_the_next_send_restarts_it(
        _private_home):
    import os
    import signal

    app = make_app(_private_home)
    app.pending_settings = {"system": "", "params": {"temperature": 0, "max_tokens": 400}}
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        runner = app.client.backend.pid
        question = "Write a long story about a lighthouse keeper."
        app.prompt.load_text(question)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.replying and len(app.query(MessageBox)) == 2
                         and len(app.query(MessageBox).last().content) > 20)
        os.kill(runner, signal.SIGKILL)  # as the kernel's OOM killer would
        await wait_until(pilot, lambda: not app.replying and app.prompt.text == question)
        assert [n.message for n in app._notifications if "SIGKILL" in n.message] == [
            "the runner of smollm2:135m ended (killed by SIGKILL) — send the request again "
            "to reload it"]
        await wait_until(pilot, lambda: len(app.query(MessageBox)) == 0)  # the question is back
        assert app.history == []
        app.pending_settings = GREEDY
        app.prompt.load_text("")
        await ask(app, pilot, "Hello!")
        assert app.history[-1].role == "assistant" and app.history[-1].content
        assert app.client.backend.pid != runner


async def test_a_thinking_models_reasoning_is_a_block_of_its_own_kept_with_the_reply(
        _private_home, monkeypatch):
    """A random-weight Qwen 3 (tests/families.py) made to think and answer by a grammar:
    the reasoning shows in a block of its own, folded once the answer comes, and is saved
    with the reply, apart from it."""
    import json

    from localinfer.backends.base import SamplingParams

    from ..families import family_model

    app = make_app(_private_home, model=str(family_model("Qwen-Qwen3-0.6B")))
    said = "<think>\nFirst, the plan.\n</think>\n\nThe answer."
    monkeypatch.setattr(app, "_sampling", lambda: SamplingParams(
        temperature=0, max_tokens=200, grammar=f"root ::= {json.dumps(said)}"))
    async with app.run_test(size=(80, 24)) as pilot:
        await ask(app, pilot, "Hi")
        box = app.query(MessageBox).last()
        assert (box.reasoning, box.content) == ("First, the plan.", "The answer.")
        assert box.thinking.display and box.thinking.collapsed
        assert box.figures.reasoning_tokens >= 3 and "reasoning" in box.figures.line()
        conversation = app.conversation.id
    (_, reply) = ConversationStore(_private_home / "chats.db").messages(conversation)
    assert (reply.content, reply.reasoning) == ("The answer.", "First, the plan.")
