"""How many prompt tokens a step may carry while other streams are generating.

Every step decodes one token for each generating stream; prompt tokens of a request still
being read ride along in the same batch. On a CPU, prefill costs milliseconds per token, so a
512-token chunk turns a 20 ms step into two seconds and every running stream stalls that long
(measured: 110× their usual inter-token latency on smollm2). The budget keeps a step within
a time — `target_s` seconds (the longest pause a running stream sees while a prompt is
read; 250 ms by default), or `factor` times a decode-only step, whichever is tighter — by
learning from the steps it has run:

- decode_s[n]:  duration of a step that decodes n streams and reads no prompt (moving average
                per n: a step for 16 streams costs more than one for 2)
- the cost of a prompt token as a line in its depth (the tokens before it, which its
                attention reads: at 3,000 tokens deep one costs ~3x what it does at the
                start), fitted to the recent pieces (_DepthCost)

and allowing the tokens whose cost at the piece's depth fills (target_s − decode_s[n]) (with
a factor, (factor − 1) × decode_s[n]). A flat average lagged the depth: pieces early in a
long prompt came out too small (steps of 100-250 ms against a 500 ms target) and late ones
too big (630-730 ms). With nothing generating, a prompt is read in full chunks: no one is
waiting on the step. Where a step is fast (a GPU: a full chunk costs less than the target)
the budget never cuts.

Smaller pieces read a long prompt more slowly, and with flash attention much more slowly:
llama.cpp's CPU flash attention reads a sequence's query rows in tiles of 64, and fewer rows
one at a time. Measured (Xeon, 2 cores, smollm2's shape, a piece beside one decode token,
ms a token at 4,000 deep): with flash attention 9.7 in pieces of 65, 7.5 of 128, 6.0 of
511, and 53 in pieces of 64 or fewer (the decode token takes one of its rows, 63 are left);
without it 11.3 in pieces of 16, 9.0 of 32, 7.6-7.9 of 64-511. Pieces of a tile also waste
part of it where a head's rows end, which a piece's tokens and its depth both pay. Hence a
floor per kernel (piece_floor), and what each trade costs (bench/results/long_prompt_gap.md,
a 4,000-token prompt): with flash attention (llama.cpp's choice; --flash-attn on a CPU) the
smallest piece 4,000 deep takes ~0.63 s, so no target holds a running stream's pause below
that, and the prompt beside it is read ~1.5x slower; without it (a CPU's default) pieces of
16 take 0.18 s there, so a 250 ms target holds, but the prompt alone is read 1.4x slower
and decoding deep in a context is twice as fast (bench/results/deep_decode.md).

A target is a ceiling, not an average: steps take 0.9-1.2x their estimates (other processes
on the cores pushing llama.cpp's threads off them), so a step is sized for its estimate times
a margin: the recent steps' mean ratio of time to estimate, plus 3.5 deviations of the slower
ones (1.15 until a few have been measured). Held to its estimate, a 250 ms target paused a
running stream for up to 0.28-0.31 s; with the margin, 0.25-0.27 s, the steps' median
~225 ms, the prompt read beside it 1.13x as long as alone (was 1.12x).
"""

from __future__ import annotations

__all__ = ["DEFAULT_STEP_MS", "PIECE_FLOOR", "PLAIN_PIECE_FLOOR", "StepBudget", "piece_floor"]

# with flash attention a time target never cuts a prompt into pieces smaller than this: below
# a tile of llama.cpp's CPU kernel (64 query rows of a sequence) a token costs 2x as much on
# an EPYC, 5-8x on a Xeon with AVX-512, and a piece beside running streams gives one token to
# the micro-batch it shares with them. Where a tile costs more than the target (a large model
# on a CPU), the pause is a tile's.
PIECE_FLOOR = 65
# without flash attention a piece of any size is read at the same kind of cost (llama.cpp's
# matrix products); below 16 tokens a step's fixed cost (every weight read once) dominates
PLAIN_PIECE_FLOOR = 16


def piece_floor(flash_attn: bool) -> int:
    """The fewest prompt tokens a time target cuts a piece to, for the attention kernel the
    context runs."""
    return PIECE_FLOOR if flash_attn else PLAIN_PIECE_FLOOR


# the time target where the user sets none, whichever the attention kernel. Without flash
# attention pieces of 16 tokens hold it (a running stream's longest pause 0.25-0.27 s on a
# 2-core Xeon, the prompt beside it read 1.13x as long as alone). With it a tile of 65 tokens
# is the floor, and 4,000 tokens deep a tile and a decode step take about the target: on a
# 2-core EPYC (6 rounds, bench/results/epyc_2core/long_prompt_gap.md) the pause was 0.32-0.61
# s (median 0.41) at 250 ms against 0.48-0.87 (0.53) at 500, the prompt's TTFT 11.2 s against
# 10.1 (alone 7.4; without flash attention 0.24-0.33 s and 10.5-13.3 s, alone 10.0). Where a
# tile costs more than the target (a large model on a CPU), the pause is a tile's.
DEFAULT_STEP_MS = 250


_ALPHA = 0.2  # weight of the newest measurement in the moving averages
_LEARNING_CHUNK = 16  # prompt tokens per step until both costs have been measured
_MIN_SAMPLE = 4  # fewer prompt tokens than this say more about noise than about their cost
_MIN_SPREAD = 32  # tokens of depth the measured pieces must span before a slope is trusted
# a target is a ceiling: steps are sized so that their time, as far off its estimate as the
# recent steps were (their mean ratio plus this many deviations), still meets it
_DEVIATIONS = 3.5
_RATIO_ALPHA = 0.05  # (the last few dozen steps: a rare slow step must count for a while)
_MIN_PIECES = 4  # pieces the cost has learned from before a step is judged by its estimate
_MIN_RATIOS = 4  # steps measured against their estimate before the margin is trusted
_FIRST_MARGIN = 1.15  # until then (measured: steps 0.9-1.17 of their first estimates)
_MAX_MARGIN = 1.5  # the most a margin takes off a step's room (it is never below 1)


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + _ALPHA * (new - old)


class _DepthCost:
    """A prompt token's cost as a line in its depth (the tokens before it in its sequence,
    which its attention reads): a least-squares fit over the pieces measured, each weighted
    by its tokens and the older ones fading by _ALPHA a measurement. Until the pieces span
    _MIN_SPREAD tokens of depth, the line is flat (their weighted mean)."""

    def __init__(self) -> None:
        self.w = self.wx = self.wxx = self.wy = self.wxy = 0.0
        self.pieces = 0

    def add(self, depth: float, per_token: float, weight: float) -> None:
        self.pieces += 1
        keep = 1 - _ALPHA
        self.w = keep * self.w + weight
        self.wx = keep * self.wx + weight * depth
        self.wxx = keep * self.wxx + weight * depth * depth
        self.wy = keep * self.wy + weight * per_token
        self.wxy = keep * self.wxy + weight * depth * per_token

    @property
    def mean(self) -> float | None:
        return self.wy / self.w if self.w else None

    def at(self, depth: float) -> float:
        mean_x, mean_y = self.wx / self.w, self.wy / self.w
        spread = self.wxx / self.w - mean_x * mean_x
        if spread < _MIN_SPREAD * _MIN_SPREAD:
            return mean_y
        slope = max(0.0, (self.wxy / self.w - mean_x * mean_y) / spread)
        # (never below a quarter of the mean: a line drawn from a few noisy pieces could
        # otherwise promise near-free tokens at depths it has not seen)
        return max(mean_y + slope * (depth - mean_x), 0.25 * mean_y)


class _Ratios:
    """How long steps took over what they were estimated to take: a moving mean, and a
    moving deviation of the steps slower than it (those that break a target; a faster
    machine's steps do not widen the margin)."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 1.0
        self.var = 0.0

    def add(self, ratio: float) -> None:
        if self.n == 0:
            self.mean = ratio
        else:
            # how much slower than expected (the mean, or the estimate where steps have
            # run faster than it: a machine got faster), its square counted twice: were
            # the spread even, the deviation of all steps
            slow = 2 * max(ratio - max(self.mean, 1.0), 0.0) ** 2
            self.var = (1 - _RATIO_ALPHA) * (self.var + _RATIO_ALPHA * slow)
            self.mean += _RATIO_ALPHA * (ratio - self.mean)
        self.n += 1

    @property
    def margin(self) -> float:
        """What a step's estimate is multiplied by for it to be all but certain."""
        if self.n < _MIN_RATIOS:
            return _FIRST_MARGIN
        return min(_MAX_MARGIN, max(self.mean, 1.0) + _DEVIATIONS * self.var ** 0.5)


class StepBudget:
    def __init__(self, factor: float | None, floor: int = 1, target_s: float | None = None):
        """factor: a step may take this many decode-only steps' time; target_s: a step may
        take this many seconds at most; None or 0 turns either off."""
        self.factor = factor or None
        self.target_s = target_s or None
        self.floor = floor
        self.decode_s: dict[int, float] = {}  # streams decoded → seconds per step
        self._cost = _DepthCost()
        self._ratios = _Ratios()

    @property
    def per_token_s(self) -> float | None:
        """What a prompt token has added to a step, on average over the recent pieces."""
        return self._cost.mean

    @property
    def margin(self) -> float:
        """What a step's estimate is taken times for the step to meet its bound."""
        return self._ratios.margin

    def decode_estimate(self, n_decode: int) -> float | None:
        """A decode-only step's time for n streams: measured, else scaled from the nearest."""
        if n_decode in self.decode_s:
            return self.decode_s[n_decode]
        if not self.decode_s:
            return None
        nearest = min(self.decode_s, key=lambda n: abs(n - n_decode))
        return self.decode_s[nearest] * n_decode / nearest

    def allowance(self, n_decode: int, limit: int, depth: int = 0) -> int:
        """Prompt tokens a step that decodes `n_decode` streams may carry, at most `limit`,
        the piece starting `depth` tokens into its sequence."""
        if not n_decode or not self.on:
            return limit
        decode = self.decode_estimate(n_decode)
        if decode is None or self.per_token_s is None:
            return min(limit, max(_LEARNING_CHUNK, self.floor))
        step_s = float("inf")  # the longest a step may be estimated to take
        if self.factor is not None:
            step_s = self.factor * decode
        if self.target_s is not None:
            step_s = min(step_s, self.target_s)
        room_s = step_s / self.margin - decode
        # a token costs what its depth costs: a piece's tokens lie at depth .. depth + n,
        # so the piece is sized at its middle's cost (found in two rounds)
        n = room_s / self._cost.at(depth)
        for _ in range(2):
            n = room_s / self._cost.at(depth + min(n, limit) / 2)
        return max(min(self.floor, limit), min(limit, int(n)))

    @property
    def on(self) -> bool:
        return self.factor is not None or self.target_s is not None

    def observe(self, seconds: float, n_decode: int, n_prompt: int, depth: float = 0.0) -> None:
        """Learn from one finished step: its duration and what it carried (its prompt
        tokens at `depth` on average)."""
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
        if n_decode and self._cost.pieces >= _MIN_PIECES:  # a step sized: how far off?
            self._ratios.add(seconds / (base + n_prompt * self._cost.at(depth)))
        self._cost.add(depth, max(seconds - base, 1e-6) / n_prompt, n_prompt)
