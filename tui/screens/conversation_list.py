"""Saved conversations: open, rename, export, delete."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from localinfer.tui.screens.confirm import ConfirmScreen
from localinfer.tui.screens.dialog import DIALOG_CSS
from localinfer.tui.screens.text_prompt import TextPrompt
from localinfer.tui.conversations import Conversation, ConversationStore

__all__ = ["ConversationDeleted", "ConversationList"]


class ConversationList(ModalScreen[int | None]):
    """Saved conversations, newest first."""

    DEFAULT_CSS = DIALOG_CSS.format(name="ConversationList")
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("r", "rename", "Rename"),
        Binding("d", "delete", "Delete"),
        Binding("x", "export", "Export Markdown"),
    ]

    def __init__(self, store: ConversationStore):
        super().__init__()
        self.store = store
        self.items: list[Conversation] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Conversations", classes="title")
            yield Label("Enter: open · r: rename · d: delete · x: export Markdown · Esc: close",
                        classes="hint")
            yield DataTable(cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("title", "model", "updated")
        self.reload()

    def reload(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        self.items = self.store.list()
        for c in self.items:
            table.add_row(c.title, c.model, c.updated_at.replace("T", " ")[:16], key=str(c.id))
        table.focus()

    def _selected(self) -> Conversation | None:
        row = self.query_one(DataTable).cursor_row
        return self.items[row] if self.items and row is not None and row < len(self.items) \
            else None

    @on(DataTable.RowSelected)
    def _open(self) -> None:
        chosen = self._selected()
        if chosen:
            self.dismiss(chosen.id)

    def action_rename(self) -> None:
        chosen = self._selected()
        if chosen is None:
            return

        def renamed(title: str | None) -> None:
            if title:
                chosen.title = title
                if self.app.save(self.store.update, chosen):  # type: ignore[attr-defined]
                    self.reload()

        self.app.push_screen(TextPrompt("New title", chosen.title), renamed)

    def action_delete(self) -> None:
        chosen = self._selected()
        if chosen is None:
            return

        def confirmed(yes: bool | None) -> None:
            if yes and self.app.save(self.store.delete, chosen.id):  # type: ignore[attr-defined]
                self.app.post_message(ConversationDeleted(chosen.id))
                self.reload()

        self.app.push_screen(ConfirmScreen(f"Delete “{chosen.title}”?"), confirmed)

    def action_export(self) -> None:
        chosen = self._selected()
        if chosen is not None:
            self.app.export_conversation(chosen.id)  # type: ignore[attr-defined]


class ConversationDeleted(Message):
    def __init__(self, conversation_id: int):
        super().__init__()
        self.conversation_id = conversation_id
