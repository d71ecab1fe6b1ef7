"""The terminal chat behind `localinfer run`: one-shot answers and the interactive loop."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console

from localinfer.backends.base import Backend, ErrorEvent, SamplingParams, TokenEvent
from localinfer.backends.metrics import RequestStats
from localinfer.errors import LocalinferError

__all__ = ["Reply", "answer_once", "fit_to_context", "interactive", "reply_room", "stream_reply"]

HELP = """Commands:
  /clear   forget the conversation so far
  /bye     exit (Ctrl-D works too)
  /?       this help
Ctrl-C stops a reply that is being written."""


@dataclass
class Reply:
    text: str
    stats: RequestStats | None
    interrupted: bool = False


def stream_reply(backend: Backend, messages: list[dict[str, str]], params: SamplingParams,
                 out: TextIO) -> Reply:
    """Stream one reply to `out`. Ctrl-C cancels it and keeps what was written."""
    generation = None
    pieces: list[str] = []
    try:
        generation = backend.chat(messages, params)
        for event in generation:
            if isinstance(event, TokenEvent):
                pieces.append(event.text)
                out.write(event.text)
                out.flush()
            elif isinstance(event, ErrorEvent):
                raise event.error
    except KeyboardInterrupt:
        if generation is None:  # interrupted before the request was queued
            return Reply("", None, interrupted=True)
        generation.cancel()
        for _ in generation:  # the engine answers the cancel within one step
            pass
        return Reply("".join(pieces), generation.stats, interrupted=True)
    return Reply("".join(pieces), generation.stats)


def fit_to_context(backend: Backend, messages: list[dict[str, str]], reserve: int
                   ) -> tuple[list[dict[str, str]], int]:
    """Leave out the oldest turns until the prompt leaves `reserve` tokens of the context for
    the reply, as Ollama does; system messages and the newest message always stay. Returns
    the messages and how many were left out."""
    budget = backend.info.n_ctx - reserve
    kept = list(messages)
    dropped = 0
    while len(backend.prompt_tokens(kept)) > budget:
        oldest = next((i for i, m in enumerate(kept[:-1]) if m["role"] != "system"), None)
        if oldest is None:  # only the newest message is left: the engine says it is too long
            break
        del kept[oldest]
        dropped += 1
    return kept, dropped


def reply_room(backend: Backend, params: SamplingParams) -> int:
    """Tokens a chat keeps free for the next reply: its max_tokens (or the model's reply
    cap), else a quarter of the context, at most half of it."""
    n_ctx = backend.info.n_ctx
    longest = params.max_tokens or (backend.info.reply_cap if params.capped else None)
    return min(longest or n_ctx // 4, n_ctx // 2)


def _print_stats(reply: Reply, err: Console) -> None:
    if reply.stats is not None:
        err.print(reply.stats.summary(), style="dim", highlight=False, soft_wrap=True, markup=False)


def answer_once(backend: Backend, prompt: str, system: str | None, params: SamplingParams,
                out: TextIO = sys.stdout, err: Console | None = None) -> Reply:
    err = err or Console(stderr=True)
    messages = ([{"role": "system", "content": system}] if system else [])
    messages.append({"role": "user", "content": prompt})
    reply = stream_reply(backend, messages, params, out)
    out.write("\n")
    out.flush()
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


def interactive(backend: Backend, system: str | None, params: SamplingParams,
                out: TextIO = sys.stdout, err: Console | None = None) -> None:
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    err = err or Console(stderr=True)
    base = [{"role": "system", "content": system}] if system else []
    history = list(base)
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
            print("Cleared the conversation.")
            continue
        history.append({"role": "user", "content": line})
        history, dropped = fit_to_context(backend, history, reply_room(backend, params))
        if dropped:
            err.print(f"(the conversation outgrew the {backend.info.n_ctx}-token context: its "
                      f"oldest {dropped} message{'s' if dropped > 1 else ''} left out — "
                      f"/clear starts afresh, --ctx gives more room)", style="dim",
                      highlight=False, soft_wrap=True, markup=False)
        try:
            reply = stream_reply(backend, history, params, out)
        except LocalinferError as exc:
            history.pop()  # the turn never happened: keep the history clean
            err.print(f"Error: {exc}", style="red", highlight=False, soft_wrap=True, markup=False)
            continue
        out.write("\n")
        if reply.interrupted:
            err.print("[stopped]", style="dim", highlight=False, markup=False)
        history.append({"role": "assistant", "content": reply.text})
        _print_stats(reply, err)
