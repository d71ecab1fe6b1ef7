"""What the chat formats ask of a loaded model, as protocols (backends' `Backend` meets
them; the chat formats sit below the backends and import none of them): `Tokenizer` turns a
family's marks into tokens; `ChatModel` also names its chat template and queues a chat."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

__all__ = ["ChatModel", "TemplateInfo", "Tokenizer"]

Params = TypeVar("Params", contravariant=True)  # a request's sampling parameters
Running = TypeVar("Running", covariant=True)  # a queued request, as the model hands it back


class Tokenizer(Protocol):
    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]: ...


class TemplateInfo(Protocol):
    @property
    def chat_template(self) -> str | None:
        """The chat template's source (None: the model has none)."""


class ChatModel(Tokenizer, Protocol[Params, Running]):
    @property
    def info(self) -> TemplateInfo: ...

    def start(self, params: Params, messages: Sequence[Mapping[str, Any]] | None = None,
              prompt: str | Sequence[int] | None = None,
              template_args: Mapping[str, Any] | None = None,
              images: Sequence[Any] = ()) -> tuple[list[int], Running]:
        """The messages templated, tokenized and queued: the prompt's tokens and the
        running request."""
