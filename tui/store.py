"""Saved conversations: one SQLite file under the user data dir.

A file that is not a readable database is never deleted and never half-used: it is moved
aside under a dated name, a fresh database takes its place, and `notice` says where the old
one went so the app can tell the user.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["Conversation", "ConversationStore", "StoredMessage", "to_markdown"]

_SCHEMA = """
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
"""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class StoredMessage:
    role: str
    content: str
    figures: dict[str, Any] | None = None  # the reply's measured numbers (see tui/figures.py)
    id: int | None = None


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
            with db:
                db.executescript(_SCHEMA)
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
        with self.db:
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
        with self.db:
            self.db.execute(
                "UPDATE conversations SET title = ?, model = ?, system = ?, params = ?,"
                " updated_at = ? WHERE id = ?",
                (conversation.title, conversation.model, conversation.system,
                 json.dumps(conversation.params), conversation.updated_at, conversation.id))

    def delete(self, conversation_id: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # ---------------------------------------------------------------- messages
    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self.db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id",
                               (conversation_id,))
        return [StoredMessage(r["role"], r["content"],
                              json.loads(r["figures"]) if r["figures"] else None, r["id"])
                for r in rows]

    def add(self, conversation_id: int, message: StoredMessage) -> StoredMessage:
        now = _now()
        with self.db:
            cur = self.db.execute(
                "INSERT INTO messages (conversation_id, role, content, figures, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (conversation_id, message.role, message.content,
                 json.dumps(message.figures) if message.figures else None, now))
            self.db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?",
                            (now, conversation_id))
        message.id = cur.lastrowid
        return message

    def delete_from(self, conversation_id: int, message_id: int) -> None:
        """Forget this message and every later one (edit and regenerate rewrite the tail)."""
        with self.db:
            self.db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                            (conversation_id, message_id))


def to_markdown(conversation: Conversation, messages: list[StoredMessage]) -> str:
    lines = [f"# {conversation.title}", "", f"Model: `{conversation.model}`"]
    if conversation.system:
        lines += ["", "**System:**", "", conversation.system]
    for message in messages:
        lines += ["", f"## {'You' if message.role == 'user' else 'Assistant'}", "",
                  message.content]
    return "\n".join(lines) + "\n"
