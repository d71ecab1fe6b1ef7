"""Pictures in the chat app, driven with Textual's Pilot: Gemma 3 270M with a random-weight
Gemma 3 projector (every picture is 64 image tokens, as in tests/test_repl_images.py),
installed as a pulled model, and smollm2, which takes none. The replies are noise; what is
tested is that a picture attached by Ctrl+G and a path reaches the model (its tokens in the
reply's prompt count, the figures the app shows and saves), is shown as a chip before and
after it is sent, stays in the conversation for later turns, regenerate and edit, is kept in
the database so a reopened conversation sends it again after its file is gone, and is
refused with one line where it cannot go."""

from __future__ import annotations

import sqlite3

import pytest
from PIL import Image

from localinfer.tui.chat_app import ChatApp
from localinfer.tui.client import RemoteClient
from localinfer.tui.conversations import ConversationStore, StoredMessage
from localinfer.tui.pictures import KEEP_SIDE, attach
from localinfer.tui.screens import ConversationList, TextPrompt
from localinfer.tui.widgets import MessageBox, PictureChip

from ..api.conftest import start_server, stop_server
from ..families import install, projector
from .test_chat_app import ask, make_app, wait_until

IMAGE_TOKENS = 64
SHORT = {"system": "", "params": {"temperature": 0, "max_tokens": 3}}


@pytest.fixture
def vision(_private_home, gemma3_path):
    return install(_private_home, gemma3_path, "gemma3-vision",
                   projector(gemma3_path, IMAGE_TOKENS))


@pytest.fixture
def picture(tmp_path):
    path = tmp_path / "red square.png"  # a space: typed as it is into the path prompt
    Image.new("RGB", (320, 240), (200, 30, 30)).save(path)
    return path


async def attach_by_key(app: ChatApp, pilot, path, typed: bool = False) -> None:
    """Ctrl+G, the path into the prompt (`typed`: key by key, else pasted at once), Enter:
    wait until it is read (or refused)."""
    from textual.widgets import Input

    before = len(app.attached.pictures), len(app._notifications)
    await pilot.press("ctrl+g")
    await wait_until(pilot, lambda: isinstance(app.screen, TextPrompt))
    if typed:
        await pilot.press(*str(path))
    else:
        app.screen.query_one(Input).insert_text_at_cursor(str(path))
    await pilot.press("enter")
    await wait_until(pilot, lambda: not isinstance(app.screen, TextPrompt)
                     and (len(app.attached.pictures), len(app._notifications)) != before)


def chips(app: ChatApp) -> list[str]:
    return [str(chip.render()) for chip in app.query(PictureChip)]


def errors(app: ChatApp) -> list[str]:
    return [n.message for n in app._notifications if n.severity == "error"]


def prompt_tokens(app: ChatApp) -> tuple[int, int]:
    figures = app.history[-1].figures
    return figures.prompt_tokens, figures.cached_tokens


async def test_a_picture_goes_with_its_message_and_stays_in_the_conversation(
        vision, picture, _private_home):
    app = make_app(_private_home, vision)
    app.pending_settings = SHORT
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        assert app.status_bar.model.vision is True
        await ask(app, pilot, "What is this?")
        text_alone = prompt_tokens(app)[0]
        await pilot.press("ctrl+n")
        app.pending_settings = SHORT  # (a new chat starts on the defaults)

        await attach_by_key(app, pilot, picture, typed=True)
        assert chips(app) == ["🖼 red square.png 320×240 ✕"] and not errors(app)
        assert app.focused is app.prompt  # back to typing
        await ask(app, pilot, "What is this?")
        first = prompt_tokens(app)
        assert first[0] >= text_alone + IMAGE_TOKENS  # the picture's tokens, and its marks
        assert chips(app) == [] and not app.attached.display  # it went with the message
        question = app.query(MessageBox).first()
        assert str(question.pictures_label.render()) == "🖼 red square.png 320×240"
        assert question.pictures_label.display
        # the figures under the reply and in the status bar are the ones counted
        assert f"prompt {first[0]} " in str(app.query(MessageBox).last().figures_label.render())
        assert f"ctx {first[0] + app.history[-1].figures.generated_tokens}/512" in \
            app.status_bar.render()

        await ask(app, pilot, "And now?")  # no picture this turn: the first one stays
        second = prompt_tokens(app)
        assert second[0] > first[0] and second[1] >= IMAGE_TOKENS  # cached, not read again
        stored = app.store.messages(app.conversation.id)
        assert [len(m.pictures) for m in stored] == [1, 0, 0, 0]
        assert stored[0].pictures[0].image() == question.pictures[0].image()

        old = app.history[-1]
        await pilot.press("ctrl+r")  # the same history again: the picture with it
        await wait_until(pilot, lambda: app.history[-1] is not old and not app.replying)
        assert prompt_tokens(app)[0] == second[0]

        await pilot.press("ctrl+l")  # edit "And now?": a text turn, no picture comes back
        assert app.prompt.text == "And now?" and chips(app) == []
        app.prompt.clear()
        await pilot.press("ctrl+l")  # edit the first: its picture comes back with its text
        await wait_until(pilot, lambda: chips(app))
        assert app.prompt.text == "What is this?" and app.history == []
        assert chips(app) == ["🖼 red square.png 320×240 ✕"]
        assert app.store.messages(app.conversation.id) == []
        await ask(app, pilot, "What is this?")  # and it goes again, as it went before
        assert prompt_tokens(app)[0] == first[0]
        assert len(app.store.messages(app.conversation.id)[0].pictures) == 1


async def test_a_bad_path_or_a_file_that_is_no_picture_is_one_line_and_no_chip(
        vision, picture, tmp_path, _private_home):
    notes = tmp_path / "notes.png"
    notes.write_text("not a picture at all")
    big = tmp_path / "big.png"
    Image.new("RGB", (3000, 1500), (10, 120, 30)).save(big)
    app = make_app(_private_home, vision)
    app.pending_settings = SHORT
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        for path, said in ((tmp_path / "gone.png", "no file at"),
                           (notes, "not a picture"), (tmp_path, "is not a file")):
            app._notifications.clear()
            await attach_by_key(app, pilot, path)
            (line,) = errors(app)
            assert said in line and "\n" not in line and "Traceback" not in line
            assert chips(app) == [] and not app.attached.display
        app._notifications.clear()
        # a quoted path, and two at once (as a terminal pastes dropped files); a picture
        # over the kept size is kept at KEEP_SIDE on its longer side
        await attach_by_key(app, pilot, f"'{picture}' {big}")
        await wait_until(pilot, lambda: len(chips(app)) == 2)
        assert chips(app) == ["🖼 red square.png 320×240 ✕",
                              f"🖼 big.png {KEEP_SIDE}×{KEEP_SIDE // 2} ✕"]
        assert not errors(app)
        # a chip is taken off before sending: focus it, Delete
        app.query(PictureChip).first().focus()
        await pilot.press("delete")
        assert chips(app) == [f"🖼 big.png {KEEP_SIDE}×{KEEP_SIDE // 2} ✕"]
        assert app.focused is app.query(PictureChip).first()
        await pilot.press("backspace")
        assert chips(app) == [] and app.focused is app.prompt and not app.attached.display
        await ask(app, pilot, "What is this?")
        assert app.history[0].pictures == []


async def test_a_text_model_refuses_pictures_in_one_line(picture, _private_home):
    # a conversation with a picture in it, kept from a vision model's chat
    store = ConversationStore(_private_home / "chats.db")
    chat = store.create("smollm2:135m", "a picture")
    store.add(chat.id, StoredMessage("user", "What is this?", pictures=[attach(picture)]))
    store.add(chat.id, StoredMessage("assistant", "A red square."))
    store.close()
    app = make_app(_private_home)
    app.pending_settings = SHORT
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        assert app.status_bar.model.vision is False
        await pilot.press("ctrl+g")
        await wait_until(pilot, lambda: errors(app))
        (line,) = errors(app)
        assert "smollm2:135m takes no pictures" in line and "\n" not in line
        assert not isinstance(app.screen, TextPrompt) and chips(app) == []

        await app.open_conversation(chat.id)  # sending on in it would lose its picture
        app._notifications.clear()
        app.prompt.load_text("And now?")
        await pilot.press("enter")
        (line,) = errors(app)
        assert "This conversation has pictures and smollm2:135m takes none" in line
        assert app.prompt.text == "And now?" and len(app.history) == 2 and not app.replying
        assert len(app.store.messages(chat.id)) == 2
        await pilot.press("ctrl+r")
        assert len(errors(app)) == 2 and len(app.history) == 2 and not app.replying


async def test_a_reopened_conversation_sends_its_kept_pictures(vision, picture, _private_home):
    first = make_app(_private_home, vision)
    first.pending_settings = SHORT
    async with first.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, first.model_ready.is_set)
        await attach_by_key(first, pilot, picture)
        await ask(first, pilot, "What is this?")
        await ask(first, pilot, "And now?")
        with_picture = prompt_tokens(first)[0]
        kept = first.conversation.id
        # the same turns again, in a second conversation whose picture will not read
        await pilot.press("ctrl+n")
        first.pending_settings = SHORT  # (a new chat starts on the defaults)
        await attach_by_key(first, pilot, picture)
        await ask(first, pilot, "What is this?")
        damaged = first.conversation.id
    picture.unlink()  # the file it came from is gone: the conversation has its own copy
    with sqlite3.connect(_private_home / "chats.db") as db:
        db.execute("UPDATE pictures SET data = ? WHERE message_id IN (SELECT id FROM messages"
                   " WHERE conversation_id = ?)", (b"\x89PNG\r\n\x1a\n broken", damaged))

    again = make_app(_private_home, vision)
    async with again.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, again.model_ready.is_set)
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(again.screen, ConversationList))
        listing = again.screen
        listing.query_one("DataTable").move_cursor(
            row=[c.id for c in listing.items].index(kept))
        await pilot.pause(0.1)
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(again.query(MessageBox)) == 4)
        assert str(again.query(MessageBox).first().pictures_label.render()) == \
            "🖼 red square.png 320×240"
        assert not again._notifications
        await ask(again, pilot, "And now?")
        # the whole history, the picture in it: one more turn than the last reply's prompt
        assert prompt_tokens(again)[0] > with_picture

        await again.open_conversation(damaged)
        await wait_until(pilot, lambda: again._notifications)
        (note,) = list(again._notifications)
        assert "1 picture of this conversation could not be read (red square.png" in \
            note.message and "without it" in note.message and "\n" not in note.message
        assert str(again.query(MessageBox).first().pictures_label.render()) == \
            "🖼 red square.png — not available"
        await ask(again, pilot, "And now?")  # the chat goes on, without the picture
        assert prompt_tokens(again)[0] < with_picture - IMAGE_TOKENS // 2
        # kept as it was: it is not dropped from the database
        assert len(again.store.messages(damaged)[0].pictures) == 1


@pytest.fixture(scope="module")
def served_vision(tmp_path_factory, gemma3_path):
    home = tmp_path_factory.mktemp("tui-vision-serve")
    name = install(home, gemma3_path, "gemma3-vision", projector(gemma3_path, IMAGE_TOKENS))
    server = start_server(home, "--model", name, "--ctx", "512", ready_timeout=120)
    yield server, name
    stop_server(server)


@pytest.mark.slow
async def test_pictures_through_a_running_server(served_vision, picture, _private_home):
    server, name = served_vision
    app = ChatApp(RemoteClient(server.url), ConversationStore(_private_home / "chats.db"),
                  name, status_interval=0.2)
    app.pending_settings = SHORT
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, app.model_ready.is_set)
        assert app.status_bar.model.vision is True  # /api/show lists "vision"
        await ask(app, pilot, "What is this?")
        text_alone = prompt_tokens(app)[0]
        await pilot.press("ctrl+n")
        app.pending_settings = SHORT  # (a new chat starts on the defaults)
        await attach_by_key(app, pilot, picture)
        await ask(app, pilot, "What is this?")
        first = prompt_tokens(app)
        assert first[0] >= text_alone + IMAGE_TOKENS  # the server's own count
        await ask(app, pilot, "And now?")
        second = prompt_tokens(app)
        assert second[0] > first[0] and second[1] >= IMAGE_TOKENS

        app.load_model("smollm2:135m")  # a text model on the same server
        await wait_until(pilot, lambda: app.model_ready.is_set()
                         and app.status_bar.model.name == "smollm2:135m")
        assert app.status_bar.model.vision is False
        await pilot.press("ctrl+g")
        await wait_until(pilot, lambda: errors(app))
        assert "smollm2:135m takes no pictures" in errors(app)[0]
