"""Fill-in-the-middle prompts from a code model's own FIM tokens (`llama_vocab_fim_*`).

An editor sends the text before the cursor, the text after it and, for context, pieces of
other files; the model writes what goes between. The prompt is the family's own order,
prefix-suffix-middle as llama.cpp's server builds it:

    [BOS] [REPO] "myproject\n" ([SEP] "name\n" text)… [SEP] "filename\n"
    [PRE] prefix [SUF] suffix [MID] prompt

The repository part is there only where the vocabulary has its tokens (Qwen2.5-Coder's
`<|repo_name|>` and `<|file_sep|>`; elsewhere other files' text goes before the prefix). Code
is tokenized as text only: a `<|fim_prefix|>` typed in a file is not the control token.
What does not fit keeps the text nearest the cursor: the prefix's end, the suffix's start
(at most a quarter of the room), the other files' last tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from localinfer.errors import InvalidRequest

__all__ = ["FimTokens", "Infill", "infill_prompt", "infill_tokens"]

_CHARS_PER_TOKEN = 16  # text kept around the cursor before tokenizing: ample for `room`


@dataclass(frozen=True)
class Infill:
    """What an editor sends: the text before and after the cursor, other files' text, and
    text to put after the middle mark (llama-server's `prompt`)."""

    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...] = ()
    prompt: str = ""

    def clipped(self, room: int) -> Infill:
        """The text nearest the cursor, enough for `room` tokens: a request of megabytes is
        cut here, before it is sent on and tokenized."""
        limit = max(room, 1) * _CHARS_PER_TOKEN
        kept, extra = limit, []
        for name, body in reversed(self.extra):  # the last files are kept, as the tokens are
            if kept <= 0:
                break
            extra.append((name[:256], body[-kept:]))
            kept -= len(body)
        return Infill(self.prefix[-limit:], self.suffix[:limit], tuple(reversed(extra)),
                      self.prompt[:limit])



@dataclass(frozen=True)
class FimTokens:
    pre: int | None
    suf: int | None
    mid: int | None
    rep: int | None = None
    sep: int | None = None

    @property
    def complete(self) -> bool:
        return None not in (self.pre, self.suf, self.mid)


def infill_prompt(backend: Any, params: Any, infill: Infill) -> list[int]:
    """A backend's fill-in-the-middle prompt for this text, leaving the reply its room in the
    context: its max_tokens, else the model's reply cap or a quarter of the context, at most
    half of it."""
    n_ctx = backend.info.n_ctx
    reply = params.max_tokens or min(backend.info.reply_cap or n_ctx // 4, n_ctx // 2)
    room = max(n_ctx - reply, 0)
    text = infill.clipped(room)
    return backend.infill_tokens(text.prefix, text.suffix, text.extra, text.prompt, room)


def infill_tokens(native: Any, fim: FimTokens, prefix: str, suffix: str,
                  extra: Sequence[tuple[str, str]] = (), prompt: str = "",
                  room: int = 4096, add_bos: bool = True) -> list[int]:
    """The prompt's tokens, at most `room` of them (the context less the reply's share)."""
    if not fim.complete:
        raise InvalidRequest("this model has no fill-in-the-middle tokens — use a code model "
                             "made for completion (qwen2.5-coder, deepseek-coder, starcoder2, "
                             "codestral)")

    def text(value: str) -> list[int]:
        return native.tokenize(value, add_special=False, parse_special=False) if value else []

    head = [native.bos()] if add_bos and native.bos() >= 0 else []
    repo: list[int] = []
    if fim.rep is not None and fim.sep is not None:
        repo = [fim.rep, *text("myproject\n")]
        for name, body in extra:
            repo += [fim.sep, *text(f"{name}\n"), *text(body)]
        repo += [fim.sep, *text("filename\n")]
    else:  # no repository tokens: the other files' text goes before the prefix
        for name, body in extra:
            repo += text(f"// {name}\n{body}\n")
    tail = text(prompt)
    room -= len(head) + len(tail) + 3
    if room < 16:
        raise InvalidRequest("the context leaves no room for the file around the cursor — ask "
                             "for fewer tokens, or load the model with a longer context")
    after = text(suffix)[:room // 4]
    before = text(prefix)
    before = before[max(0, len(before) - (room - len(after))):]
    repo = repo[max(0, len(repo) - (room - len(after) - len(before))):]
    return [*head, *repo, fim.pre, *before, fim.suf, *after, fim.mid, *tail]
