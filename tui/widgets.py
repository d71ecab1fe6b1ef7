"""The chat screen's parts: a message, the prompt box, the pictures attached to it, and the
status bar."""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.containers import HorizontalScroll, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Collapsible, Markdown, Static, TextArea

from localinfer.backends.metrics import Figures
from localinfer.tui.client import ModelStatus
from localinfer.tui.pictures import Picture

__all__ = ["AttachedPictures", "MessageBox", "PictureChip", "PromptArea", "StatusBar"]


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:,.0f} MiB"


def _line(figures: Figures | None) -> str:
    return figures.line() if figures is not None else ""


class MessageBox(Vertical, can_focus=True):
    """One message. Focus it (Tab / Shift+Tab) and press c to copy it."""

    BINDINGS = [Binding("c", "copy", "Copy message")]
    DEFAULT_CSS = """
    MessageBox { height: auto; margin: 0 0 1 0; padding: 0 1; }
    MessageBox.user { border-left: thick $primary; background: $boost; }
    MessageBox.assistant { border-left: thick $success; }
    MessageBox:focus { background: $surface-lighten-1; }
    MessageBox Markdown { margin: 0; padding: 0; }
    MessageBox Markdown > MarkdownBlock:last-child { margin-bottom: 0; }
    MessageBox .figures { color: $text-muted; height: auto; }
    MessageBox Collapsible { border: none; padding: 0; margin: 0 0 1 0; }
    MessageBox .reasoning { color: $text-muted; text-style: italic; height: auto; }
    MessageBox .pictures { color: $text-muted; height: auto; }
    """

    def __init__(self, role: str, content: str = "", figures: Figures | None = None,
                 message_id: int | None = None, reasoning: str = "",
                 pictures: list[Picture] | None = None):
        super().__init__(classes=role)
        self.role = role
        self.content = content
        self.figures = figures
        self.message_id = message_id
        self.markdown = Markdown(content)
        self.figures_label = Static(_line(figures), classes="figures", markup=False)
        self.figures_label.display = bool(figures)
        # a thinking model's reasoning: a block of its own, folded once the answer comes
        self.reasoning = reasoning
        self.reasoning_text = Static(reasoning, classes="reasoning", markup=False)
        self.thinking = Collapsible(self.reasoning_text, title="Reasoning", collapsed=True)
        self.thinking.display = bool(reasoning)
        # the pictures sent with a user's message, as chips
        self.pictures = list(pictures or [])
        self.pictures_label = Static("   ".join(p.chip() for p in self.pictures),
                                     classes="pictures", markup=False)
        self.pictures_label.display = bool(self.pictures)

    def compose(self):
        yield self.pictures_label
        yield self.thinking
        yield self.markdown
        yield self.figures_label

    def show_reasoning(self, text: str, thinking: bool) -> None:
        """The reasoning so far: open while the model thinks, folded when it answers."""
        self.reasoning = text
        self.reasoning_text.update(text)
        self.thinking.display = bool(text)
        self.thinking.collapsed = not thinking
        self.thinking.title = "Thinking…" if thinking else "Reasoning"

    def set_figures(self, figures: Figures | None) -> None:
        self.figures = figures
        line = _line(figures)
        self.figures_label.update(line)
        self.figures_label.display = bool(line)

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.content)
        self.app.notify("Copied the message.", timeout=2)


class PictureChip(Static, can_focus=True):
    """A picture attached to the next message. Focus it (Tab / Shift+Tab) and press Delete
    or Backspace to take it off, or click it."""

    BINDINGS = [Binding("delete,backspace", "remove_picture", "Remove picture")]
    DEFAULT_CSS = """
    PictureChip { width: auto; height: 1; padding: 0 1; margin: 0 1 0 0; background: $boost;
                  color: $text; }
    PictureChip:focus { background: $accent; color: $text-accent; text-style: bold; }
    """

    def __init__(self, picture: Picture):
        super().__init__(f"{picture.chip()} ✕", markup=False)
        self.picture = picture

    async def action_remove_picture(self) -> None:
        bar = self.parent
        if isinstance(bar, AttachedPictures):
            await bar.remove_picture(self)

    async def on_click(self) -> None:
        await self.action_remove_picture()


class AttachedPictures(HorizontalScroll):
    """The pictures that go with the next message, above the prompt; hidden when none."""

    DEFAULT_CSS = """
    AttachedPictures { height: auto; max-height: 2; padding: 0 1; display: none; }
    AttachedPictures.some { display: block; }
    """

    @property
    def pictures(self) -> list[Picture]:
        return [chip.picture for chip in self.query(PictureChip)]

    async def add(self, picture: Picture) -> None:
        await self.mount(PictureChip(picture))
        self.set_class(True, "some")

    async def set_pictures(self, pictures: list[Picture]) -> None:
        await self.remove_children()
        if pictures:
            await self.mount_all([PictureChip(p) for p in pictures])
        self.set_class(bool(pictures), "some")

    async def remove_picture(self, chip: PictureChip) -> None:
        chips = list(self.query(PictureChip))
        index = chips.index(chip)
        await chip.remove()
        chips.pop(index)
        self.set_class(bool(chips), "some")
        if chips:  # the next chip, else the one before, keeps the focus
            chips[min(index, len(chips) - 1)].focus()
        else:
            self.app.query_one(PromptArea).focus()


class PromptArea(TextArea):
    """Enter sends; Ctrl+J or Shift+Enter starts a new line."""

    class Submitted(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    DEFAULT_CSS = """
    PromptArea { height: auto; min-height: 3; max-height: 8; }
    """

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.prevent_default()
            event.stop()
            self.post_message(self.Submitted(self.text))
        elif event.key in ("ctrl+j", "shift+enter"):
            event.prevent_default()
            event.stop()
            self.insert("\n")


class StatusBar(Static):
    """Two lines: the model and its memory, then the live numbers of the current reply."""

    DEFAULT_CSS = """
    StatusBar { height: 2; background: $panel; color: $text; padding: 0 1; text-wrap: nowrap;
                text-overflow: ellipsis; }
    """
    model: reactive[ModelStatus | None] = reactive(None)
    figures: reactive[Figures | None] = reactive(None)
    activity: reactive[str] = reactive("")

    def __init__(self) -> None:
        super().__init__(markup=False)
        self.context_used: int | None = None

    def show_reply(self, figures: Figures | None) -> None:
        """A finished reply's numbers; the context it leaves is its prompt plus its reply."""
        self.context_used = ((figures.prompt_tokens or 0) + figures.generated_tokens
                             if figures else None)
        self.figures = figures
        self.refresh()

    def render(self) -> str:
        return f"{self._model_line()}\n{self._reply_line()}"

    def _model_line(self) -> str:
        m = self.model
        if m is None:
            return self.activity or "no model loaded"
        parts = [f"{m.name} {m.quant} {m.device}",
                 f"ctx {self.context_used or 0}/{m.n_ctx}"]
        kv = []
        if m.kv_cells_used is not None and m.kv_cells_total:
            kv.append(f"{m.kv_cells_used}/{m.kv_cells_total}")
        if m.kv_bytes is not None:
            kv.append(_mib(m.kv_bytes))
        if kv:
            parts.append("KV " + " ".join(kv))
        if m.memory_bytes is not None:
            parts.append(f"mem {_mib(m.memory_bytes)}")
        return " · ".join(parts)

    def _reply_line(self) -> str:
        line = _line(self.figures)
        if self.activity and self.model is not None:
            return f"{self.activity} {line}".strip()
        return line or "TTFT — · tok/s —"
