"""Memory arithmetic for one model: weights + KV cache + compute buffers.

The first piece of the fit planner: it answers "does this context fit in RAM?" and,
in reverse, "what is the largest context that does?".
"""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.errors import ContextTooLarge
from localinfer.model_store.gguf_info import GGUFInfo, ProjectorInfo
from localinfer.model_store.planner import (DEFAULT_OUTPUTS, compute_buffer, output_buffers,
                                            pooled_bytes)

__all__ = ["MemoryEstimate", "beyond_training", "check_context", "estimate_memory", "max_context",
           "projector_memory"]

_MIB = 1024 * 1024
_GIB = 1024 * _MIB


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    kv_cache: int
    compute: int
    n_vocab: int = 0
    recurrent_state: int = 0  # every slot's, where the model has recurrent layers
    checkpoints: int = 0  # every slot's context checkpoints at most: host RAM, always
    outputs: int = 0  # the output buffers, a row of logits per output: host RAM, always

    @property
    def total(self) -> int:
        """What llama.cpp reserves (its load log's model, KV, RS, compute and output
        buffers): on a GPU, all of it but the output buffer (the checkpoints are not
        llama.cpp's)."""
        return (self.weights + self.kv_cache + self.recurrent_state + self.compute
                + self.outputs)

    @property
    def resident(self) -> int:
        """What a CPU process grows by after a full-chunk prefill: weights, KV, and 24 MiB +
        220 bytes per vocabulary entry for the rest (the vocabulary's tables, output and
        compute buffers, the runtime). Fitted to the RSS growth of the two embedded models
        (smollm2, 49k: 37 MB past weights and KV; gemma3, 262k: 79–85 MB): a calibration on
        two points, checked by a test, not a law. With the checkpoints, once saved."""
        return (self.weights + self.kv_cache + self.recurrent_state + self.checkpoints
                + _host_bytes(self.n_vocab))

    @property
    def ram(self) -> int:
        """What the RAM check asks for: llama.cpp's reservations or the measured growth,
        whichever is more, and the checkpoints beside them."""
        return max(self.total + self.checkpoints, self.resident)


def _host_bytes(n_vocab: int) -> int:
    return 24 * _MIB + 220 * n_vocab


def projector_memory(projector: ProjectorInfo) -> int:
    """What a vision projector holds once libmtmd has loaded it: its weights, and the compute
    buffer of one image. With flash attention (libmtmd's default where the backend has it)
    the buffer's peak is a block's activations, f32: per patch the feed-forward's width and
    three of the tower's (q, k, v); or, if more, the first step's: the resized image and its
    patches laid out for the patch convolution (f32 + f16, 18 bytes a pixel). Exactly what
    llama.cpp's CPU backend reserves for Gemma 3's tower at 896 and 448 px and for a narrow
    one at 896 (tests/model_store/test_fit.py)."""
    blocks = 4 * projector.n_patches * (projector.n_ff + 3 * projector.n_embd)
    first = 18 * projector.image_size ** 2
    return projector.file_size + max(blocks, first)


def estimate_memory(info: GGUFInfo, n_ctx: int, n_slots: int = 1, n_ubatch: int = 512,
                    kv_type: str = "f16", n_outputs: int = DEFAULT_OUTPUTS,
                    swa_full: bool = False, snapshots: int = 0, checkpoints: int = 0,
                    checkpoint_cap: int | None = None, flash_attn: bool = True
                    ) -> MemoryEstimate:
    """n_ctx per slot; n_outputs: the most logits a step asks for (LoadOptions.n_outputs);
    swa_full: sliding-window layers keep every cell (--swa-full), else their window (the
    engine's default); snapshots: copies of each slot's recurrent state (llama.cpp's n_rs_seq);
    checkpoints, checkpoint_cap: context checkpoints a slot keeps at most, and their bytes;
    flash_attn: off, the compute buffer also holds a layer's attention scores."""
    shape = info.shape()
    pooled_kv, pooled_state, pooled_compute, _ = pooled_bytes(shape, n_ctx)
    kv = shape.kv_bytes(n_ctx, n_slots, kv_type, swa_full, n_ubatch) + pooled_kv
    compute = compute_buffer(shape, n_ctx, n_ubatch, max(n_outputs, n_slots),
                             flash_attn) + pooled_compute
    return MemoryEstimate(info.file_size, kv, compute, info.n_vocab,
                          shape.state_bytes(n_slots, snapshots) + pooled_state,
                          shape.checkpoints_bytes(n_slots, checkpoints, checkpoint_cap,
                                                  swa_full),
                          output_buffers(shape, n_ctx, n_outputs, n_slots))


def max_context(info: GGUFInfo, available: int, n_slots: int = 1, n_ubatch: int = 512,
                kv_type: str = "f16", n_outputs: int = DEFAULT_OUTPUTS,
                snapshots: int = 0, swa_full: bool = False, checkpoints: int = 0,
                checkpoint_cap: int | None = None, flash_attn: bool = True) -> int:
    """The largest per-slot context that fits in `available` bytes (0 if none does)."""
    def fits(n_ctx: int) -> bool:
        return estimate_memory(info, n_ctx, n_slots, n_ubatch, kv_type, n_outputs,
                               swa_full, snapshots, checkpoints=checkpoints,
                               checkpoint_cap=checkpoint_cap,
                               flash_attn=flash_attn).ram <= available

    low, high = 0, info.n_ctx_train or 1 << 24
    if fits(high):
        return high
    while high - low > 1:  # fits(low) or low == 0; not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def beyond_training(info: GGUFInfo, n_ctx: int, name: str | None = None) -> str | None:
    """What to say of a context longer than the model was trained for (None: it is not):
    `run` and the server refuse one, and `show` plans none."""
    if not info.n_ctx_train or n_ctx <= info.n_ctx_train:
        return None
    return (f"a context of {n_ctx} tokens is more than the {info.n_ctx_train} "
            f"'{name or info.name}' was trained for — use --ctx {info.n_ctx_train} or less")


def check_context(info: GGUFInfo, n_ctx: int, n_slots: int, available: int,
                  n_ubatch: int = 512, name: str | None = None,
                  kv_type: str = "f16",
                  beside: tuple[int, str] = (0, ""), n_outputs: int = DEFAULT_OUTPUTS,
                  snapshots: int = 0, swa_full: bool = False, checkpoints: int = 0,
                  checkpoint_cap: int | None = None, flash_attn: bool = True) -> MemoryEstimate:
    """Raise ContextTooLarge, with the numbers and what to do, unless the context fits.

    beside: bytes taken by something loaded with the model (a draft model), and its name.
    """
    name = name or info.name
    taken, what = beside
    free = available - taken
    beyond = beyond_training(info, n_ctx, name)
    if beyond:
        raise ContextTooLarge(beyond)
    also = dict(checkpoints=checkpoints, checkpoint_cap=checkpoint_cap, flash_attn=flash_attn)
    estimate = estimate_memory(info, n_ctx, n_slots, n_ubatch, kv_type, n_outputs,
                               swa_full, snapshots, **also)
    if estimate.ram > free:
        fits = max_context(info, free, n_slots, n_ubatch, kv_type, n_outputs, snapshots,
                           swa_full, **also)
        hint = f"use --ctx {fits} or less" if fits else "free some memory or pick a smaller model"
        if estimate.checkpoints:
            hint += " (or keep fewer context checkpoints: --ctx-checkpoints, --ctx-checkpoint-mib)"
        after = f" after {taken / _GIB:.2f} GiB for {what}" if taken else ""
        state = estimate.recurrent_state + estimate.checkpoints
        said = (f" + recurrent state {estimate.recurrent_state / _GIB:.2f}"
                if estimate.recurrent_state else "")
        said += (f" + checkpoints {estimate.checkpoints / _GIB:.2f}"
                 if estimate.checkpoints else "")
        raise ContextTooLarge(
            f"a context of {n_ctx} tokens needs about {estimate.ram / _GIB:.2f} GiB "
            f"(weights {estimate.weights / _GIB:.2f} + KV cache {estimate.kv_cache / _GIB:.2f}"
            f"{said} + buffers "
            f"{(estimate.ram - estimate.weights - estimate.kv_cache - state) / _GIB:.2f}) "
            f"but {max(free, 0) / _GIB:.2f} GiB is "
            f"available{after} — {hint}"
        )
    return estimate
