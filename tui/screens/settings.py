"""The system prompt, sampling parameters and context size of the chat."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, TextArea

from localinfer.tui.screens.dialog import DIALOG_CSS

__all__ = ["SettingsScreen"]


class SettingsScreen(ModalScreen[dict[str, Any] | None]):
    """The conversation's system prompt and sampling parameters."""

    DEFAULT_CSS = DIALOG_CSS.format(name="SettingsScreen") + """
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
