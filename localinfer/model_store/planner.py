"""The fit planner: which quant, on which device, with how many GPU layers, at what context.

A pure function of the model's shape (from GGUF metadata), the files on offer (quant →
size), the devices and the request, so tables of machines can test it. The rules:

1. Fully on the GPU: the best quant in QUALITY order whose weights + KV cache + compute
   buffer + margin fit the GPU's free memory at the requested context.
2. Otherwise partial offload: the best quant no better than Q4_K_M (on a split, speed is bound
   by the layers left on the CPU, so bigger files are slower for little gain) that fits GPU
   and RAM together; as many layers on the GPU as fit, each bringing its KV cache with it.
3. Otherwise CPU only, the same cap, in available RAM.
4. Otherwise "won't fit", naming the largest context that would fit with the smallest quant.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from localinfer.model_store.hardware import GPU
from localinfer.settings import KvType

__all__ = ["DEFAULT_OUTPUTS", "QUALITY", "RUNTIME_OVERHEAD", "ModelShape", "Plan", "WontFit",
           "compute_buffer", "free_memory", "params_from_tag", "plan", "rough_device",
           "runtime_overhead"]

QUALITY = ("F32", "BF16", "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_0", "Q4_K_M", "Q4_K_S",
           "IQ4_NL", "IQ4_XS", "Q4_1", "Q4_0", "Q3_K_L", "Q3_K_M", "IQ3_M", "Q3_K_S", "IQ3_XS",
           "IQ3_XXS", "Q2_K", "IQ2_M", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S")
_SPLIT_CAP = QUALITY.index("Q4_K_M")
_MIB = 1024 * 1024
_GIB = 1024 * _MIB
# logits a step may ask for when the caller does not say (LoadOptions.n_outputs does): room
# for a few slots, or a lone stream's token and 8 guesses
DEFAULT_OUTPUTS = 16


KV_BYTES = {KvType.F16: 2.0, KvType.Q8_0: 34 / 32, KvType.Q4_0: 18 / 32}  # per element, with
# block scales (a StrEnum: the plain names index it as well)
# What a process holds on a GPU besides llama.cpp's buffers: the driver's context, the math
# libraries' workspaces and kernels. CUDA measured (bench/gpu_memory.py, see
# bench/results/gpu_h100.md); the others are estimates until a machine measures them.
RUNTIME_OVERHEAD = {"cuda": 608 * _MIB, "rocm": 512 * _MIB, "vulkan": 256 * _MIB,
                    "metal": 64 * _MIB}


@dataclass(frozen=True)
class ModelShape:
    n_layer: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    input_embd_share: float = 0.0  # of the weights, what stays in RAM (GGUFInfo says)

    def gpu_weights(self, file_size: int) -> int:
        """Of a file's weights, what a full offload puts on the GPU."""
        return int(file_size * (1 - self.input_embd_share))

    def kv_bytes_per_token(self, kv_type: str = "f16") -> float:
        """K and V for one token across all layers, as llama.cpp stores them: the one formula
        (every KV total is this times the cells)."""
        return self.n_layer * self.n_head_kv * (self.head_dim_k + self.head_dim_v) * KV_BYTES[kv_type]


@dataclass(frozen=True)
class Plan:
    quant: str
    device: str  # "cuda", "metal", "rocm" or "cpu"
    n_gpu_layers: int  # 0 for CPU; n_layer + 1 means everything, output layer included
    n_ctx: int
    n_slots: int
    kv_type: str
    memory_bytes: int  # the whole estimate: the sum of `parts`
    reason: str
    # weights, kv_cache, compute (llama.cpp's buffers), runtime (the GPU backend's own
    # overhead), margin (fragmentation), in bytes: on a GPU plan, what the GPU takes with
    # every layer on it (the input embeddings of an untied model stay in RAM); on the CPU, RAM
    parts: dict[str, int] = field(default_factory=dict)
    gpu_bytes: int = 0  # of memory_bytes, what goes on the GPU


class WontFit(Exception):
    pass


def _rank(quant: str) -> int:
    return QUALITY.index(quant) if quant in QUALITY else len(QUALITY)


def compute_buffer(shape: ModelShape, n_ctx_stream: int, n_ubatch: int = 512,
                   n_outputs: int = DEFAULT_OUTPUTS) -> int:
    """llama.cpp's compute buffer for a micro-batch of n_ubatch tokens, n_outputs of them
    asking for logits, over n_ctx_stream cells of one sequence's KV.

    The larger of the logits (f32 × vocabulary per output) and the activations, plus the
    attention masks (f16, n_ubatch × cells, for full and sliding-window layers). Fitted on
    the two embedded models on a CPU, where it is an upper bound: activations 48 and 57
    bytes × n_embd per token (taken as 58), one mask each for smollm2 and two for gemma3
    (taken as two). gemma3 at 512 tokens: 21.8 MiB reported for 1 to 16 outputs, 65.4 for
    64, 514.5 for 512 — llama.cpp's default reserves a whole batch of outputs.
    """
    logits = min(n_outputs, n_ubatch) * shape.n_vocab * 4
    activations = n_ubatch * shape.n_embd * 58
    masks = n_ubatch * n_ctx_stream * 2 * 2
    return max(logits, activations) + masks


def _margin(total: int) -> int:
    return max(256 * _MIB, total // 20)  # RAM: allocator, fragmentation: 5%, at least 256 MiB


def runtime_overhead(backend: str) -> int:
    return RUNTIME_OVERHEAD.get(backend, 0)


def _gpu_parts(weights: int, kv: int, compute: int, backend: str) -> dict[str, int]:
    """A model's memory on a GPU, part by part: llama.cpp's buffers, the backend's runtime,
    and 5% of the buffers for fragmentation."""
    buffers = weights + kv + compute
    return {"weights": weights, "kv_cache": kv, "compute": compute,
            "runtime": runtime_overhead(backend), "margin": buffers // 20}


def plan(shape: ModelShape, files: Mapping[str, int], gpus: Sequence[GPU], ram_available: int,
         n_ctx: int = 8192, n_slots: int = 1, kv_type: str = "f16", n_ubatch: int = 512,
         n_outputs: int = DEFAULT_OUTPUTS) -> Plan:
    """Raise WontFit (with what would fit) when nothing does.

    n_outputs: logits a step may ask for (at least one per slot)."""
    if not files:
        raise WontFit("no GGUF files to choose from")
    n_ctx = min(n_ctx, shape.n_ctx_train) if shape.n_ctx_train else n_ctx
    kv = int(shape.kv_bytes_per_token(kv_type) * n_ctx * n_slots)
    compute = compute_buffer(shape, n_ctx, n_ubatch, max(n_outputs, n_slots))
    ranked = sorted(files, key=_rank)
    capped = [q for q in ranked if _rank(q) >= _SPLIT_CAP] or ranked
    gpu = max(gpus, key=free_memory, default=None)
    common = dict(n_ctx=n_ctx, n_slots=n_slots, kv_type=kv_type)
    gib = lambda n: f"{n / _GIB:.1f} GiB"  # noqa: E731

    if gpu is not None:
        budget = free_memory(gpu)
        for quant in ranked:
            parts = _gpu_parts(shape.gpu_weights(files[quant]), kv, compute, gpu.backend)
            need = sum(parts.values())
            if need <= budget:
                return Plan(quant, gpu.backend, shape.n_layer + 1, memory_bytes=need, **common,
                            parts=parts, gpu_bytes=need,
                            reason=f"{quant} fits fully on {gpu.name} ({gib(need)} of "
                                   f"{gib(budget)} free) with a {n_ctx}-token context")
        for quant in capped:
            split = _split(shape, shape.gpu_weights(files[quant]), kv, compute, budget,
                           ram_available, gpu.backend)
            if split is not None:
                layers, parts, on_gpu = split
                return Plan(quant, gpu.backend, layers, memory_bytes=sum(parts.values()),
                            **common, parts=parts, gpu_bytes=on_gpu,
                            reason=f"no quant fits {gpu.name}'s {gib(budget)} at {n_ctx} tokens; "
                                   f"{quant} with {layers} of {shape.n_layer} layers on the GPU, "
                                   f"the rest in RAM")
    for quant in capped:
        need = files[quant] + kv + compute
        margin = _margin(need)
        if need + margin <= ram_available:
            where = "no GPU was found" if gpu is None else "the GPU cannot take a layer"
            parts = {"weights": files[quant], "kv_cache": kv, "compute": compute, "runtime": 0,
                     "margin": margin}
            return Plan(quant, "cpu", 0, memory_bytes=need + margin, **common, parts=parts,
                        reason=f"{where}; {quant} runs on the CPU in {gib(need + margin)} of "
                               f"{gib(ram_available)} available RAM")
    smallest = min(files, key=files.get)
    room = max(free_memory(gpu) if gpu else 0, ram_available)
    per_token = shape.kv_bytes_per_token(kv_type) * n_slots
    fixed = files[smallest] + compute
    fits_ctx = int((room * 0.95 - fixed - 256 * _MIB) // per_token) if per_token else 0
    hint = (f"a context of {fits_ctx} tokens would fit with {smallest}" if fits_ctx >= 512
            else "pick a smaller model")
    raise WontFit(f"no quant fits at {n_ctx} tokens: the smallest, {smallest}, needs "
                  f"{gib(fixed + kv)} and {gib(room)} is free — {hint}")


def free_memory(gpu: GPU) -> int:
    """What the plan may use of a GPU: its free memory, or all of it where none is reported."""
    return gpu.free_bytes if gpu.free_bytes is not None else gpu.total_bytes


def _split(shape: ModelShape, weights: int, kv: int, compute: int, gpu_budget: int,
           ram: int, backend: str) -> tuple[int, dict[str, int], int] | None:
    """Layers on the GPU for a partial offload, the memory's parts and what of it goes on
    the GPU, or None."""
    per_layer = (weights + kv) / max(shape.n_layer, 1)
    room = gpu_budget - compute - runtime_overhead(backend) - gpu_budget // 20
    layers = min(shape.n_layer, int(room // per_layer)) if room > 0 else 0
    if layers < 1:
        return None
    in_ram = (shape.n_layer - layers) * per_layer
    if in_ram + _margin(int(in_ram)) > ram:
        return None
    parts = _gpu_parts(weights, kv, compute, backend)
    on_gpu = int(layers * per_layer) + compute + parts["runtime"] + parts["margin"]
    return layers, parts, on_gpu


# Average bits per weight of Q4_K_M files (mixed 4- and 6-bit blocks with scales).
_Q4_K_M_BITS = 4.85
_SIZE_TAG = re.compile(r"(?:^|[^a-z0-9.])(\d+(?:\.\d+)?)([bm])$", re.IGNORECASE)


def params_from_tag(tag: str) -> int | None:
    """Parameters from a size tag: "8b" → 8e9, "135m" → 1.35e8; None when it names none."""
    match = _SIZE_TAG.search(tag)
    if not match:
        return None
    return int(float(match.group(1)) * (1e9 if match.group(2).lower() == "b" else 1e6))


def rough_device(n_params: int, gpus: Sequence[GPU], ram_available: int) -> str | None:
    """Where a model of this size would likely run at Q4_K_M, before its file is known:
    "gpu", "partial", "cpu" or None (won't fit). An estimate — 15% and 512 MiB on top of
    the weights stand in for the KV cache and buffers; `plan` decides once the header is read.
    """
    need = n_params * _Q4_K_M_BITS / 8 * 1.15 + 512 * _MIB
    budget = max((free_memory(g) for g in gpus), default=0)
    if budget and need <= budget:
        return "gpu"
    if budget and need <= budget + ram_available:
        return "partial"
    return "cpu" if need <= ram_available else None
