"""How many prompt tokens a step may carry while other streams are generating.

Every step decodes one token for each generating stream; prompt tokens of a request still
being read ride along in the same batch. On a CPU, prefill costs milliseconds per token, so a
512-token chunk turns a 20 ms step into two seconds and every running stream stalls that long
(measured: 110× their usual inter-token latency on smollm2). The budget keeps a step within
a time — `target_s` seconds (the longest pause a running stream sees while a prompt is
read), or `factor` times a decode-only step, whichever is tighter — by learning
from the steps it has run:

- decode_s[n]:  duration of a step that decodes n streams and reads no prompt (moving average
                per n: a step for 16 streams costs more than one for 2)
- per_token_s:  what each prompt token adds to a step (moving average)

and allowing (target_s − decode_s[n]) / per_token_s prompt tokens while n streams generate
(with a factor, at most (factor − 1) × decode_s[n] / per_token_s). With nothing generating,
a prompt is read in full chunks: no one is waiting on the step. Where a step is fast (a GPU:
a full chunk costs less than the target) the budget never cuts. Smaller chunks read a long
prompt more slowly: on a CPU a piece of 15 tokens at position ~4,000 cost 13 ms a token where
whole chunks averaged 2-4 (bench/results/long_prompt_gap.md: TTFT 2.0x of reading it alone
at 200 ms, 1.0x in whole chunks); that is the trade, and why both are off by default.

Part of that cost is llama.cpp's: its CPU flash attention reads a sequence's query rows in
tiles of 64 and fewer rows one by one, at twice the cost a token at 4,000 positions (smollm2,
2 cores: 13-14 ms a token in pieces of 16 or 32, 7.3-7.8 in pieces of 128 or 511; without
flash attention 6.7-8.5 at every size; a piece beside running streams loses one token to
the micro-batch it shares with them). Pieces held to a tile and one (65 tokens) were
tried: at --step-ms 250, TTFT 1.55x of alone (from ~2x) but pauses of 446 ms (the tile's
cost far into the prompt), past the target the user set; so the target rules.
"""

from __future__ import annotations

__all__ = ["StepBudget"]


_ALPHA = 0.2  # weight of the newest measurement in the moving averages
_LEARNING_CHUNK = 16  # prompt tokens per step until both costs have been measured
_MIN_SAMPLE = 4  # fewer prompt tokens than this say more about noise than about their cost


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + _ALPHA * (new - old)


class StepBudget:
    def __init__(self, factor: float | None, floor: int = 1, target_s: float | None = None):
        """factor: a step may take this many decode-only steps' time; target_s: a step may
        take about this many seconds; None or 0 turns either off."""
        self.factor = factor or None
        self.target_s = target_s or None
        self.floor = floor
        self.decode_s: dict[int, float] = {}  # streams decoded → seconds per step
        self.per_token_s: float | None = None

    def decode_estimate(self, n_decode: int) -> float | None:
        """A decode-only step's time for n streams: measured, else scaled from the nearest."""
        if n_decode in self.decode_s:
            return self.decode_s[n_decode]
        if not self.decode_s:
            return None
        nearest = min(self.decode_s, key=lambda n: abs(n - n_decode))
        return self.decode_s[nearest] * n_decode / nearest

    def allowance(self, n_decode: int, limit: int) -> int:
        """Prompt tokens a step that decodes `n_decode` streams may carry, at most `limit`."""
        if not n_decode or not self.on:
            return limit
        decode = self.decode_estimate(n_decode)
        if decode is None or self.per_token_s is None:
            return min(limit, _LEARNING_CHUNK)
        room = float("inf")
        if self.factor is not None:
            room = (self.factor - 1) * decode / self.per_token_s
        if self.target_s is not None:
            room = min(room, (self.target_s - decode) / self.per_token_s)
        return max(min(self.floor, limit), min(limit, int(room)))

    @property
    def on(self) -> bool:
        return self.factor is not None or self.target_s is not None

    def observe(self, seconds: float, n_decode: int, n_prompt: int) -> None:
        """Learn from one finished step: its duration and what it carried."""
        if not self.on:
            return  # off: nothing will ask
        if n_prompt == 0:
            if n_decode:
                self.decode_s[n_decode] = _average(self.decode_s.get(n_decode), seconds)
            return
        if n_prompt < _MIN_SAMPLE:
            return
        base = self.decode_estimate(n_decode) if n_decode else 0.0
        if base is None:
            return  # cannot tell the prompt's share from the decode's yet
        self.per_token_s = _average(self.per_token_s, max(seconds - base, 1e-6) / n_prompt)
