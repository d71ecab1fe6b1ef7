"""A chat's prompt as its family writes it: the template's arguments with thinking on where
the family reasons (`with_thinking`), whether the prompt's end opened a reasoning block
(`opens_reasoning`), a reasoning budget in the family's own marks (`think_limit`, with the
effort levels' budgets), and a chat without tools queued with its reply's parser
(`start_chat`, for the REPL and the TUI), and the newest messages of a chat that outgrew its
context (`newest_that_fit`). What is asked of the model is the protocols of
tokenizer.py; the marks' tokens are asked once per model."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from localinfer.chat_formats.detect import HARMONY, ChatFormat, detect
from localinfer.chat_formats.parser import ReplyParser, parser
from localinfer.chat_formats.think import ThinkLimit
from localinfer.chat_formats.tokenizer import ChatModel, Tokenizer

__all__ = ["EFFORT_BUDGETS", "newest_that_fit", "opens_reasoning", "start_chat", "think_limit",
           "with_thinking"]

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


def newest_that_fit(messages: Sequence[Mapping[str, Any]], fits: Callable[[list[int]], bool],
                    sizes: Sequence[int] | None = None, most: int | None = None
                    ) -> list[int] | None:
    """The messages a chat keeps (their indices) once its oldest must go for the rest to fit,
    as Ollama cuts one (its chatPrompt): the system messages stay, and the last message, and
    a tool's result stays with the call that asked for it. `fits(kept)` counts a try's
    tokens; the cut is searched in halves, at most ~log2(messages) tries. `sizes` and
    `most`: each message's bytes, and the most bytes a try may hold — the tries are only
    among the cuts whose text could fit at all (its tokens are bounded below by its bytes),
    so none tokenizes more than a context's text. None: not even the last message fits (with
    the system messages)."""
    def kept(cut: int) -> list[int]:
        return [i for i in range(cut) if messages[i].get("role") == "system"] + list(
            range(cut, len(messages)))

    cuts = _cuts(messages)
    if sizes is not None and most is not None:
        systems = list(itertools.accumulate(  # the system messages' bytes before each
            (size * (m.get("role") == "system") for m, size in zip(messages, sizes)),
            initial=0))
        after = list(itertools.accumulate(reversed(sizes), initial=0))[::-1]  # from each on
        cuts = [c for c in cuts if systems[c] + after[c] <= most]
    if not cuts or not fits(kept(cuts[-1])):
        return None
    low, high = 0, len(cuts) - 1  # the fewest messages dropped that fit: cuts[low]
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(kept(cuts[middle])) else (middle + 1, high)
    return kept(cuts[low])


def _cuts(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Where a chat may begin once its oldest messages go: at each message after the first,
    but never between a call and a tool's result for it."""
    cuts: list[int] = []
    call = None  # the message whose tool calls the results now follow
    for i, message in enumerate(messages):
        if message.get("role") != "tool":
            calls = message.get("role") == "assistant" and message.get("tool_calls")
            call = i if calls else None
        start = i if call is None or i == call else call
        if start > 0 and (not cuts or cuts[-1] < start):
            cuts.append(start)
    return cuts
