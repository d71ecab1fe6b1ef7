"""Installed models with the planner's fit badge, and catalog models to pull."""

from __future__ import annotations

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, ProgressBar, Static

from localinfer.errors import LocalinferError
from localinfer.tui.client import ChatClient, ModelRow
from localinfer.tui.screens.confirm import ConfirmScreen
from localinfer.tui.screens.dialog import DIALOG_CSS, size_text
from localinfer.tui.screens.text_prompt import TextPrompt

__all__ = ["ModelPicker"]


class ModelPicker(ModalScreen[str | None]):
    """Installed models with the planner's fit badge, and catalog models to pull."""

    DEFAULT_CSS = DIALOG_CSS.format(name="ModelPicker")
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
            table.add_row(mark, row.name, row.fit, row.quant, size_text(row.size_bytes), key=row.name)
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
