"""A question answered with one line of text."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from localinfer.tui.screens.dialog import DIALOG_CSS

__all__ = ["TextPrompt"]


class TextPrompt(ModalScreen[str | None]):
    """Ask for one line of text (a new title, a model to pull)."""

    DEFAULT_CSS = DIALOG_CSS.format(name="TextPrompt")
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, question: str, value: str = "", placeholder: str = ""):
        super().__init__()
        self.question, self.value, self.placeholder = question, value, placeholder

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question, classes="title")
            yield Input(self.value, placeholder=self.placeholder)
            yield Label("Enter: OK · Esc: cancel", classes="hint")

    @on(Input.Submitted)
    def _done(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)
