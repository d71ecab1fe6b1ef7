"""The terminal chat behind `localinfer run`: one-shot answers and the interactive loop."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from rich.console import Console

from localinfer.backends.base import Backend, ErrorEvent, SamplingParams, TokenEvent
from localinfer.chat_formats.prompt import newest_that_fit, start_chat
from localinfer.chat_formats.reply import Piece
from localinfer.chat_formats.fim import Infill, infill_prompt
from localinfer.backends.metrics import RequestStats
from localinfer.backends.base import Image
from localinfer.errors import InvalidRequest, LocalinferError
from localinfer.images import read as read_image

__all__ = ["Reply", "answer_once", "fill_middle", "fit_to_context", "interactive", "reply_room",
           "split_pictures", "stream_reply", "user_message"]

HELP = """Commands:
  /image PATH [PATH …]   show the model pictures with your next message (a vision model)
  /clear   forget the conversation so far
  /bye     exit (Ctrl-D works too)
  /?       this help
Ctrl-C stops a reply that is being written."""


@dataclass
class Reply:
    text: str
    stats: RequestStats | None
    interrupted: bool = False
    reasoning: str = ""  # what a thinking model thought before its answer
    reasoning_tokens: int = 0

    def message(self) -> dict[str, Any]:
        """The reply as the next turn's history holds it (its template decides whether the
        reasoning is written back)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        return message

    def summary(self) -> str | None:
        if self.stats is None:
            return None
        return dataclasses.replace(self.stats.figures(),
                                   reasoning_tokens=self.reasoning_tokens).summary()


_DIM, _UNDIM = "\x1b[2m", "\x1b[22m"


class _Writer:
    """A reply's pieces to the terminal: the answer as it is; reasoning dimmed on a terminal
    (left out where `think` is False, and where the output is not a terminal unless `think`
    asked for it), a blank line between the two."""

    def __init__(self, out: TextIO, think: bool | None):
        self.out = out
        self.tty = out.isatty()
        self.show = think is True or (think is None and self.tty)
        self.thinking = False
        self.content: list[str] = []
        self.reasoning: list[str] = []

    def write(self, pieces: list[Piece]) -> None:
        for piece in pieces:
            if piece.kind == "reasoning":
                self.reasoning.append(piece.text)
                if self.show:
                    self.out.write((_DIM if self.tty and not self.thinking else "") + piece.text)
                    self.thinking = True
            elif piece.kind == "content":
                self._end_thinking()
                self.content.append(piece.text)
                self.out.write(piece.text)
        self.out.flush()

    def _end_thinking(self) -> None:
        if self.thinking:
            self.out.write((_UNDIM if self.tty else "") + "\n\n")
            self.thinking = False

    def reply(self, stats: RequestStats | None, reasoning_tokens: int,
              interrupted: bool = False) -> Reply:
        if self.thinking and self.tty:
            self.out.write(_UNDIM)
            self.thinking = False
        return Reply("".join(self.content), stats, interrupted, "".join(self.reasoning),
                     reasoning_tokens)


def user_message(text: str, images: Sequence[Image] = ()) -> dict[str, Any]:
    """A user's turn: its text, and the pictures shown with it (before the text, as Ollama
    places them). The pictures ride in the message under "images" until it is sent
    (`split_pictures` takes them out)."""
    if not images:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [*({"type": "image"} for _ in images),
                                        {"type": "text", "text": text}],
            "images": list(images)}


def split_pictures(messages: Sequence[dict[str, Any]]
                   ) -> tuple[list[dict[str, Any]], list[Image]]:
    """The messages as a backend takes them, and their pictures in order."""
    out, images = [], []
    for message in messages:
        if "images" in message:
            images += message["images"]
            message = {k: v for k, v in message.items() if k != "images"}
        out.append(message)
    return out, images


def stream_reply(backend: Backend, messages: list[dict[str, Any]], params: SamplingParams,
                 out: TextIO, think: bool | None = None) -> Reply:
    """Stream one reply to `out`. Ctrl-C cancels it and keeps what was written. A thinking
    model's reasoning is shown apart (_Writer); `think` turns its template's thinking on or
    off (None: the template's default). Messages may carry pictures (`user_message`)."""
    writer = _Writer(out, think)
    generation = reader = None
    try:
        plain, images = split_pictures(messages)
        generation, reader = start_chat(backend, params, plain, think, images)
        for event in generation:
            if isinstance(event, TokenEvent):
                writer.write(reader.feed(event.text))
            elif isinstance(event, ErrorEvent):
                raise event.error
        writer.write(reader.close())
    except KeyboardInterrupt:
        if generation is None:  # interrupted before the request was queued
            return Reply("", None, interrupted=True)
        generation.cancel()
        for _ in generation:  # the engine answers the cancel within one step
            pass
        if reader is not None:
            writer.write(reader.close())
        return writer.reply(generation.stats, reader.reasoning_tokens if reader else 0,
                            interrupted=True)
    return writer.reply(generation.stats, reader.reasoning_tokens)


def fit_to_context(backend: Backend, messages: list[dict[str, Any]], reserve: int
                   ) -> tuple[list[dict[str, Any]], int]:
    """Leave out the oldest turns until the prompt leaves `reserve` tokens of the context for
    the reply, as Ollama does (newest_that_fit): system messages and the newest message
    always stay (a turn's pictures count with it and go with it). Returns the messages and
    how many were left out; a newest message too long alone stays, for the engine to refuse
    it in words."""
    budget = backend.info.n_ctx - reserve

    def fits(at: Sequence[int]) -> bool:
        plain, images = split_pictures([messages[i] for i in at])
        return len(backend.prompt_tokens(plain, None, images)) <= budget

    if len(messages) < 2 or fits(range(len(messages))):
        return list(messages), 0
    at = newest_that_fit(messages, fits)
    if at is None:  # only the newest message (and the system ones) left: too long alone
        at = [i for i, m in enumerate(messages[:-1]) if m["role"] == "system"]
        at.append(len(messages) - 1)
    return [messages[i] for i in at], len(messages) - len(at)


def reply_room(backend: Backend, params: SamplingParams) -> int:
    """Tokens a chat keeps free for the next reply: its max_tokens (or the model's reply
    cap), else a quarter of the context, at most half of it."""
    n_ctx = backend.info.n_ctx
    longest = params.max_tokens or (backend.info.reply_cap if params.capped else None)
    return min(longest or n_ctx // 4, n_ctx // 2)


def _print_stats(reply: Reply, err: Console) -> None:
    summary = reply.summary()
    if summary is not None:
        err.print(summary, style="dim", highlight=False, soft_wrap=True, markup=False)


def answer_once(backend: Backend, prompt: str, system: str | None, params: SamplingParams,
                out: TextIO = sys.stdout, err: Console | None = None,
                think: bool | None = None, images: Sequence[Image] = ()) -> Reply:
    err = err or Console(stderr=True)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append(user_message(prompt, images))
    reply = stream_reply(backend, messages, params, out, think)
    out.write("\n")
    out.flush()
    _print_stats(reply, err)
    return reply


def fill_middle(backend: Backend, prefix: str, suffix: str, params: SamplingParams,
                out: TextIO = sys.stdout, err: Console | None = None) -> Reply:
    """Code completion from the terminal: what a code model writes between `prefix` and
    `suffix` (its fill-in-the-middle tokens), streamed to `out`, the stats line to `err`."""
    err = err or Console(stderr=True)
    generation = backend.generate(infill_prompt(backend, params, Infill(prefix, suffix)), params)
    pieces = []
    try:
        for event in generation:
            if isinstance(event, TokenEvent):
                pieces.append(event.text)
                out.write(event.text)
                out.flush()
            elif isinstance(event, ErrorEvent):
                raise event.error
    except KeyboardInterrupt:
        generation.cancel()
        for _ in generation:
            pass
    out.write("\n")
    out.flush()
    reply = Reply("".join(pieces), generation.stats)
    _print_stats(reply, err)
    return reply


def _read_line() -> str | None:
    """The next line from the user; None on Ctrl-D."""
    while True:
        try:
            return input(">>> ")
        except EOFError:
            print()
            return None
        except KeyboardInterrupt:
            print("\nUse Ctrl-D or /bye to exit.")


def check_vision(backend: Backend) -> None:
    """Pictures are for a model with a projector: one line to say so before any is read."""
    if not backend.info.vision:
        raise InvalidRequest(f"{backend.info.name} takes no images — run a vision model (one "
                             f"pulled with its projector) to show it pictures")


def _attach(backend: Backend, line: str, err: Console) -> list[Image]:
    """`/image PATH …`: the pictures read, or none and one line saying why."""
    try:
        paths = shlex.split(line)
    except ValueError as exc:
        err.print(f"Error: {exc} — quote a path with spaces", style="red", highlight=False,
                  markup=False)
        return []
    if not paths:
        err.print("Usage: /image PATH [PATH …] (quote a path with spaces)", style="red",
                  highlight=False, markup=False)
        return []
    try:
        check_vision(backend)
        images = [read_image(path) for path in paths]
    except LocalinferError as exc:
        err.print(f"Error: {exc}", style="red", highlight=False, soft_wrap=True, markup=False)
        return []
    names = ", ".join(f"{shlex.quote(p)} ({i.width}×{i.height})" for p, i in zip(paths, images))
    err.print(f"Attached {names} — ask about {'it' if len(images) == 1 else 'them'}.",
              style="dim", highlight=False, soft_wrap=True, markup=False)
    return images


def interactive(backend: Backend, system: str | None, params: SamplingParams,
                out: TextIO = sys.stdout, err: Console | None = None,
                think: bool | None = None, images: Sequence[Image] = (),
                reload: Callable[[], Backend] | None = None) -> None:
    """The chat loop; `images` go with the first message (`run --image`), and `/image`
    attaches more to the next. reload: the model loaded again through the plan, for the
    turn after its runner ended (the loop closes what it loaded)."""
    reloaded: list[Backend] = []
    try:
        _chat(backend, system, params, out, err, think, images, reload, reloaded)
    finally:
        for again in reloaded:
            again.close()


def _chat(backend: Backend, system: str | None, params: SamplingParams, out: TextIO,
          err: Console | None, think: bool | None, images: Sequence[Image],
          reload: Callable[[], Backend] | None, reloaded: list[Backend]) -> None:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    err = err or Console(stderr=True)
    base: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    history = list(base)
    attached = list(images)
    err.print(f"Chatting with {backend.info.name} ({backend.info.quant}, "
              f"{backend.info.n_ctx} tokens of context). /? for help, /bye to exit.",
              style="dim", highlight=False, soft_wrap=True)
    while (line := _read_line()) is not None:
        command = line.strip()
        if not command:
            continue
        if command in ("/bye", "/exit", "/quit"):
            break
        if command in ("/?", "/help"):
            print(HELP)
            continue
        if command == "/clear":
            history = list(base)
            attached = []
            print("Cleared the conversation.")
            continue
        if command.split(maxsplit=1)[0] == "/image":
            attached += _attach(backend, command[len("/image"):], err)
            continue
        if backend.ended and reload is not None:
            err.print(f"(loading {backend.info.name} again: its runner ended)", style="dim",
                      highlight=False, markup=False)
            try:
                backend = reload()
            except LocalinferError as exc:
                err.print(f"Error: {exc}", style="red", highlight=False, soft_wrap=True,
                          markup=False)
                continue
            reloaded.append(backend)
        history.append(user_message(line, attached))
        history, dropped = fit_to_context(backend, history, reply_room(backend, params))
        if dropped:
            err.print(f"(the conversation outgrew the {backend.info.n_ctx}-token context: its "
                      f"oldest {dropped} message{'s' if dropped > 1 else ''} left out — "
                      f"/clear starts afresh, --ctx gives more room)", style="dim",
                      highlight=False, soft_wrap=True, markup=False)
        try:
            reply = stream_reply(backend, history, params, out, think)
        except LocalinferError as exc:
            history.pop()  # the turn never happened: keep the history clean
            attached = []  # (its pictures with it: /image them again)
            err.print(f"Error: {exc}", style="red", highlight=False, soft_wrap=True, markup=False)
            continue
        attached = []
        out.write("\n")
        if reply.interrupted:
            err.print("[stopped]", style="dim", highlight=False, markup=False)
        history.append(reply.message())
        _print_stats(reply, err)
