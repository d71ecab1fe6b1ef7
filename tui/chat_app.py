"""`localinfer chat`: a Textual chat app on the engine (in-process) or on a running server."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Markdown, Static
from textual.worker import Worker, WorkerState

from localinfer.backends.base import SamplingParams
from localinfer.backends.metrics import Figures, RequestStats
from localinfer.errors import LocalinferError, user_message
from localinfer.files import write_atomically
from localinfer.tui.client import ChatClient, Thought
from localinfer.tui.pictures import MAX_IMAGES, Picture, attach, paths
from localinfer.tui.screens import (ConversationDeleted, ConversationList, ModelPicker,
                                    SettingsScreen, TextPrompt)
from localinfer.tui.conversations import (Conversation, ConversationStore, SaveFailed, StoredMessage,
                                  to_markdown)
from localinfer.tui.widgets import AttachedPictures, MessageBox, PromptArea, StatusBar

__all__ = ["ChatApp"]

WELCOME = ("Type a message and press Enter (Ctrl+J for a new line). Esc stops a reply. "
           "Ctrl+T models · Ctrl+O conversations · Ctrl+S settings · Ctrl+G a picture · "
           "F1 keys · Ctrl+P commands")


DRAW_INTERVAL = 0.08  # seconds between redraws of a streaming reply


class ChatApp(App):
    TITLE = "localinfer"
    CSS = """
    #messages { height: 1fr; padding: 0 1; }
    #welcome { color: $text-muted; padding: 1 1; }
    """
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+t", "models", "Models"),
        Binding("ctrl+o", "conversations", "Chats"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("ctrl+r", "regenerate", "Regenerate"),
        Binding("ctrl+l", "edit_last", "Edit last"),
        Binding("ctrl+b", "copy_last", "Copy reply"),
        Binding("f1", "toggle_help", "Keys"),
        Binding("ctrl+g", "attach", "Picture"),  # (after Keys: a narrow footer keeps F1)
        Binding("f9", "toggle_theme", "Light/dark", show=False),
    ]

    def __init__(self, client: ChatClient, store: ConversationStore, model: str | None = None,
                 export_dir: Path | None = None, status_interval: float = 1.0):
        super().__init__()
        self.client = client
        self.store = store
        self.model_name = model
        self.export_dir = export_dir or Path.cwd()
        self.status_interval = status_interval
        self.conversation: Conversation | None = None
        self.history: list[StoredMessage] = []
        self.pending_settings: dict[str, Any] = {"system": "", "params": {}}
        self.model_ready = asyncio.Event()
        self.loading = False
        self.replying = False
        self.prompt = PromptArea(id="prompt", placeholder="Message (Enter sends)")
        self.attached = AttachedPictures(id="attached")  # pictures for the next message
        self.status_bar = StatusBar()

    # ---------------------------------------------------------------- layout
    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        with VerticalScroll(id="messages"):
            yield Static(WELCOME, id="welcome", markup=False)
        yield self.attached
        yield self.prompt
        yield self.status_bar
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.client.where
        if self.store.notice:
            self.notify(self.store.notice, title="Conversations", severity="warning",
                        timeout=20)
        self.load_model(self.model_name or "")
        self.set_interval(self.status_interval, self.refresh_status)
        self.prompt.focus()

    # ---------------------------------------------------------------- model
    def load_model(self, name: str, n_ctx: int | None = None) -> None:
        self.model_ready.clear()
        self.loading = True  # at once: a message sent before the worker starts must wait
        self._load(name, n_ctx)

    @work(exclusive=True, group="load", exit_on_error=False)
    async def _load(self, name: str, n_ctx: int | None) -> None:
        self.loading = True  # again: a load this one replaced may have just cleared it
        bar = self.status_bar
        bar.activity = f"loading {name or 'the default model'} …"
        try:
            status = await self.client.load(name, n_ctx or self._params().get("n_ctx"))
        except (LocalinferError, OSError) as exc:  # OSError: a home it cannot write, say
            await self._load_failed(name, user_message(exc))
            return
        finally:
            self.loading = False
        self._loaded(status)

    def _loaded(self, status) -> None:
        self.status_bar.model, self.status_bar.activity = status, ""
        self.model_name = status.name
        self.model_ready.set()

    async def _load_failed(self, name: str, error: str) -> None:
        """Say why; the model loaded before, if the client kept it, stays in use."""
        kept = await self.client.status()
        if kept is None:
            self.status_bar.model, self.status_bar.activity = None, f"no model: {error}"
            self.notify(f"{error} — pick another with Ctrl+T", title="Model", severity="error",
                        timeout=10)
            return
        self._loaded(kept)
        self.notify(f"{name or 'the default model'}: {error} — still using {kept.name}",
                    title="Model", severity="error", timeout=10)

    async def refresh_status(self) -> None:
        if not self.model_ready.is_set():
            return
        status = await self.client.status()
        if status is not None:
            self.status_bar.model = status

    # ---------------------------------------------------------------- conversation
    def _params(self) -> dict[str, Any]:
        return (self.conversation.params if self.conversation
                else self.pending_settings["params"])

    def _system(self) -> str:
        return self.conversation.system if self.conversation else self.pending_settings["system"]

    def _sampling(self) -> SamplingParams:
        p = self._params()
        return replace(SamplingParams(), **{k: p[k] for k in ("temperature", "top_p",
                                                              "max_tokens", "seed") if k in p})

    def _messages_for_model(self) -> list[dict[str, Any]]:
        """The conversation as the client sends it: each user's message with the pictures
        sent with it (those that can no longer be read, said on opening, left out)."""
        system = self._system()
        turns = [{"role": m.role, "content": m.content,
                  **({"reasoning_content": m.reasoning} if m.reasoning else {}),
                  **({"pictures": shown} if (shown := [p for p in m.pictures if p.available])
                     else {})}
                 for m in self.history]
        return ([{"role": "system", "content": system}] if system else []) + turns

    async def _show(self, message: StoredMessage) -> MessageBox:
        box = MessageBox(message.role, message.content, message.figures, message.id,
                         message.reasoning, message.pictures)
        welcome = self.query("#welcome")
        if welcome:
            await welcome.remove()
        await self.query_one("#messages").mount(box)
        self.query_one("#messages", VerticalScroll).scroll_end(animate=False)
        return box

    async def _clear_messages(self) -> None:
        await self.query_one("#messages").remove_children()
        await self.query_one("#messages").mount(Static(WELCOME, id="welcome", markup=False))

    @on(PromptArea.Submitted)
    async def _send(self, event: PromptArea.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if self.replying:
            self.notify("A reply is still being written — Esc stops it.", timeout=3)
            return
        if not self.model_ready.is_set() and not self.loading:
            self.notify("No model is loaded — pick one with Ctrl+T.", severity="warning",
                        timeout=5)
            return  # the text stays in the prompt
        pictures = self.attached.pictures
        refusal = self._pictures_refused(pictures)
        if refusal:  # the text and the pictures stay
            self.notify(refusal, title="Not sent", severity="error", timeout=10)
            return
        try:
            if self.conversation is None:
                title = re.sub(r"\s+", " ", text)[:48]
                self.conversation = self.store.create(self.model_name or "", title,
                                                      **self.pending_settings)
                self.title = title
            message = self.store.add(self.conversation.id,
                                     StoredMessage("user", text, pictures=pictures))
        except SaveFailed as exc:  # nothing sent: the text stays in the prompt
            self.notify(f"{exc}. Your message stays in the prompt.", title="Not sent",
                        severity="error", timeout=10)
            return
        self.prompt.clear()
        await self.attached.set_pictures([])
        self.history.append(message)
        await self._show(message)
        self.reply()

    @work(exclusive=True, group="reply", exit_on_error=False)
    async def reply(self) -> None:
        self.replying = True
        try:
            await self._reply()
        finally:
            self.replying = False

    async def _reply(self) -> None:
        assert self.conversation is not None
        await self.model_ready.wait()
        box = await self._show(StoredMessage("assistant", ""))
        stream = Markdown.get_stream(box.markdown)
        live = RequestStats(submitted_at=time.monotonic())  # our clock, until the engine's arrives
        pieces: list[str] = []
        thoughts: list[str] = []
        figures: Figures | None = None
        stopped = False
        shown_at, unshown = 0.0, 0
        agen = self.client.stream(self._messages_for_model(), self._sampling())
        try:
            async for piece in agen:
                if isinstance(piece, Thought):
                    now = time.monotonic()
                    live.token_times.append(now)
                    thoughts.append(piece)
                    if now - shown_at > DRAW_INTERVAL:
                        box.show_reasoning("".join(thoughts), thinking=True)
                        shown_at = now
                elif isinstance(piece, str):
                    if thoughts and box.thinking.collapsed is False:
                        box.show_reasoning("".join(thoughts), thinking=False)
                    now = time.monotonic()
                    live.token_times.append(now)
                    pieces.append(piece)
                    unshown += 1
                    # Drawing costs CPU the engine needs (2 cores, one GIL): draw at most
                    # ~12 times a second, not once per token.
                    if now - shown_at > DRAW_INTERVAL:
                        await self._draw(box, stream, pieces, unshown, live)
                        shown_at, unshown = now, 0
                else:
                    figures = piece
            if unshown:
                await self._draw(box, stream, pieces, unshown, live)
            if figures is not None and figures.finish_reason == "cancelled":
                figures = replace(figures, finish_reason="stopped")  # by Esc: the engine's own
        except LocalinferError as exc:
            await agen.aclose()
            await stream.stop()
            await box.remove()
            await self._fail_turn(str(exc))
            return
        except asyncio.CancelledError:
            stopped = True
            live.finish_reason = "stopped"
            figures = live.figures()
            raise
        finally:
            await agen.aclose()
            if stopped or figures is not None:
                if stopped and unshown:  # what was written before Esc, not yet drawn
                    await stream.write("".join(pieces[len(pieces) - unshown:]))
                await stream.stop()
                if thoughts:
                    box.show_reasoning("".join(thoughts), thinking=False)
                self._keep_reply(box, "".join(pieces), figures, "".join(thoughts))

    async def _draw(self, box: MessageBox, stream, pieces: list[str], unshown: int,
                    live: RequestStats) -> None:
        box.content = "".join(pieces)
        await stream.write("".join(pieces[len(pieces) - unshown:]))
        self.status_bar.figures = live.figures()
        self.query_one("#messages", VerticalScroll).scroll_end(animate=False)

    def _keep_reply(self, box: MessageBox, text: str, figures: Figures | None,
                    reasoning: str = "") -> None:
        assert self.conversation is not None
        saved = StoredMessage("assistant", text, figures, model=self.model_name,
                              reasoning=reasoning)
        # not saved: shown and kept for this session, only not on disk (its id stays None)
        self.save(self.store.add, self.conversation.id, saved,
                  after="The reply stays on screen but is not saved.")
        self.history.append(saved)
        box.message_id, box.content = saved.id, text
        box.set_figures(figures)
        self.status_bar.show_reply(figures)
        self.query_one("#messages", VerticalScroll).scroll_end(animate=False)

    async def _fail_turn(self, error: str) -> None:
        """The reply failed: drop the question from the chat and give its text (and its
        pictures) back."""
        assert self.conversation is not None
        self.notify(error, title="Reply failed", severity="error", timeout=10)
        if self.history and self.history[-1].role == "user":
            question = self.history.pop()
            self.save(self.store.delete_from, self.conversation.id, question.id or 0)
            boxes = self.query(MessageBox)
            if boxes:
                boxes.last().remove()
            self.prompt.load_text(question.content)
            await self.attached.set_pictures([p for p in question.pictures if p.available])

    async def open_conversation(self, conversation_id: int) -> None:
        conversation = self.store.get(conversation_id)
        if conversation is None:
            return
        await self._stop_reply()
        history = self.store.messages(conversation_id)
        # each kept picture read again (and its pixels held for the next turns); one that no
        # longer reads is said, shown as not available, and goes to the model no more
        missing = await asyncio.to_thread(
            lambda: [p for m in history for p in m.pictures if not p.check()])
        self.conversation = conversation
        self.history = history
        self.title = conversation.title
        await self._clear_messages()
        for message in self.history:
            await self._show(message)
        if missing:
            names = ", ".join(p.name for p in missing)
            self.notify(f"{len(missing)} picture{'s' if len(missing) > 1 else ''} of this "
                        f"conversation could not be read ({names}: {missing[0].missing}) — "
                        f"the model is sent {'their turns' if len(missing) > 1 else 'its turn'}"
                        f" without {'them' if len(missing) > 1 else 'it'}",
                        title="Pictures", severity="warning", timeout=20)
        self.status_bar.show_reply(next((m.figures for m in reversed(self.history)
                                         if m.figures), None))
        wanted_ctx = conversation.params.get("n_ctx")
        if conversation.model and (conversation.model != self.model_name or wanted_ctx):
            self.load_model(conversation.model, wanted_ctx)

    async def _stop_reply(self) -> None:
        self.workers.cancel_group(self, "reply")
        while self.replying:  # the reply saves what it wrote before it ends
            await asyncio.sleep(0.02)

    # ---------------------------------------------------------------- actions
    def save(self, write, *args, after: str = "") -> bool:
        """Run one store write; a failure (a full disk) is a notice, not a crash."""
        try:
            write(*args)
        except SaveFailed as exc:
            self.notify(f"{exc}. {after}" if after else str(exc), title="Not saved",
                        severity="error", timeout=10)
            return False
        return True

    def action_stop(self) -> None:
        # the client ends the stream itself when it can, so the reply keeps the engine's
        # figures (its prompt count among them); else the worker is cancelled
        if self.replying and not self.client.stop():
            self.workers.cancel_group(self, "reply")

    async def action_new_chat(self) -> None:
        await self._stop_reply()
        self.conversation, self.history = None, []
        self.pending_settings = {"system": "", "params": {}}
        self.title = "localinfer"
        self.status_bar.show_reply(None)
        await self._clear_messages()
        self.prompt.focus()

    def action_models(self) -> None:
        def chosen(name: str | None) -> None:
            if not name:
                return
            if self.conversation is not None:
                self.conversation.model = name
                self.save(self.store.update, self.conversation)
            self.load_model(name)

        self.push_screen(ModelPicker(self.client, self.model_name), chosen)

    def action_conversations(self) -> None:
        async def chosen(conversation_id: int | None) -> None:
            if conversation_id is not None:
                await self.open_conversation(conversation_id)

        self.push_screen(ConversationList(self.store), chosen)

    @on(ConversationDeleted)
    async def _deleted(self, event: ConversationDeleted) -> None:
        if self.conversation and self.conversation.id == event.conversation_id:
            await self.action_new_chat()

    def action_settings(self) -> None:
        def saved(result: dict[str, Any] | None) -> None:
            if result is None:
                return
            old_ctx = self._params().get("n_ctx")
            if self.conversation is None:
                self.pending_settings = result
            else:
                self.conversation.system = result["system"]
                self.conversation.params = result["params"]
                self.save(self.store.update, self.conversation)
            if result["params"].get("n_ctx") != old_ctx:
                self.load_model(self.model_name or "", result["params"].get("n_ctx"))

        async def check_context(n_ctx: int) -> str | None:
            return await self.client.check_context(self.model_name or "", n_ctx)

        self.push_screen(SettingsScreen(self._system(), dict(self._params()), check_context),
                         saved)

    async def action_regenerate(self) -> None:
        if self.replying or self.conversation is None or not self.history:
            return
        refusal = self._pictures_refused([])
        if refusal:
            self.notify(refusal, title="Not regenerated", severity="error", timeout=10)
            return
        if self.history[-1].role == "assistant":
            last = self.history[-1]
            if last.id is not None and not self.save(self.store.delete_from,
                                                     self.conversation.id, last.id):
                return
            self.history.pop()
            await self.query(MessageBox).last().remove()
        self.reply()

    async def action_edit_last(self) -> None:
        if self.replying or self.conversation is None:
            return
        index = next((i for i in range(len(self.history) - 1, -1, -1)
                      if self.history[i].role == "user"), None)
        if index is None:
            return
        question = self.history[index]
        if not self.save(self.store.delete_from, self.conversation.id, question.id or 0):
            return
        self.history = self.history[:index]
        for box in list(self.query(MessageBox))[index:]:
            await box.remove()
        self.prompt.load_text(question.content)
        await self.attached.set_pictures([p for p in question.pictures if p.available])
        self.prompt.focus()

    # ---------------------------------------------------------------- pictures
    def _takes_no_pictures(self) -> str | None:
        """Why pictures cannot be attached now: no model loaded, or a text model."""
        status = self.status_bar.model
        if self.loading:
            return "The model is still loading — attach pictures once it is ready"
        if not self.model_ready.is_set() or status is None:
            return "No model is loaded — pictures go to a vision model (Ctrl+T picks one)"
        if status.vision is False:
            return (f"{status.name} takes no pictures — pick a vision model (one pulled with "
                    f"its projector) with Ctrl+T")
        return None

    def _pictures_refused(self, attached: list[Picture]) -> str | None:
        """Why a turn with these pictures, or with the conversation's, cannot go to the
        model in use (a text model); None while it is still loading (its answer decides)."""
        status = self.status_bar.model
        if not self.model_ready.is_set() or status is None or status.vision is not False:
            return None
        if attached:
            return (f"{status.name} takes no pictures — pick a vision model with Ctrl+T, or "
                    f"take the pictures off (Tab to one, then Delete)")
        if any(p.available for m in self.history for p in m.pictures):
            return (f"This conversation has pictures and {status.name} takes none — pick a "
                    f"vision model with Ctrl+T, or start a new chat with Ctrl+N")
        return None

    def action_attach(self) -> None:
        refusal = self._takes_no_pictures()
        if refusal is None and len(self.attached.pictures) >= MAX_IMAGES:
            refusal = f"{MAX_IMAGES} pictures are the most one message takes"
        if refusal:
            self.notify(refusal, title="Picture", severity="error", timeout=10)
            return
        self.push_screen(TextPrompt("Attach a picture: its path (PNG, JPEG, WebP, GIF, BMP)",
                                    placeholder="~/Pictures/photo.jpg — several, quoted"),
                         self._attach_paths)

    @work(group="attach", exit_on_error=False)
    async def _attach_paths(self, text: str | None) -> None:
        """Read each picture off the UI thread; each one refused is one line."""
        for path in paths(text or ""):
            if len(self.attached.pictures) >= MAX_IMAGES:
                self.notify(f"{MAX_IMAGES} pictures are the most one message takes",
                            title="Picture", severity="error", timeout=10)
                break
            try:
                picture = await asyncio.to_thread(attach, path)
            except LocalinferError as exc:
                self.notify(str(exc), title="Picture not attached", severity="error",
                            timeout=10)
                continue
            await self.attached.add(picture)
        self.prompt.focus()

    def action_copy_last(self) -> None:
        reply = next((m for m in reversed(self.history) if m.role == "assistant"), None)
        if reply is not None:
            self.copy_to_clipboard(reply.content)
            self.notify("Copied the last reply.", timeout=2)

    def action_toggle_help(self) -> None:
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def export_conversation(self, conversation_id: int | None = None) -> Path | None:
        conversation_id = conversation_id or (self.conversation.id if self.conversation else None)
        conversation = self.store.get(conversation_id) if conversation_id else None
        if conversation is None:
            self.notify("Nothing to export yet.", timeout=3)
            return None
        slug = re.sub(r"[^a-z0-9]+", "-", conversation.title.lower()).strip("-")[:40] or "chat"
        path = self.export_dir / f"{slug}.md"
        n = 2
        while path.exists():  # never overwrite an earlier export
            path, n = self.export_dir / f"{slug}-{n}.md", n + 1
        try:
            write_atomically(path, to_markdown(conversation, self.store.messages(conversation.id)))
        except OSError as exc:
            self.notify(f"Not exported: {user_message(exc)}", severity="error", timeout=10)
            return None
        self.notify(f"Exported to {path}", timeout=6)
        return path

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("New chat", "Start an empty conversation", self.action_new_chat)
        yield SystemCommand("Conversations", "Open, rename, delete or export saved chats",
                            self.action_conversations)
        yield SystemCommand("Models", "Pick, pull or delete a model", self.action_models)
        yield SystemCommand("Conversation settings", "System prompt, temperature, context",
                            self.action_settings)
        yield SystemCommand("Export conversation", "Write this chat as Markdown",
                            self.export_conversation)
        yield SystemCommand("Attach a picture", "Show a vision model a picture with your next "
                            "message", self.action_attach)
        yield SystemCommand("Regenerate", "Write the last reply again", self.action_regenerate)
        yield SystemCommand("Toggle light/dark", "Switch the theme", self.action_toggle_theme)

    async def on_unmount(self) -> None:
        await self.client.close()
        self.store.close()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:  # a bug, not a user error: say so, keep running
            self.notify(f"{event.worker.error}", title="Unexpected error", severity="error")
