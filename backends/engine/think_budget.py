"""A reasoning budget: a thinking model's reasoning block ends after so many tokens.

As llama.cpp's reasoning budget does (`common/reasoning-budget.cpp`), a request states the
block's opening and closing marks (as tokens) and what to write when the budget runs out —
a line break and the closing mark — and the engine follows the reply token by token:

    idle ──opening mark──► counting ──closing mark──► done
                              │ budget spent
                              ▼
                           forcing (the closing tokens, one a step, not sampled) ──► done

A prompt whose template opened the block itself (DeepSeek-R1, QwQ) starts counting. The
forced tokens are fed to the request's sampler as if drawn, so its penalties and grammar
follow the text as written. Anthropic's `thinking.budget_tokens`, and the effort levels of
OpenAI and Ollama for the families that mark reasoning with tags, become budgets
(api/core.py); gpt-oss reads its effort in its own template instead.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from localinfer.chat_formats.think import ThinkLimit

__all__ = ["ThinkBudget"]


class _State(enum.Enum):
    IDLE = "idle"
    COUNTING = "counting"
    FORCING = "forcing"
    DONE = "done"


class ThinkBudget:
    """One request's reasoning block as its tokens come: how much it has spent, and the
    token to write instead of sampling once it has spent it all."""

    def __init__(self, limit: ThinkLimit, prompt: Sequence[int]):
        self.limit = limit
        self.spent = 0
        self._recent: list[int] = []
        self._forced_at = 0
        self._state = _State.IDLE
        if _ends_with(prompt, limit.opening) or _ends_with(prompt[:-1], limit.opening):
            self._begin()  # (the template opened it: its mark, maybe a line break after)

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    def forced(self) -> int | None:
        """The token to write now instead of sampling one, if the budget is spent."""
        if self._state is _State.FORCING:
            return self.limit.forced[self._forced_at]
        return None

    def observe(self, token: int) -> None:
        """A token written (sampled or forced)."""
        if self._state is _State.FORCING:
            self._forced_at += 1
            if self._forced_at == len(self.limit.forced):
                self._state = _State.DONE
            return
        if self._state is _State.DONE:
            return
        keep = max(len(self.limit.opening), len(self.limit.closing))
        self._recent = (self._recent + [token])[-keep:]
        if self._state is _State.IDLE:
            if _ends_with(self._recent, self.limit.opening):
                self._begin()
            return
        if _ends_with(self._recent, self.limit.closing):
            self._state = _State.DONE  # the model closed it itself
            return
        self.spent += 1
        if self.spent >= self.limit.budget:
            self._state = _State.FORCING

    def _begin(self) -> None:
        self._state = _State.COUNTING if self.limit.budget > 0 else _State.FORCING


def _ends_with(tokens: Sequence[int], tail: Sequence[int]) -> bool:
    return bool(tail) and len(tokens) >= len(tail) and list(tokens[-len(tail):]) == list(tail)
