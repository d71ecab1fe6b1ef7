"""How many prompt tokens a step may carry while other streams are generating.

Every step decodes one token for each generating stream; prompt tokens of a request still
being read ride along in the same batch. On a CPU, prefill costs milliseconds per token, so a
512-token chunk turns a 20 ms step into two seconds and every running stream stalls that long
(measured: 110× their usual inter-token latency on smollm2). The budget keeps a step within
`factor` times a decode-only step, by learning from the steps it has run:

- decode_s:    duration of a step with no prompt tokens (moving average)
- per_token_s: what each prompt token adds to a step (moving average)

and allowing (factor − 1) × decode_s / per_token_s prompt tokens while anything is generating.
With nothing generating, a prompt is read in full chunks: no one is waiting on the step.
Small chunks read a long prompt more slowly (its own TTFT grows); that is the trade.
"""

from __future__ import annotations

__all__ = ["StepBudget"]

_ALPHA = 0.2  # weight of the newest measurement in the moving averages
_LEARNING_CHUNK = 16  # prompt tokens per step until both costs have been measured


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + _ALPHA * (new - old)


class StepBudget:
    def __init__(self, factor: float | None, floor: int = 1):
        """factor: a step may take this many decode-only steps' time; None or 0 turns it off."""
        self.factor = factor or None
        self.floor = floor
        self.decode_s: float | None = None
        self.per_token_s: float | None = None

    def allowance(self, generating: bool, limit: int) -> int:
        """Prompt tokens this step may carry, at most `limit`."""
        if not generating or self.factor is None:
            return limit
        if self.decode_s is None or self.per_token_s is None:
            return min(limit, _LEARNING_CHUNK)
        room = (self.factor - 1) * self.decode_s / self.per_token_s
        return max(min(self.floor, limit), min(limit, int(room)))

    def observe(self, seconds: float, n_decode: int, n_prompt: int) -> None:
        """Learn from one finished step: its duration and what it carried."""
        if n_prompt == 0:
            if n_decode:
                self.decode_s = _average(self.decode_s, seconds)
            return
        base = self.decode_s if (n_decode and self.decode_s is not None) else 0.0
        if n_decode and self.decode_s is None:
            return  # cannot tell the prompt's share from the decode's yet
        self.per_token_s = _average(self.per_token_s, max(seconds - base, 1e-6) / n_prompt)
