"""A yes-or-no question."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label

from localinfer.tui.screens.dialog import DIALOG_CSS

__all__ = ["ConfirmScreen"]


class ConfirmScreen(ModalScreen[bool]):
    DEFAULT_CSS = DIALOG_CSS.format(name="ConfirmScreen")
    BINDINGS = [Binding("escape", "dismiss(False)", "Cancel"), Binding("y", "dismiss(True)", "Yes")]

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question, classes="title")
            yield Label("y: yes · Esc: no", classes="hint")
