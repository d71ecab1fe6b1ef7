"""Filler tokens that make a decode step cheaper: one micro-batch where llama.cpp would run
several, and token counts its matrix products take faster than fewer.

Two costs of llama.cpp's that a step of streams pays, both measured here (2 threads, 2-core
EPYC, `llama_decode` of one token a sequence; bench/batch_padding.py):

- **Micro-batches.** With a KV cache per sequence (the default, not --kv-unified) llama.cpp
  puts into one micro-batch only sequences whose ids follow each other in the batch: streams
  in slots 0-3 and 5-7 (slot 4's request ended first) are decoded as two, and each reads
  every weight. SmolLM2-135M: 40 ms for those seven against 28 as one.
- **Token counts.** A CPU's quantized matrix products take a step's tokens in tiles of
  several rows (ggml-cpu's repacked Q4_0, Q4_K and IQ4_NL layouts four at a time, the rows
  left over one by one, each reading the weights again), so a step's time is not monotone
  in its streams. ms a step:

      n streams               1     4     5     6     7     8    12    15    16
      Llama-3.2-1B Q8_0      32   114   159   180   192   121   153   225   188
      SmolLM2-135M Q8_0     5.4  21.2  24.6  26.2  27.2  22.5  27.1  33.0  24.9
      Qwen3-0.6B Q4_K_M    10.0  28.4  34.7  39.3  44.5  47.8  55.8  75.2  59.1

A filler is a token of an idle slot's sequence at the position after the prefix it keeps
(its logits asked for, never read: the output layer's product then has the step's count of
rows too); its cell is removed as soon as the step is decoded, so the slot keeps exactly
the prefix it had. Fillers can close the gaps between the streams' slots (one
micro-batch) and round the count up to a multiple of `QUANTUM` with idle slots beside them.

Which is cheaper depends on the CPU, the quantization, the thread count and a GPU, so
nothing is assumed: a step's shape (the sizes of its micro-batches) is timed (moving
averages per shape), each way of filling a step is tried until its shape has been timed
`_SAMPLES` times, then the fastest is taken (a filled one only where it is `_BETTER`), and
every `RECHECK` steps the one timed longest ago is timed again (a context grows, and with
it what attention costs).

Only where a filler's cell can be taken back exactly: a transformer's KV in a cache per
sequence (not a recurrent or hybrid state, which a token changes for good; not a
sliding-window cache, which drops the window's old cells as a sequence grows; not one pool
shared by all slots, where a filler takes a cell a stream may need).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["QUANTUM", "RECHECK", "StepPadding", "micro_batches"]

QUANTUM = 4  # a rounded-up step's token count is a multiple of this (the tiles' rows)
_ALPHA = 0.25  # weight of the newest step in a shape's moving average
_SAMPLES = 4  # steps a shape is timed before its average is trusted (the first not counted)
_BETTER = 0.95  # a filled step must be estimated this much faster than the step alone
RECHECK = 64  # decode-only steps between two timings of a way not taken

Shape = tuple[int, ...]  # the sizes of a step's micro-batches, largest first


def micro_batches(ids: Sequence[int]) -> Shape:
    """How llama.cpp splits a step of one token in each of these sequences (ascending, each
    its own KV cache): runs of consecutive ids, one micro-batch each."""
    runs, length = [], 0
    for i, seq in enumerate(ids):
        if i and seq != ids[i - 1] + 1:
            runs.append(length)
            length = 0
        length += 1
    runs.append(length)
    return tuple(sorted(runs, reverse=True))


def ways(active: Sequence[int], fillable: Callable[[int], bool]) -> list[tuple[Shape, tuple[int, ...]]]:
    """The ways to decode a step of one token in each `active` sequence (ascending), as
    (shape, filler sequences): as it is; its gaps filled; its gaps filled and its count
    rounded up to a multiple of QUANTUM with fillable sequences beside it (above first)."""
    out = [(micro_batches(active), ())]
    lo, hi = active[0], active[-1]
    held = set(active)
    holes = tuple(s for s in range(lo, hi + 1) if s not in held)
    if not all(fillable(s) for s in holes):
        return out
    if holes:
        out.append(((hi - lo + 1,), holes))
    size = hi - lo + 1
    target = -(-size // QUANTUM) * QUANTUM
    extra: list[int] = []
    up, down = hi + 1, lo - 1
    while size + len(extra) < target:
        if fillable(up):
            extra.append(up)
            up += 1
        elif fillable(down):
            extra.append(down)
            down -= 1
        else:
            break
    if extra and size + len(extra) == target:
        out.append(((target,), holes + tuple(extra)))
    return out


class _Cost:
    __slots__ = ("seconds", "samples", "at")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.samples = 0
        self.at = 0  # the step it was last timed at


class StepPadding:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._costs: dict[Shape, _Cost] = {}
        self._steps = 0
        self.padded_steps = 0  # decode-only steps that carried fillers

    def choose(self, options: Sequence[tuple[Shape, tuple[int, ...]]]) -> int:
        """Which of the ways (`ways`; the first: no fillers) to decode this step."""
        costs = [self._costs.get(shape) for shape, _ in options]
        for i, cost in enumerate(costs):
            if cost is None or cost.samples < _SAMPLES:
                return i  # timed first
        best = min(range(len(options)), key=lambda i: costs[i].seconds)
        if best and costs[best].seconds >= _BETTER * costs[0].seconds:
            best = 0
        stale = min((i for i in range(len(options)) if i != best),
                    key=lambda i: costs[i].at, default=None)
        if stale is not None and self._steps - costs[stale].at >= RECHECK:
            return stale
        return best

    def observe(self, shape: Shape, seconds: float) -> None:
        """A decode-only step of this shape (fillers included) took `seconds` in
        llama_decode."""
        self._steps += 1
        cost = self._costs.setdefault(shape, _Cost())
        # (a shape's first step is not counted: llama.cpp builds the step's graph anew)
        cost.seconds = seconds if cost.samples <= 1 else cost.seconds + _ALPHA * (
            seconds - cost.seconds)
        cost.samples += 1
        cost.at = self._steps
