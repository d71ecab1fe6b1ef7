"""Memory arithmetic for one model: weights + KV cache + compute buffers.

The first piece of the fit planner: it answers "does this context fit in RAM?" and,
in reverse, "what is the largest context that does?".
"""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.errors import ContextTooLarge
from localinfer.model_store.gguf_info import GGUFInfo

__all__ = ["MemoryEstimate", "check_context", "estimate_memory", "max_context"]

_MIB = 1024 * 1024
_GIB = 1024 * _MIB
_FIXED_OVERHEAD = 16 * _MIB  # output buffer, graph metadata, small scratch


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    kv_cache: int
    compute: int

    @property
    def total(self) -> int:
        """What llama.cpp reserves: all of it is taken on a GPU."""
        return self.weights + self.kv_cache + self.compute

    @property
    def resident(self) -> int:
        """What a CPU process actually grows by: most of the compute reserve is never touched
        when decoding (logits are computed only for the rows that need them). The allowance,
        28 MiB + 9% of the reserve, is fitted to the RSS growth of the two embedded models
        after a full-chunk prefill (smollm2: 37 MiB of 102; gemma3: 74 of 514): a
        calibration on two points, checked by a test, not a law."""
        return self.weights + self.kv_cache + 28 * _MIB + int(self.compute * 0.09)


def _compute_buffer(info: GGUFInfo, n_ubatch: int) -> int:
    # dominated by the logits of one micro-batch (f32 × vocabulary × tokens); measured:
    # 102.5 MiB for smollm2 (49k vocab) and 514.5 MiB for gemma3 (262k) at n_ubatch 512
    return info.n_vocab * n_ubatch * 4 + _FIXED_OVERHEAD


def estimate_memory(info: GGUFInfo, n_ctx: int, n_slots: int = 1, n_ubatch: int = 512,
                    kv_bytes_per_element: float = 2.0) -> MemoryEstimate:
    kv = int(info.kv_bytes_per_token(kv_bytes_per_element) * n_ctx * n_slots)
    return MemoryEstimate(info.file_size, kv, _compute_buffer(info, n_ubatch))


def max_context(info: GGUFInfo, available: int, n_slots: int = 1, n_ubatch: int = 512,
                kv_bytes_per_element: float = 2.0) -> int:
    """The largest per-slot context that fits in `available` bytes (0 if none does)."""
    fixed = info.file_size + _compute_buffer(info, n_ubatch)
    per_token = info.kv_bytes_per_token(kv_bytes_per_element) * n_slots
    if available <= fixed or per_token <= 0:
        return 0
    return min(int((available - fixed) // per_token), info.n_ctx_train or 1 << 30)


def check_context(info: GGUFInfo, n_ctx: int, n_slots: int, available: int,
                  n_ubatch: int = 512, name: str | None = None,
                  kv_bytes_per_element: float = 2.0,
                  beside: tuple[int, str] = (0, "")) -> MemoryEstimate:
    """Raise ContextTooLarge, with the numbers and what to do, unless the context fits.

    beside: bytes taken by something loaded with the model (a draft model), and its name.
    """
    name = name or info.name
    taken, what = beside
    free = available - taken
    if info.n_ctx_train and n_ctx > info.n_ctx_train:
        raise ContextTooLarge(
            f"a context of {n_ctx} tokens is more than the {info.n_ctx_train} '{name}' "
            f"was trained for — use --ctx {info.n_ctx_train} or less"
        )
    estimate = estimate_memory(info, n_ctx, n_slots, n_ubatch, kv_bytes_per_element)
    if estimate.total > free:
        fits = max_context(info, free, n_slots, n_ubatch, kv_bytes_per_element)
        hint = f"use --ctx {fits} or less" if fits else "free some memory or pick a smaller model"
        after = f" after {taken / _GIB:.2f} GiB for {what}" if taken else ""
        raise ContextTooLarge(
            f"a context of {n_ctx} tokens needs about {estimate.total / _GIB:.2f} GiB "
            f"(weights {estimate.weights / _GIB:.2f} + KV cache {estimate.kv_cache / _GIB:.2f} "
            f"+ buffers {estimate.compute / _GIB:.2f}) but {max(free, 0) / _GIB:.2f} GiB is "
            f"available{after} — {hint}"
        )
    return estimate
