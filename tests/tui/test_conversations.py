"""Saved conversations: they persist, and a damaged file is moved aside, never lost."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from localinfer.backends.metrics import Figures
from localinfer.tui.conversations import VERSION, ConversationStore, StoredMessage, to_markdown


def test_conversations_survive_reopening(tmp_path: Path):
    path = tmp_path / "chats.db"
    store = ConversationStore(path)
    chat = store.create("smollm2:135m", "Capitals", system="Be brief.",
                        params={"temperature": 0.2, "n_ctx": 2048})
    store.add(chat.id, StoredMessage("user", "Capital of France?"))
    store.add(chat.id, StoredMessage("assistant", "Paris.", Figures(ttft_s=0.1, decode_tps=50.0,
                                                                 context_shifts=1)))
    store.close()

    again = ConversationStore(path)
    assert again.notice is None
    (listed,) = again.list()
    assert (listed.title, listed.model, listed.system, listed.params) == (
        "Capitals", "smollm2:135m", "Be brief.", {"temperature": 0.2, "n_ctx": 2048})
    messages = again.messages(listed.id)
    assert [(m.role, m.content) for m in messages] == [("user", "Capital of France?"),
                                                       ("assistant", "Paris.")]
    assert messages[1].figures == Figures(ttft_s=0.1, decode_tps=50.0, context_shifts=1)


def test_rename_delete_and_rewrite_the_tail(tmp_path: Path):
    store = ConversationStore(tmp_path / "chats.db")
    a, b = store.create("m", "first"), store.create("m", "second")
    ids = [store.add(a.id, StoredMessage(role, text)).id
           for role, text in (("user", "q1"), ("assistant", "a1"), ("user", "q2"),
                              ("assistant", "a2"))]
    store.delete_from(a.id, ids[2])  # editing q2 drops it and its answer
    assert [m.content for m in store.messages(a.id)] == ["q1", "a1"]
    a.title = "renamed"
    store.update(a)
    assert store.get(a.id).title == "renamed"
    store.delete(b.id)
    assert [c.id for c in store.list()] == [a.id]
    store.delete(a.id)
    assert store.messages(a.id) == []  # the messages went with it


def test_a_file_that_is_not_a_database_is_moved_aside(tmp_path: Path):
    path = tmp_path / "chats.db"
    path.write_bytes(b"this is not sqlite " * 100)
    neighbour = tmp_path / "models" / "keep.txt"
    neighbour.parent.mkdir()
    neighbour.write_text("untouched")

    store = ConversationStore(path)
    assert store.notice and "moved to" in store.notice
    (aside,) = tmp_path.glob("chats.damaged-*.db")
    assert aside.read_bytes() == b"this is not sqlite " * 100  # kept byte for byte
    assert neighbour.read_text() == "untouched"
    chat = store.create("m", "fresh start")  # the new database works
    assert store.list()[0].id == chat.id


def test_a_truncated_database_is_moved_aside(tmp_path: Path):
    path = tmp_path / "chats.db"
    store = ConversationStore(path)
    chat = store.create("m", "long")
    for i in range(400):
        store.add(chat.id, StoredMessage("user", f"message {i} " + "x" * 200))
    store.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])

    damaged = ConversationStore(path)
    assert damaged.notice is not None
    assert damaged.list() == []
    assert len(list(tmp_path.glob("chats.damaged-*.db"))) == 1


def test_a_database_from_elsewhere_keeps_its_tables(tmp_path: Path):
    """A valid SQLite file with other tables is not ours to move: we add ours beside them."""
    path = tmp_path / "chats.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
        db.execute("INSERT INTO notes VALUES ('keep me')")
    store = ConversationStore(path)
    assert store.notice is None
    assert store.db.execute("SELECT text FROM notes").fetchone()[0] == "keep me"


def test_markdown_export():
    from localinfer.tui.conversations import Conversation

    text = to_markdown(Conversation(1, "Capitals", "smollm2:135m", "Be brief."),
                       [StoredMessage("user", "Capital of France?"),
                        StoredMessage("assistant", "**Paris**.")])
    assert text.startswith("# Capitals\n")
    assert "**System:**\n\nBe brief." in text
    assert text.index("## You\n\nCapital of France?") < text.index("## Assistant\n\n**Paris**.")


def test_no_place_to_save_still_starts_and_says_so(tmp_path: Path):
    blocker = tmp_path / "home"
    blocker.write_text("a file where the data folder should be")
    store = ConversationStore(blocker / "chats.db")
    assert store.notice and "cannot be saved" in store.notice
    chat = store.create("m", "kept in memory")  # the session still works
    store.add(chat.id, StoredMessage("user", "hi"))
    assert [m.content for m in store.messages(chat.id)] == ["hi"]
    assert blocker.read_text() == "a file where the data folder should be"


def test_a_file_from_before_replies_named_their_model_is_brought_up_to_date(tmp_path: Path):
    path = tmp_path / "chats.db"
    with sqlite3.connect(path) as db:  # the schema as it was, with one chat in it
        db.executescript("""
            CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL,
                model TEXT NOT NULL, system TEXT NOT NULL DEFAULT '',
                params TEXT NOT NULL DEFAULT '{}', created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL);
            CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL,
                role TEXT NOT NULL, content TEXT NOT NULL, figures TEXT,
                created_at TEXT NOT NULL);
            INSERT INTO conversations VALUES (1, 'old', 'smollm2:135m', '', '{}', 'x', 'x');
            INSERT INTO messages VALUES (1, 1, 'assistant', 'Paris.', NULL, 'x');
        """)
    store = ConversationStore(path)
    assert store.notice is None
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == VERSION
    (old,) = store.messages(1)
    assert old.content == "Paris." and old.model is None
    store.add(1, StoredMessage("assistant", "Rome.", model="gemma3:270m"))
    assert [m.model for m in store.messages(1)] == [None, "gemma3:270m"]
    text = to_markdown(store.get(1), store.messages(1))  # an unnamed reply: the chat's model
    assert "## Assistant (smollm2:135m)\n\nParis." in text
    assert "## Assistant (gemma3:270m)\n\nRome." in text


def test_a_write_that_fails_is_one_clear_error(tmp_path: Path):
    import pytest

    from localinfer.tui.conversations import SaveFailed

    store = ConversationStore(tmp_path / "chats.db")
    chat = store.create("m", "t")
    store.db.execute("PRAGMA query_only = ON")
    with pytest.raises(SaveFailed, match="could not save the message: .*readonly"):
        store.add(chat.id, StoredMessage("user", "hi"))
    with pytest.raises(SaveFailed, match="could not save the conversation's changes"):
        store.update(chat)


def test_a_new_file_has_the_latest_schema_and_reopens_without_a_step(tmp_path: Path):
    path = tmp_path / "chats.db"
    store = ConversationStore(path)
    chat = store.create("smollm2:135m", "kept")
    store.add(chat.id, StoredMessage("assistant", "Paris.", model="smollm2:135m"))
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == VERSION == 4
    store.db.close()
    again = ConversationStore(path)
    assert [m.model for m in again.messages(chat.id)] == ["smollm2:135m"]


def test_a_file_from_a_newer_localinfer_is_left_as_it_is(tmp_path: Path):
    """Moved aside, it would vanish from the newer localinfer that wrote it."""
    path = tmp_path / "chats.db"
    ConversationStore(path).db.close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {VERSION + 1}")
    before = path.read_bytes()
    store = ConversationStore(path)
    assert store.notice and "newer localinfer" in store.notice
    chat = store.create("m", "this session only")  # kept in memory
    store.add(chat.id, StoredMessage("user", "hi"))
    assert path.read_bytes() == before and not list(tmp_path.glob("*damaged*"))


def test_a_file_of_the_latest_shape_from_before_versions_gets_its_number_and_no_step(
        tmp_path: Path):
    """Files written before the versions existed already had the model column: no step may
    run on them again (adding the column twice fails), only the number is written."""
    path = tmp_path / "chats.db"
    with sqlite3.connect(path) as db:
        db.executescript("""
            CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL,
                model TEXT NOT NULL, system TEXT NOT NULL DEFAULT '',
                params TEXT NOT NULL DEFAULT '{}', created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL);
            CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL,
                role TEXT NOT NULL, content TEXT NOT NULL, figures TEXT,
                created_at TEXT NOT NULL, model TEXT);
            INSERT INTO conversations VALUES (1, 'kept', 'smollm2:135m', '', '{}', 'x', 'x');
            INSERT INTO messages VALUES (1, 1, 'assistant', 'Paris.', NULL, 'x', 'gemma3:270m');
        """)
    store = ConversationStore(path)
    assert store.notice is None
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == VERSION
    assert [m.model for m in store.messages(1)] == ["gemma3:270m"]


def _picture(name: str, colour: tuple[int, int, int], tmp_path: Path):
    from PIL import Image

    from localinfer.tui.pictures import attach

    path = tmp_path / name
    Image.new("RGB", (64, 48), colour).save(path)
    return attach(path)


def test_pictures_are_kept_with_their_message_and_go_with_it(tmp_path: Path):
    path = tmp_path / "chats.db"
    store = ConversationStore(path)
    chat = store.create("gemma3-vision", "Pictures")
    red, blue = _picture("red.png", (200, 30, 30), tmp_path), _picture("blue.jpg", (0, 0, 200),
                                                                       tmp_path)
    asked = store.add(chat.id, StoredMessage("user", "Which is red?", pictures=[red, blue]))
    store.add(chat.id, StoredMessage("assistant", "The first."))
    store.add(chat.id, StoredMessage("user", "Sure?"))
    store.close()

    again = ConversationStore(path)
    first, _, last = again.messages(chat.id)
    assert [(p.name, p.width, p.height) for p in first.pictures] == [
        ("red.png", 64, 48), ("blue.jpg", 64, 48)]  # in their order
    assert [p.image() for p in first.pictures] == [red.image(), blue.image()]
    assert last.pictures == []
    text = to_markdown(again.get(chat.id), again.messages(chat.id))
    assert "## You\n\n*Picture: red.png (64×48)*\n*Picture: blue.jpg (64×48)*\n\nWhich is red?" \
        in text
    again.delete_from(chat.id, asked.id)  # an edit takes the message's pictures with it
    assert again.db.execute("SELECT COUNT(*) FROM pictures").fetchone()[0] == 0
    again.add(chat.id, StoredMessage("user", "Again", pictures=[red]))
    again.delete(chat.id)  # and so does deleting the conversation
    assert again.db.execute("SELECT COUNT(*) FROM pictures").fetchone()[0] == 0


def test_a_file_from_before_pictures_opens_and_keeps_them_from_then_on(tmp_path: Path):
    path = tmp_path / "chats.db"
    store = ConversationStore(path)
    chat = store.create("smollm2:135m", "old")
    store.add(chat.id, StoredMessage("user", "Hi", model=None))
    store.add(chat.id, StoredMessage("assistant", "Hello.", reasoning="greet"))
    with store.db:  # the file as version 3 left it
        store.db.executescript("DROP TABLE pictures; PRAGMA user_version = 3;")
    store.close()

    again = ConversationStore(path)
    assert again.notice is None
    assert again.db.execute("PRAGMA user_version").fetchone()[0] == VERSION
    assert [(m.content, m.reasoning, m.pictures) for m in again.messages(chat.id)] == [
        ("Hi", "", []), ("Hello.", "greet", [])]
    again.add(chat.id, StoredMessage("user", "This?",
                                     pictures=[_picture("red.png", (200, 30, 30), tmp_path)]))
    assert [len(m.pictures) for m in again.messages(chat.id)] == [0, 0, 1]
