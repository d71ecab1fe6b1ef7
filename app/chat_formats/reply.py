"""What a reply is made of, as the parser gives it out: `Piece`s (content, reasoning, a
call's name, its arguments in fragments, its end), and `Reply`, a whole reply gathered
from them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Piece", "Reply", "arguments_object"]


@dataclass(frozen=True)
class Piece:
    """What a reply says next: `content` or `reasoning` text, a `call` (its index, id and
    name), a fragment of a call's `arguments` (JSON text; a call's fragments joined are
    its arguments), or `done`: that call's arguments are complete."""

    kind: str
    text: str = ""
    index: int = 0
    id: str = ""
    name: str = ""


@dataclass
class Reply:
    """A whole reply, gathered from its Pieces."""

    content: str = ""
    reasoning: str = ""
    calls: list[dict[str, str]] = field(default_factory=list)  # id, name, arguments (JSON)
    pieces: list[Piece] = field(default_factory=list)  # all of them, in the reply's order

    def add(self, piece: Piece) -> None:
        self.pieces.append(piece)
        if piece.kind == "content":
            self.content += piece.text
        elif piece.kind == "reasoning":
            self.reasoning += piece.text
        elif piece.kind == "call":
            self.calls.append({"id": piece.id, "name": piece.name, "arguments": ""})
        elif piece.kind == "arguments":
            self.calls[piece.index]["arguments"] += piece.text

    @classmethod
    def of(cls, pieces: Sequence[Piece]) -> Reply:
        reply = cls()
        for piece in pieces:
            reply.add(piece)
        return reply


def arguments_object(text: str) -> dict[str, Any]:
    """A call's arguments as an object (Ollama's shape); {} when a reply ended inside them."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
