"""Modal screens: the model picker, the conversation list, settings, and small dialogs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Label, ProgressBar, Static, TextArea

from localinfer.errors import LocalinferError
from localinfer.tui.client import ChatClient, ModelRow
from localinfer.tui.store import Conversation, ConversationStore

__all__ = ["ConfirmScreen", "ConversationDeleted", "ConversationList", "ModelPicker",
           "SettingsScreen", "TextPrompt"]

_DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{ width: 90%; max-width: 110; height: auto; max-height: 90%;
    border: round $primary; background: $surface; padding: 0 1; }}
{name} .title {{ text-style: bold; }}
{name} .hint {{ color: $text-muted; }}
{name} DataTable {{ height: auto; max-height: 16; }}
"""


def _size(n: int | None) -> str:
    if n is None:
        return ""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


class ConfirmScreen(ModalScreen[bool]):
    DEFAULT_CSS = _DIALOG_CSS.format(name="ConfirmScreen")
    BINDINGS = [Binding("escape", "dismiss(False)", "Cancel"), Binding("y", "dismiss(True)", "Yes")]

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question, classes="title")
            yield Label("y: yes · Esc: no", classes="hint")


class TextPrompt(ModalScreen[str | None]):
    """Ask for one line of text (a new title, a model to pull)."""

    DEFAULT_CSS = _DIALOG_CSS.format(name="TextPrompt")
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


class ModelPicker(ModalScreen[str | None]):
    """Installed models with the planner's fit badge, and catalog models to pull."""

    DEFAULT_CSS = _DIALOG_CSS.format(name="ModelPicker")
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("p", "pull", "Pull"),
        Binding("d", "delete", "Delete"),
    ]

    def __init__(self, client: ChatClient, current: str | None):
        super().__init__()
        self.client, self.current = client, current
        self.rows: list[ModelRow] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Models", classes="title")
            yield Label("Enter: use or pull · p: pull by name · d: delete · Esc: close",
                        classes="hint")
            yield DataTable(cursor_type="row", zebra_stripes=True)
            yield Static("", id="detail", classes="hint")
            yield ProgressBar(total=None, show_eta=False, id="progress")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("", "model", "fit", "quant", "size")
        self.query_one("#progress").display = False
        self.refresh_rows()

    @work(exclusive=True, group="rows", exit_on_error=False)
    async def refresh_rows(self) -> None:
        try:
            self.rows = await self.client.models()
        except LocalinferError as exc:
            self.notify(str(exc), severity="error")
            return
        table = self.query_one(DataTable)
        table.clear()
        for row in self.rows:
            # marks of neutral width: an "ambiguous" one (●) is drawn two cells wide by
            # terminals set for East Asian widths, and its rows slid off the header
            mark = "▸" if row.name == self.current else ("✓" if row.installed else "")
            table.add_row(mark, row.name, row.fit, row.quant, _size(row.size_bytes), key=row.name)
        table.focus()

    def _selected(self) -> ModelRow | None:
        table = self.query_one(DataTable)
        if not self.rows or table.cursor_row is None or table.cursor_row >= len(self.rows):
            return None
        return self.rows[table.cursor_row]

    @on(DataTable.RowHighlighted)
    def _show_detail(self) -> None:
        row = self._selected()
        self.query_one("#detail", Static).update(row.detail if row else "")

    @on(DataTable.RowSelected)
    def _use(self) -> None:
        row = self._selected()
        if row is None:
            return
        if row.installed:
            self.dismiss(row.name)
        else:
            self.pull(row.name, then_use=True)

    def action_pull(self) -> None:
        def got(name: str | None) -> None:
            if name:
                self.pull(name)

        self.app.push_screen(TextPrompt("Pull which model?", placeholder="llama3.2:3b, "
                                        "hf.co/owner/repo:Q4_K_M"), got)

    @work(exclusive=True, group="pull", exit_on_error=False)
    async def pull(self, name: str, then_use: bool = False) -> None:
        bar = self.query_one("#progress", ProgressBar)
        bar.display = True
        bar.update(total=None, progress=0)
        latest: list[int | None] = [0, None]  # written by the download thread, drawn here

        def progress(done: int, total: int | None) -> None:
            latest[:] = [done, total]

        timer = self.set_interval(0.2, lambda: bar.update(total=latest[1], progress=latest[0]))
        self.query_one("#detail", Static).update(f"pulling {name} …")
        try:
            installed = await self.client.pull(name, progress)
        except LocalinferError as exc:
            self.notify(f"{name}: {exc}", severity="error", timeout=8)
            self.query_one("#detail", Static).update(f"{name} was not pulled: {exc}")
            return
        finally:
            timer.stop()
            bar.display = False
        self.notify(f"pulled {installed}")
        if then_use:
            self.dismiss(installed)
        else:
            self.refresh_rows()

    def action_delete(self) -> None:
        row = self._selected()
        if row is None or not row.installed:
            return

        async def confirmed(yes: bool | None) -> None:
            if not yes:
                return
            try:
                await self.client.delete(row.name)
            except LocalinferError as exc:
                self.notify(str(exc), severity="error")
                return
            self.notify(f"deleted {row.name}")
            self.refresh_rows()

        self.app.push_screen(ConfirmScreen(f"Delete {row.name}?"), confirmed)


class ConversationList(ModalScreen[int | None]):
    """Saved conversations, newest first."""

    DEFAULT_CSS = _DIALOG_CSS.format(name="ConversationList")
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


class SettingsScreen(ModalScreen[dict[str, Any] | None]):
    """The conversation's system prompt and sampling parameters."""

    DEFAULT_CSS = _DIALOG_CSS.format(name="SettingsScreen") + """
    SettingsScreen TextArea { height: 4; }
    SettingsScreen Button { margin: 0; }
    SettingsScreen Horizontal { height: auto; }
    SettingsScreen Horizontal > Vertical { width: 1fr; height: auto; }
    SettingsScreen .error { color: $error; }
    """
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "save", "Save")]
    # key, label, type, lowest, highest
    FIELDS = (("temperature", "temperature", float, 0.0, 2.0),
              ("top_p", "top_p", float, 0.0, 1.0),
              ("n_ctx", "context tokens", int, 16, None),
              ("max_tokens", "max tokens", int, 1, None))

    def __init__(self, system: str, params: dict[str, Any],
                 check_context: Callable[[int], Awaitable[str | None]] | None = None):
        super().__init__()
        self.system, self.params = system, params
        self.check_context = check_context  # the planner's word on a new context size

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Conversation settings", classes="title")
            yield Label("Ctrl+S: save · Esc: cancel · empty fields use the defaults",
                        classes="hint")
            yield Label("System prompt")
            yield TextArea(self.system, id="system")
            with Horizontal():
                for key, label, *_ in self.FIELDS:
                    with Vertical():
                        yield Label(label)
                        value = self.params.get(key)
                        yield Input("" if value is None else str(value), id=key,
                                    placeholder="default")
            yield Label("", classes="error", id="error")
            yield Button("Save", variant="primary", id="save")

    @on(Button.Pressed, "#save")
    async def action_save(self) -> None:
        """Saved only when every value is usable: a context the model cannot run with is
        refused here, with the planner's reason, and nothing changes."""
        params: dict[str, Any] = {}
        for key, label, kind, lowest, highest in self.FIELDS:
            text = self.query_one(f"#{key}", Input).value.strip()
            if not text:
                continue
            try:
                params[key] = kind(text)
            except ValueError:
                return self._refuse(f"{label}: {text!r} is not a number")
            if highest is not None and not lowest <= params[key] <= highest:
                return self._refuse(f"{label}: {text} — give a value from {lowest} to {highest}")
            if params[key] < lowest:
                return self._refuse(f"{label}: {text} — give at least {lowest}")
        n_ctx = params.get("n_ctx")
        if n_ctx is not None and n_ctx != self.params.get("n_ctx") and self.check_context:
            self.query_one("#error", Label).update("checking the context size …")
            problem = await self.check_context(n_ctx)
            if problem:
                return self._refuse(f"context tokens: {problem}")
        self.dismiss({"system": self.query_one("#system", TextArea).text, "params": params})

    def _refuse(self, why: str) -> None:
        self.query_one("#error", Label).update(why)
