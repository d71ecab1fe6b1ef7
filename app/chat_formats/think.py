"""A request's reasoning limit in tokens: the family's marks, read from its template
(prompt.think_limit), followed by the engine's reasoning budget (backends/engine/think_budget.py).
Its own module so that the Backend interface carries it without loading a parser."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ThinkLimit"]


@dataclass(frozen=True)
class ThinkLimit:
    """What a request's reasoning may take: `budget` tokens between `opening` and `closing`
    (token ids of the family's marks); `forced` is written when they are spent."""

    budget: int
    opening: tuple[int, ...]
    closing: tuple[int, ...]
    forced: tuple[int, ...]
