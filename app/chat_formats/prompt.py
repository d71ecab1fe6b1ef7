"""A chat's prompt as its family writes it: the template's arguments with thinking on where
the family reasons (`with_thinking`), whether the prompt's end opened a reasoning block
(`opens_reasoning`), a reasoning budget in the family's own marks (`think_limit`, with the
effort levels' budgets), and a chat without tools queued with its reply's parser
(`start_chat`, for the REPL and the TUI). What is asked of the model is the protocols of
tokenizer.py; the marks' tokens are asked once per model."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from localinfer.chat_formats.detect import HARMONY, ChatFormat, detect
from localinfer.chat_formats.parser import ReplyParser, parser
from localinfer.chat_formats.think import ThinkLimit
from localinfer.chat_formats.tokenizer import ChatModel, Tokenizer

__all__ = ["EFFORT_BUDGETS", "opens_reasoning", "start_chat", "think_limit", "with_thinking"]

P = TypeVar("P")  # the model's sampling parameters
R = TypeVar("R")  # its running request


def with_thinking(fmt: ChatFormat | None, template_args: Mapping[str, Any] | None
                  ) -> dict[str, Any] | None:
    """What a template gets besides the messages, with thinking on unless asked off where
    the family reasons, as llama.cpp renders it (DeepSeek-R1's template closes the block at
    once where `enable_thinking` is unset)."""
    args = dict(template_args or {})
    if fmt is not None and fmt.think:
        args.setdefault("enable_thinking", True)
    return args or None


def start_chat(model: ChatModel[P, R], params: P, messages: Sequence[Mapping[str, Any]],
               think: bool | None = None, images: Sequence[Any] = ()
               ) -> tuple[R, ReplyParser]:
    """A chat without tools queued (one trip to a runner), and the parser of its reply:
    `think` turns the template's thinking on or off (None: on, where the family reasons);
    `images` go where the messages' image parts are."""
    fmt = detect(model.info.chat_template)
    args = with_thinking(fmt, None if think is None else {"enable_thinking": think})
    tokens, generation = model.start(params, messages, None, args, images)
    return generation, parser(fmt, None, opens_reasoning(model, fmt, tokens))


# each model's marks as tokens, asked once (weakly held: they go with the model)
_THINK_TAILS: weakref.WeakKeyDictionary[Tokenizer, list[list[int]]] = (
    weakref.WeakKeyDictionary())


def opens_reasoning(model: Tokenizer, fmt: ChatFormat | None, tokens: Sequence[int]) -> bool:
    """Whether a prompt (its tokens) ends inside a reasoning block its template opened
    (DeepSeek-R1 and QwQ write `<think>` themselves): then the reply starts as reasoning.
    `model` tokenizes the block's opening mark, once per model."""
    if fmt is None or fmt.think is None or fmt is HARMONY:
        return False
    tails = _THINK_TAILS.get(model)
    if tails is None:
        tails = [model.tokenize(fmt.think[0] + end, add_special=False) for end in ("", "\n")]
        _THINK_TAILS[model] = tails
    return any(tail and list(tokens[-len(tail):]) == tail for tail in tails)


# how long each effort level lets a family that marks its reasoning with tags think (gpt-oss
# reads the level in its own template instead); "none" turns thinking off in the template
EFFORT_BUDGETS = {"minimal": 0, "low": 1024, "medium": 4096, "high": None}
_THINK_MARKS: weakref.WeakKeyDictionary[Tokenizer, tuple[tuple[int, ...], ...]] = (
    weakref.WeakKeyDictionary())


def think_limit(model: Tokenizer, fmt: ChatFormat | None, budget: int | None
                ) -> ThinkLimit | None:
    """A reasoning budget in the family's own marks (as tokens, asked of `model` once per
    model): the block closes after `budget` tokens with a line break and its closing mark.
    None where there is no budget, or the family marks no reasoning block with tags."""
    if budget is None or fmt is None or fmt.think is None or fmt is HARMONY:
        return None
    marks = _THINK_MARKS.get(model)
    if marks is None:
        opening, closing = fmt.think
        marks = tuple(tuple(model.tokenize(text, add_special=False))
                      for text in (opening, closing, "\n" + closing))
        _THINK_MARKS[model] = marks
    return ThinkLimit(budget, *marks)
