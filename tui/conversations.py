"""Saved conversations: one SQLite file under the user data dir.

Pictures sent with a message are kept with it, in the `pictures` table: the file the model
was shown (tui/pictures.py: at most 1,024 pixels a side, PNG, or JPEG for a photo), so a
reopened conversation sends the same pictures again, whatever became of the files they came
from. They go with their message (edit, regenerate) and their conversation.

A file that is not a readable database is never deleted and never half-used: it is moved
aside under a dated name, a fresh database takes its place, and `notice` says where the old
one went so the app can tell the user. A write that fails (a full disk, a read-only file)
raises `SaveFailed` with one line to show; the app keeps what it has in memory.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from localinfer.backends.metrics import Figures
from localinfer.errors import LocalinferError
from localinfer.tui.pictures import Picture

__all__ = ["Conversation", "ConversationStore", "SaveFailed", "StoredMessage", "to_markdown"]

# The file's schema version is SQLite's user_version; each step brings a file from the
# version before it to its own, in one transaction. Append steps; never edit one.
_MIGRATIONS = [
    """
    CREATE TABLE IF NOT EXISTS conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        model TEXT NOT NULL,
        system TEXT NOT NULL DEFAULT '',
        params TEXT NOT NULL DEFAULT '{}',
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
        content TEXT NOT NULL,
        figures TEXT,
        created_at TEXT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
    """,
    # 2: each reply names the model that wrote it
    "ALTER TABLE messages ADD COLUMN model TEXT;",
    # 3: a thinking model's reasoning, kept apart from its answer
    "ALTER TABLE messages ADD COLUMN reasoning TEXT;",
    # 4: pictures sent with a message, as the model was shown them, in their order
    """
    CREATE TABLE IF NOT EXISTS pictures (
        id INTEGER PRIMARY KEY,
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        width INTEGER NOT NULL,
        height INTEGER NOT NULL,
        data BLOB NOT NULL
    );
    CREATE INDEX IF NOT EXISTS pictures_by_message ON pictures(message_id, id);
    """,
]
VERSION = len(_MIGRATIONS)


class _TooNew(sqlite3.DatabaseError):
    """A file written by a newer localinfer: kept as it is, not moved aside."""


def _version(db: sqlite3.Connection) -> int:
    """The file's schema version; a file from before versions counts by its columns."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:
        columns = {row[1] for row in db.execute("PRAGMA table_info(messages)")}
        version = 0 if not columns else 2 if "model" in columns else 1
    return version


def _migrate(db: sqlite3.Connection) -> None:
    version = _version(db)
    if version > VERSION:
        raise _TooNew(f"it was written by a newer localinfer (schema {version}; this one "
                      f"knows {VERSION}) — update localinfer to open it")
    for number, step in enumerate(_MIGRATIONS[version:], start=version + 1):
        with db:  # (executescript commits what came before; each step is whole or absent)
            db.executescript(f"BEGIN; {step} PRAGMA user_version = {number}; COMMIT;")
    if db.execute("PRAGMA user_version").fetchone()[0] != VERSION:
        with db:
            db.execute(f"PRAGMA user_version = {VERSION}")


class SaveFailed(LocalinferError):
    """A conversation could not be written (a full disk, a read-only file)."""


@contextmanager
def _saving(what: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise SaveFailed(f"could not save {what}: {exc} — free some disk space or check "
                         f"LOCALINFER_HOME") from None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class StoredMessage:
    role: str
    content: str
    figures: Figures | None = None  # the reply's measured numbers
    id: int | None = None
    model: str | None = None  # the model that wrote a reply
    reasoning: str = ""  # what a thinking model thought before its answer
    pictures: list[Picture] = field(default_factory=list)  # sent with a user's message


@dataclass
class Conversation:
    id: int
    title: str
    model: str
    system: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    updated_at: str = ""


class ConversationStore:
    def __init__(self, path: Path):
        self.path = path
        self.notice: str | None = None  # what the app should tell the user about its file
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.db = self._open(path)
            except _TooNew:
                raise  # not damaged: left as it is for the localinfer that wrote it
            except sqlite3.DatabaseError as exc:
                aside = self._move_aside()
                self.notice = (f"The saved conversations could not be read ({exc}); the file "
                               f"was moved to {aside} and a new one started.")
                self.db = self._open(path)
        except (OSError, sqlite3.DatabaseError) as exc:  # no place to keep them at all
            self.notice = (f"Conversations cannot be saved to {path} ({exc}); this session's "
                           f"chats will be lost when the app closes.")
            self.db = self._open(":memory:")

    @staticmethod
    def _open(path: Path | str) -> sqlite3.Connection:
        db = sqlite3.connect(path, check_same_thread=False)
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA foreign_keys = ON")
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {check}")
            _migrate(db)
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.stem}.damaged-{stamp}{self.path.suffix}")
        os.replace(self.path, aside)
        for suffix in ("-wal", "-shm", "-journal"):  # its journal belongs with it
            extra = self.path.with_name(self.path.name + suffix)
            if extra.exists():
                os.replace(extra, aside.with_name(aside.name + suffix))
        return aside

    def close(self) -> None:
        self.db.close()

    # ---------------------------------------------------------------- conversations
    def create(self, model: str, title: str = "New chat", system: str = "",
               params: dict[str, Any] | None = None) -> Conversation:
        now = _now()
        with _saving("the new conversation"), self.db:
            cur = self.db.execute(
                "INSERT INTO conversations (title, model, system, params, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?)", (title, model, system, json.dumps(params or {}), now,
                                               now))
        return Conversation(cur.lastrowid, title, model, system, dict(params or {}), now)

    def list(self) -> list[Conversation]:
        rows = self.db.execute("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC")
        return [self._conversation(r) for r in rows]

    def get(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute("SELECT * FROM conversations WHERE id = ?",
                              (conversation_id,)).fetchone()
        return self._conversation(row) if row else None

    @staticmethod
    def _conversation(row: sqlite3.Row) -> Conversation:
        try:
            params = json.loads(row["params"])
        except ValueError:
            params = {}
        return Conversation(row["id"], row["title"], row["model"], row["system"],
                            params if isinstance(params, dict) else {}, row["updated_at"])

    def update(self, conversation: Conversation) -> None:
        conversation.updated_at = _now()
        with _saving("the conversation's changes"), self.db:
            self.db.execute(
                "UPDATE conversations SET title = ?, model = ?, system = ?, params = ?,"
                " updated_at = ? WHERE id = ?",
                (conversation.title, conversation.model, conversation.system,
                 json.dumps(conversation.params), conversation.updated_at, conversation.id))

    def delete(self, conversation_id: int) -> None:
        with _saving("the deletion"), self.db:
            self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # ---------------------------------------------------------------- messages
    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self.db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id",
                               (conversation_id,))
        pictures: dict[int, list[Picture]] = {}
        for p in self.db.execute(
                "SELECT pictures.* FROM pictures JOIN messages ON messages.id = message_id"
                " WHERE conversation_id = ? ORDER BY pictures.id", (conversation_id,)):
            pictures.setdefault(p["message_id"], []).append(
                Picture(p["name"], p["width"], p["height"], bytes(p["data"])))
        return [StoredMessage(r["role"], r["content"],
                              Figures.from_dict(json.loads(r["figures"])) if r["figures"] else None, r["id"],
                              r["model"], r["reasoning"] or "", pictures.get(r["id"], []))
                for r in rows]

    def add(self, conversation_id: int, message: StoredMessage) -> StoredMessage:
        now = _now()
        with _saving(f"the {'reply' if message.role == 'assistant' else 'message'}"), self.db:
            cur = self.db.execute(
                "INSERT INTO messages (conversation_id, role, content, figures, created_at,"
                " model, reasoning) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, message.role, message.content,
                 json.dumps(message.figures.to_dict()) if message.figures else None, now,
                 message.model, message.reasoning or None))
            self.db.executemany(
                "INSERT INTO pictures (message_id, name, width, height, data)"
                " VALUES (?, ?, ?, ?, ?)",
                [(cur.lastrowid, p.name, p.width, p.height, p.data) for p in message.pictures])
            self.db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?",
                            (now, conversation_id))
        message.id = cur.lastrowid
        return message

    def delete_from(self, conversation_id: int, message_id: int) -> None:
        """Forget this message and every later one (edit and regenerate rewrite the tail)."""
        with _saving("the change"), self.db:
            self.db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                            (conversation_id, message_id))


def to_markdown(conversation: Conversation, messages: list[StoredMessage]) -> str:
    """The conversation as Markdown; each reply names the model that wrote it when more than
    one did."""
    writers = list(dict.fromkeys(m.model or conversation.model for m in messages
                                 if m.role == "assistant")) or [conversation.model]
    models = ", ".join(f"`{m}`" for m in writers)
    lines = [f"# {conversation.title}", "", f"Model{'s' if len(writers) > 1 else ''}: {models}"]
    if conversation.system:
        lines += ["", "**System:**", "", conversation.system]
    for message in messages:
        heading = "You" if message.role == "user" else "Assistant"
        if message.role == "assistant" and len(writers) > 1:
            heading += f" ({message.model or conversation.model})"
        lines += ["", f"## {heading}", ""]
        lines += [f"*Picture: {p.name} ({p.width}×{p.height})*" for p in message.pictures]
        lines += [""] if message.pictures else []
        lines.append(message.content)
    return "\n".join(lines) + "\n"
