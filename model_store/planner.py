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

import bisect
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from localinfer.model_store.hardware import GPU
from localinfer.model_store.shape import POOLED_SEQUENCES, ModelShape

__all__ = ["DEFAULT_OUTPUTS", "QUALITY", "RUNTIME_OVERHEAD", "ModelShape", "Placement", "Plan",
           "PLAIN_ATTENTION_OUTPUTS", "WontFit", "compute_buffer", "free_memory",
           "layers_per_device", "params_from_tag", "plan", "reserved_outputs", "rough_device",
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
# without flash attention llama.cpp reads a prompt ~1.35x slower where it reserved its compute
# buffer for 4 outputs or fewer than where it did for 32 or more (smollm2's shape, 4,000
# tokens in pieces of 512, 2-core Xeon: 23.5-23.9 s at 2 and 4, 19.0 at 16, 18.1-18.6 at 32
# and 64, 17.3-18.0 for every token; with flash attention 1-2% apart)
PLAIN_ATTENTION_OUTPUTS = 32


# What a process holds on a GPU besides llama.cpp's buffers: the driver's context, the math
# libraries' workspaces and kernels. CUDA measured (bench/gpu_memory.py, see
# bench/results/gpu_h100.md); the others are estimates until a machine measures them.
RUNTIME_OVERHEAD = {"cuda": 608 * _MIB, "rocm": 512 * _MIB, "vulkan": 256 * _MIB,
                    "metal": 64 * _MIB}


@dataclass(frozen=True)
class Placement:
    """One device's share of a plan, in bytes: a GPU's, or what stays in RAM."""

    device: str  # "GPU 0 NVIDIA GeForce RTX 4090", or "RAM"
    index: int | None  # the GPU's index (as `hw` shows it); None for RAM
    layers: int  # of n_layer + 1 (the output layer counts as one)
    weights: int
    kv_cache: int
    compute: int
    runtime: int
    margin: int
    remote: bool = False  # an RPC worker's device: memory on another machine
    recurrent_state: int = 0  # its layers' recurrent states, every slot's
    # a mixture of experts: the layers whose expert tensors are here, and their bytes (of
    # `weights`); RAM holds those the GPU could not take
    experts: tuple[int, ...] = ()
    expert_bytes: int = 0

    @property
    def total(self) -> int:
        return (self.weights + self.kv_cache + self.recurrent_state + self.compute
                + self.runtime + self.margin)


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
    # weights, kv_cache, recurrent_state (where the model has recurrent layers),
    # checkpoints (its slots' context checkpoints, where it keeps any: always in RAM),
    # output_buffer (the logits' rows llama.cpp copies a step's out to: host memory, always),
    # compute (llama.cpp's buffers), runtime (the GPU backend's own overhead), margin
    # (fragmentation), in bytes: every device's, RAM's included (on a GPU plan, the input
    # embeddings of an untied model and the layers the GPUs do not take, the checkpoints
    # and the output buffer)
    parts: dict[str, int] = field(default_factory=dict)
    gpu_bytes: int = 0  # of memory_bytes, what goes on the GPUs (never the host parts)
    # per device: each GPU used, then RAM where layers stay there or an untied model's input
    # embeddings do (a row of no layers where every layer is on a GPU)
    placement: tuple[Placement, ...] = ()
    # how llama.cpp is told: "none" with main_gpu for one GPU; "layer" with tensor_split
    # (a share per GPU index, 0 for one left out) for several
    split_mode: str = "none"
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    # a mixture of experts short of GPU memory: the layers whose expert tensors stay in RAM
    # (LoadOptions.cpu_experts: llama.cpp's tensor_buft_overrides)
    cpu_experts: tuple[int, ...] = ()


class WontFit(Exception):
    pass


def _rank(quant: str) -> int:
    return QUALITY.index(quant) if quant in QUALITY else len(QUALITY)


def reserved_outputs(n_outputs: int, flash_attn: bool) -> int:
    """The outputs a context reserves its compute buffer for (llama_context_params'
    n_outputs_max) where a step asks for n_outputs logits at most: without flash attention,
    at least PLAIN_ATTENTION_OUTPUTS, which reads a prompt faster. The output buffer grows
    only to what steps ask for."""
    return n_outputs if flash_attn else max(n_outputs, PLAIN_ATTENTION_OUTPUTS)


def compute_buffer(shape: ModelShape, n_ctx_stream: int, n_ubatch: int = 512,
                   n_outputs: int = DEFAULT_OUTPUTS, flash_attn: bool = True) -> int:
    """llama.cpp's compute buffer for a micro-batch of n_ubatch tokens, n_outputs of them
    asking for logits (reserved for at least PLAIN_ATTENTION_OUTPUTS without flash
    attention: `reserved_outputs`), over n_ctx_stream cells of one sequence's KV.

    The larger of the logits (f32 × vocabulary per output) and the activations, plus the
    attention masks (f16, n_ubatch × cells, for full and sliding-window layers). Fitted on
    the two embedded models on a CPU, where it is an upper bound: activations 48 and 57
    bytes × n_embd per token (taken as 58), one mask each for smollm2 and two for gemma3
    (taken as two). gemma3 at 512 tokens: 21.8 MiB reported for 1 to 16 outputs, 65.4 for
    64, 514.5 for 512 — llama.cpp's default reserves a whole batch of outputs.
    """
    logits = min(reserved_outputs(n_outputs, flash_attn), n_ubatch) * shape.n_vocab * 4
    activations = n_ubatch * shape.n_embd * 58
    masks = n_ubatch * n_ctx_stream * 2 * 2
    # (an encoder or a recurrent model keeps no cache to score)
    scored = not (flash_attn or shape.encoder) and any(layer.n_head_kv
                                                       for layer in shape.per_layer())
    if scored:  # the scores live while a layer's attention runs, the logits after the last:
        # gemma3 at 2,048 tokens, 32 outputs, 33.3 MiB reported, where the logits alone are 32
        activations += attention_scores(shape, n_ctx_stream, n_ubatch)
    return max(logits, activations) + masks


def attention_scores(shape: ModelShape, n_ctx_stream: int, n_ubatch: int = 512) -> int:
    """What llama.cpp's compute buffer holds more without flash attention: one layer's
    attention scores, f32, for a micro-batch's tokens × the cells of one sequence × the
    query heads. Measured on a CPU, micro-batches of 512: the buffer grows by 40 bytes a
    cell-token for smollm2 (9 heads) and by 132 for a Llama 3.2 1B shape (32), 4 a head and
    4 of mask, which `compute_buffer` already counts; at 8,192 cells 166 and 550 MiB against
    21.5 and 72 with flash attention."""
    return n_ubatch * n_ctx_stream * (shape.n_head or shape.n_head_kv) * 4


def output_rows(shape: ModelShape, rows: int, embeddings: bool = True) -> int:
    """llama.cpp's output buffer for `rows` outputs (host memory, pinned where the output
    layer is on a GPU): a row of vocabulary-wide logits each, and an embedding where the
    context makes them (a pooled one; a chat context does not). A context is made with a row
    a sequence and grows it to the most outputs a decode asks for, never shrinking it
    (llama_context::output_reserve)."""
    return rows * (shape.n_vocab + shape.n_embd * embeddings) * 4


def output_buffers(shape: ModelShape, n_ctx: int, n_outputs: int, n_slots: int) -> int:
    """Every output buffer the model's contexts make (host memory): the chat context's, a
    row of logits for each output a step asks for (at least one a slot), and a pooled
    context's (an embedder's or a reranker's: `pooled_bytes`)."""
    return (output_rows(shape, max(n_outputs, n_slots), embeddings=False)
            + pooled_bytes(shape, n_ctx)[3])


def pooled_bytes(shape: ModelShape, n_ctx: int) -> tuple[int, int, int, int]:
    """The KV, recurrent state, compute buffer and output buffer of an embedder's or
    reranker's pooled context (none for a chat model): its KV F16 with sliding-window layers
    full size, as llama.cpp's defaults make it; a recurrent state for each of the
    POOLED_SEQUENCES inputs a decode may hold (a hybrid's or a recurrent model's); its
    compute buffer, reserved for every token of a micro-batch an output; and its output
    rows (host memory), vocabulary-wide logits and an embedding each: one an input where the
    pooling reads the last token, else every token of a decode (a micro-batch's where a
    causal model's mean is read a micro-batch a decode)."""
    cells = shape.pooled_cells(n_ctx)
    if not cells:
        return 0, 0, 0, 0
    ubatch = min(cells, shape.pooled_ubatch or cells)
    return (shape.kv_bytes(cells, 1, "f16", True, ubatch),
            shape.state_bytes(POOLED_SEQUENCES),
            compute_buffer(shape, cells, ubatch, ubatch),
            output_rows(shape, shape.pooled_outputs or ubatch))


def _margin(total: int) -> int:
    return max(256 * _MIB, total // 20)  # RAM: allocator, fragmentation: 5%, at least 256 MiB


def runtime_overhead(backend: str) -> int:
    return RUNTIME_OVERHEAD.get(backend, 0)


def _gpu_parts(weights: int, kv: int, compute: int, backend: str, state: int = 0
               ) -> dict[str, int]:
    """A model's memory on a GPU, part by part: llama.cpp's buffers, the backend's runtime,
    and 5% of the buffers for fragmentation (a recurrent state only where there is one)."""
    buffers = weights + kv + state + compute
    return {"weights": weights, "kv_cache": kv, **({"recurrent_state": state} if state else {}),
            "compute": compute, "runtime": runtime_overhead(backend), "margin": buffers // 20}


def plan(shape: ModelShape, files: Mapping[str, int], gpus: Sequence[GPU], ram_available: int,
         n_ctx: int = 8192, n_slots: int = 1, kv_type: str = "f16", n_ubatch: int = 512,
         n_outputs: int = DEFAULT_OUTPUTS, swa_full: bool = False, snapshots: int = 0,
         checkpoints: int = 0, checkpoint_cap: int | None = None, flash_attn: bool = True
         ) -> Plan:
    """Raise WontFit (with what would fit) when nothing does.

    n_outputs: logits a step may ask for (at least one per slot): the compute buffer's, and
    the output buffer's rows, host memory wherever the layers go. swa_full: sliding-window
    layers keep every cell (--swa-full); else their window, the engine's default. snapshots:
    copies of each slot's recurrent state kept for rolling guesses back (n_rs_seq).
    checkpoints, checkpoint_cap: the context checkpoints a slot keeps at most, and their
    bytes (LoadOptions.ctx_checkpoints, ctx_checkpoint_mib): host RAM, wherever the layers
    go, so what RAM is left for the rest. flash_attn: off (--no-flash-attn), each compute
    buffer also holds a layer's attention scores."""
    if not files:
        raise WontFit("no GGUF files to choose from")
    held = shape.checkpoints_bytes(n_slots, checkpoints, checkpoint_cap, swa_full)
    if held > ram_available:
        raise WontFit(f"the context checkpoints of {n_slots} slot{'s' * (n_slots > 1)} take "
                      f"{held / _GIB:.2f} GiB of RAM and {ram_available / _GIB:.2f} GiB is "
                      f"available — fewer with --ctx-checkpoints or --ctx-checkpoint-mib")
    n_ctx = min(n_ctx, shape.n_ctx_train) if shape.n_ctx_train else n_ctx
    outputs = output_buffers(shape, n_ctx, n_outputs, n_slots)
    try:
        chosen = _plan(shape, files, gpus, ram_available - held - outputs, n_ctx, n_slots,
                       kv_type, n_ubatch, n_outputs, swa_full, snapshots, flash_attn,
                       host=held + outputs)
    except WontFit as exc:
        if held:
            raise WontFit(f"{exc} (after {held / _GIB:.2f} GiB of context checkpoints: "
                          f"fewer with --ctx-checkpoints or --ctx-checkpoint-mib)") from None
        raise
    return _in_ram(_with_input_embeddings(chosen, shape, files),
                   {"checkpoints": held, "output_buffer": outputs})


def _with_input_embeddings(chosen: Plan, shape: ModelShape, files: Mapping[str, int]) -> Plan:
    """A GPU plan with an untied model's input embeddings where llama.cpp keeps them
    whatever the layers: in RAM (mapped from the file, looked up a row at a time), on the
    RAM row of its placement (one of no layers where every layer is on a GPU)."""
    embd = shape.ram_weights(files[chosen.quant])
    if not chosen.n_gpu_layers or embd <= 0:
        return chosen
    rows = list(chosen.placement)
    at = next((i for i, p in enumerate(rows) if p.index is None), None)
    if at is None:
        rows.append(Placement("RAM", None, 0, embd, 0, 0, 0, 0))
    else:
        rows[at] = replace(rows[at], weights=rows[at].weights + embd)
    parts = {**chosen.parts, "weights": chosen.parts["weights"] + embd}
    return replace(chosen, placement=tuple(rows), parts=parts,
                   memory_bytes=chosen.memory_bytes + embd)


def _in_ram(chosen: Plan, host: Mapping[str, int]) -> Plan:
    """The plan with what llama.cpp keeps in host memory wherever the layers go (its slots'
    context checkpoints, its output buffer): parts of their own after the recurrent state,
    in the whole but not on the GPUs."""
    host = {k: v for k, v in host.items() if v}
    keys = list(chosen.parts)
    at = keys.index("compute")
    parts = {**{k: chosen.parts[k] for k in keys[:at]}, **host,
             **{k: chosen.parts[k] for k in keys[at:]}}
    return replace(chosen, parts=parts, memory_bytes=chosen.memory_bytes + sum(host.values()))


def _tokens(n_ctx: int, n_slots: int) -> str:
    return f"{n_ctx} tokens" + (f" for each of {n_slots} sequences" if n_slots > 1 else "")


def _plan(shape: ModelShape, files: Mapping[str, int], gpus: Sequence[GPU], ram_available: int,
          n_ctx: int, n_slots: int, kv_type: str, n_ubatch: int, n_outputs: int,
          swa_full: bool, snapshots: int, flash_attn: bool, host: int = 0) -> Plan:
    """`plan` but for the host parts (`_in_ram`): ram_available is what their `host` bytes
    leave; n_ctx within what the model was trained for."""
    kv = shape.kv_bytes(n_ctx, n_slots, kv_type, swa_full, n_ubatch)
    state = shape.state_bytes(n_slots, snapshots)
    compute = compute_buffer(shape, n_ctx, n_ubatch, max(n_outputs, n_slots), flash_attn)
    pooled_kv, pooled_state, pooled_compute, _ = pooled_bytes(shape, n_ctx)  # (with the
    # layers; its output buffer is a host part of `plan`'s)
    kv, state, compute = kv + pooled_kv, state + pooled_state, compute + pooled_compute
    ranked = sorted(files, key=_rank)
    capped = [q for q in ranked if _rank(q) >= _SPLIT_CAP] or ranked
    usable = sorted(gpus, key=free_memory, reverse=True)  # the card with the most room first
    local = [g for g in usable if g.backend != "rpc"]
    gpu = usable[0] if usable else None
    common = dict(n_ctx=n_ctx, n_slots=n_slots, kv_type=kv_type)
    gib = lambda n: f"{n / _GIB:.1f} GiB"  # noqa: E731
    context = (kv, state)

    if gpu is not None and not local:  # a CPU head and workers: the layers shared out
        pooled = _pooled(shape, files, usable, ram_available, context, compute, common)
        if pooled is not None:
            return pooled
    if gpu is not None:
        for quant in ranked:  # whole on the GPU with the most room; else spread over all
            weights = shape.gpu_weights(files[quant])
            parts = _gpu_parts(weights, kv, compute, gpu.backend, state)
            need = sum(parts.values())
            if need <= free_memory(gpu) and gpu.backend != "rpc":  # (a worker's: shared)
                device = Placement(_name(gpu), gpu.index, shape.n_layer + 1, **parts)
                return Plan(quant, gpu.backend, shape.n_layer + 1, memory_bytes=need, **common,
                            parts=parts, gpu_bytes=need, placement=(device,),
                            main_gpu=gpu.index,
                            reason=f"{quant} fits fully on {gpu.name} ({gib(need)} of "
                                   f"{gib(free_memory(gpu))} free) with a {n_ctx}-token context")
            spread = _spread(shape, weights, kv + state, compute, usable, shape.n_layer + 1)
            if spread is not None:
                return _plan_on(quant, spread, shape, weights, context, compute, gpu.backend,
                                common,
                                reason=f"{quant} fits no one GPU; split over "
                                       f"{_names(spread)} in proportion to their free memory, "
                                       f"with a {n_ctx}-token context")
        if shape.moe and local:  # experts to RAM first, then back layer by layer
            for quant in capped:
                moe = _experts_out(shape, quant, files[quant], local[0], ram_available,
                                   context, compute, common)
                if moe is not None:
                    return moe
        for quant in capped:  # the layers the GPUs can take; the rest in RAM
            weights = shape.gpu_weights(files[quant])
            per_layer = (weights + kv + state) / max(shape.n_layer, 1)
            layers = min(shape.n_layer, int(sum(_room(g, compute) for g in usable) // per_layer))
            spread = None
            while layers > 0 and spread is None:  # (dealt out, a GPU may get one too many)
                spread = _spread(shape, weights, kv + state, compute, usable, layers,
                                 alone=True)
                layers -= spread is None
            # (and the input embeddings of an untied model, whatever the layers)
            in_ram = (shape.n_layer - layers) * per_layer + shape.ram_weights(files[quant])
            if spread is None or in_ram + _margin(int(in_ram)) > ram_available:
                continue
            on = "the GPU" if len(spread) == 1 else _names(spread)
            return _plan_on(quant, spread, shape, weights, context, compute, gpu.backend,
                            common, layers=layers,
                            reason=f"no quant fits {_names(usable)} at {_tokens(n_ctx, n_slots)}; "
                                   f"{quant} with {layers} of {shape.n_layer} layers on {on}, "
                                   f"the rest in RAM")
    for quant in capped:
        need = files[quant] + kv + state + compute
        margin = _margin(need)
        if need + margin <= ram_available:
            where = "no GPU was found" if gpu is None else "the GPU cannot take a layer"
            parts = {"weights": files[quant], "kv_cache": kv,
                     **({"recurrent_state": state} if state else {}), "compute": compute,
                     "runtime": 0, "margin": margin}
            return Plan(quant, "cpu", 0, memory_bytes=need + margin, **common, parts=parts,
                        reason=f"{where}; {quant} runs on the CPU in "
                               f"{gib(need + margin + host)} of "
                               f"{gib(ram_available + host)} available RAM")
    smallest = min(files, key=files.get)
    room = max(free_memory(gpu) if gpu else 0, ram_available)
    per_token = shape.kv_bytes_per_token(kv_type) * n_slots
    fixed = files[smallest] + compute + state
    fits_ctx = int((room * 0.95 - fixed - 256 * _MIB) // per_token) if per_token else 0
    hint = (f"a context of {fits_ctx} tokens would fit with {smallest}" if fits_ctx >= 512
            else "fewer sequences at once (--parallel)" if n_slots > 1
            else "pick a smaller model")
    raise WontFit(f"no quant fits at {_tokens(n_ctx, n_slots)}: the smallest, {smallest}, needs "
                  f"{gib(fixed + kv)} and {gib(room)} is free — {hint}")


def _pooled(shape: ModelShape, files: Mapping[str, int], remote: Sequence[GPU],
            ram_available: int, context: tuple[int, int], compute: int, common: dict
            ) -> Plan | None:
    """A CPU head with workers: the best quant whose layers the head's RAM and the workers'
    devices hold together, each taking layers in proportion to its room. The head keeps the
    first layers and the input embeddings (llama.cpp's order: what is not offloaded is the
    first layers), the workers the rest. None when no quant fits the pool."""
    total_layers = shape.n_layer + 1
    kv = sum(context)  # (KV and recurrent state go with their layers)
    for quant in sorted(files, key=_rank):
        weights = shape.gpu_weights(files[quant])
        per_layer = (weights + kv) / max(shape.n_layer, 1)
        head_fixed = shape.ram_weights(files[quant]) + compute  # input embeddings and a compute buffer
        head_room = max(0.0, (ram_available - head_fixed) / 1.05 - 256 * _MIB)
        rooms = {g: _room(g, compute) for g in remote}
        rooms = {g: r for g, r in rooms.items() if r >= per_layer}
        pool = head_room + sum(rooms.values())
        if not rooms or pool < per_layer * total_layers:
            continue
        cpu_layers = min(shape.n_layer, int(total_layers * head_room / pool))
        spread = None
        while spread is None and cpu_layers <= shape.n_layer:  # rounding: one more at home
            spread = _spread(shape, weights, kv, compute, list(rooms), total_layers - cpu_layers,
                             alone=True)
            cpu_layers += spread is None
        # (+1: the output layer stays here too: the runner keeps it off the last device)
        if spread is None or (cpu_layers + 1) * per_layer > head_room:
            continue
        on = _names(spread) if len(spread) > 1 else _name(next(iter(spread)))
        chosen = _plan_on(quant, spread, shape, weights, context, compute, "rpc", common,
                          layers=total_layers - cpu_layers,
                          reason=f"{quant} shared by this machine's RAM ({cpu_layers} of "
                                 f"{shape.n_layer} layers and the output layer) and {on} "
                                 f"({total_layers - cpu_layers - 1}), in proportion to their "
                                 f"free memory, with a {common['n_ctx']}-token context")
        return _output_here(chosen, weights // total_layers)
    return None


def _output_here(chosen: Plan, output_weights: int) -> Plan:
    """The plan with the output layer (dealt by llama.cpp to the last device) in RAM."""
    devices = [p for p in chosen.placement if p.index is not None]
    last = max(devices, key=lambda p: p.index)
    moved = []
    for p in chosen.placement:
        if p is last:
            p = replace(p, layers=p.layers - 1, weights=p.weights - output_weights)
        elif p.index is None:
            p = replace(p, layers=p.layers + 1, weights=p.weights + output_weights)
        moved.append(p)
    return replace(chosen, placement=tuple(moved),
                   gpu_bytes=chosen.gpu_bytes - output_weights)


def free_memory(gpu: GPU) -> int:
    """What the plan may use of a GPU: its free memory, or all of it where none is reported."""
    return gpu.free_bytes if gpu.free_bytes is not None else gpu.total_bytes


def _name(gpu: GPU) -> str:
    """"GPU 0 NVIDIA GeForce RTX 4090"; a worker's device: "worker 10.0.0.5:50052/CPU"."""
    return f"worker {gpu.name}" if gpu.backend == "rpc" else f"GPU {gpu.index} {gpu.name}"


def _label(gpu: GPU) -> str:
    return _name(gpu) if gpu.backend == "rpc" else f"GPU {gpu.index}"


def _names(gpus: Sequence[GPU] | Mapping[GPU, int]) -> str:
    gpus = list(gpus)
    return gpus[0].name if len(gpus) == 1 else " + ".join(_label(g) for g in gpus)


def _room(gpu: GPU, compute: int) -> float:
    """Bytes of layers (weights and KV) a GPU can hold: its free memory less the backend's
    runtime, a compute buffer of its own, and 5% of its buffers for fragmentation."""
    return max(0.0, (free_memory(gpu) - runtime_overhead(gpu.backend)) / 1.05 - compute)


def layers_per_device(n_layer: int, n_gpu_layers: int, split: Sequence[float]) -> list[int]:
    """How llama.cpp deals n_gpu_layers of the n_layer + 1 (the output layer last) out to
    devices in proportion to `split`: layer il goes to the first device whose cumulative
    share exceeds (il - first offloaded) / n_gpu_layers (llama-model.cpp)."""
    n_gpu_layers = min(n_gpu_layers, n_layer + 1)
    total = sum(split)
    if not n_gpu_layers or not total:
        return [0] * len(split)
    bounds = list(itertools.accumulate(x / total for x in split))
    first = n_layer + 1 - n_gpu_layers
    counts = [0] * len(split)
    for il in range(first, n_layer + 1):
        counts[min(bisect.bisect_right(bounds, (il - first) / n_gpu_layers), len(split) - 1)] += 1
    return counts


def _spread(shape: ModelShape, weights: int, kv: int, compute: int, gpus: Sequence[GPU],
            n_gpu_layers: int, alone: bool = False) -> dict[GPU, int] | None:
    """GPU → layers for n_gpu_layers of the model over the GPUs, each taking layers in
    proportion to its room (free memory less its fixed costs); None when not every GPU given
    its share can hold it, or (unless `alone`) when only one GPU has room."""
    per_layer = (weights + kv) / max(shape.n_layer, 1)  # (as the layer count reckons)
    rooms = {g: _room(g, compute) for g in gpus}
    rooms = {g: r for g, r in rooms.items() if r >= per_layer}  # a GPU too full for a layer
    if n_gpu_layers < 1 or len(rooms) < (1 if alone else 2):
        return None
    counts = layers_per_device(shape.n_layer, n_gpu_layers, list(rooms.values()))
    placed = {g: n for g, n in zip(rooms, counts) if n}
    if all(n * per_layer <= rooms[g] for g, n in placed.items()):
        return placed
    return None


def _plan_on(quant: str, spread: dict[GPU, int], shape: ModelShape, weights: int,
             context: tuple[int, int], compute: int, backend: str, common: dict, reason: str,
             layers: int | None = None) -> Plan:
    """A plan with layers on one or several GPUs (and, for a partial offload, the rest in
    RAM): each device's share of the weights, KV and recurrent state by its layers."""
    total_layers = shape.n_layer + 1
    kv, state = context
    placement, on_gpu = [], 0
    for gpu, n in spread.items():
        share_w, share_kv = weights * n // total_layers, kv * n // total_layers
        share_state = state * n // total_layers
        margin = (share_w + share_kv + share_state + compute) // 20
        device = Placement(_name(gpu), gpu.index, n, share_w, share_kv, compute,
                           runtime_overhead(gpu.backend), margin, remote=gpu.backend == "rpc",
                           recurrent_state=share_state)
        placement.append(device)
        on_gpu += device.total
    n_gpu_layers = total_layers if layers is None else layers
    if layers is not None:  # the rest in RAM
        rest_w = weights - sum(p.weights for p in placement)
        rest_kv = kv - sum(p.kv_cache for p in placement)
        rest_state = state - sum(p.recurrent_state for p in placement)
        placement.append(Placement("RAM", None, total_layers - sum(spread.values()), rest_w,
                                   rest_kv, 0, 0, _margin(rest_w + rest_kv + rest_state),
                                   recurrent_state=rest_state))
    parts = _parts(placement)
    split = [0.0] * (max(g.index for g in spread) + 1)
    for gpu, n in spread.items():
        split[gpu.index] = n / sum(spread.values())
    several = len(spread) > 1
    return Plan(quant, backend, n_gpu_layers, memory_bytes=sum(parts.values()), **common,
                parts=parts, gpu_bytes=on_gpu, placement=tuple(placement),
                split_mode="layer" if several else "none",
                main_gpu=next(iter(spread)).index,
                tensor_split=tuple(split) if several else (), reason=reason)


def _parts(placement: Sequence[Placement]) -> dict[str, int]:
    """A plan's parts, each the sum of the devices' (a recurrent state where there is one)."""
    keys = ("weights", "kv_cache", "recurrent_state", "compute", "runtime", "margin")
    parts = {key: sum(getattr(p, key) for p in placement) for key in keys}
    if not parts["recurrent_state"]:
        del parts["recurrent_state"]
    return parts


def _experts_out(shape: ModelShape, quant: str, file_size: int, gpu: GPU, ram_available: int,
                 context: tuple[int, int], compute: int, common: dict) -> Plan | None:
    """A mixture of experts on a GPU short of memory for all of it, placed as llama.cpp's
    --fit places one (common/fit.cpp): every layer's attention, shared weights, KV and
    state on the GPU, the expert tensors (ffn_*_exps) in RAM, then the first layers'
    experts back onto the GPU, a layer at a time, while they fit. Where even the rest does
    not fit, as many layers as fit go to the GPU without their experts. None when no layer
    fits, or RAM cannot hold what stays there."""
    kv, state = context
    n = shape.n_layer
    weights = shape.gpu_weights(file_size)
    experts = shape.expert_bytes(file_size)
    dense = weights - sum(experts)
    room = _room(gpu, compute)  # bytes of layers the GPU holds
    if dense + kv + state <= room:
        layers, budget, back = n + 1, room - dense - kv - state, 0
        while back < n and experts[back] <= budget:
            budget -= experts[back]
            back += 1
        on_gpu = (dense, kv, state)
    else:  # dense-only layers, back to front; every expert in RAM
        layers, back = min(n, int(room // ((dense + kv + state) / max(n, 1)))), 0
        on_gpu = tuple(x * layers // (n + 1) for x in (dense, kv, state))
        if layers < 1:
            return None
    gpu_experts = tuple(i for i in range(back) if experts[i])
    cpu_experts = tuple(i for i in range(back, n) if experts[i])
    in_gpu = sum(experts[:back])
    in_ram = sum(experts) - in_gpu + dense - on_gpu[0]
    ram_context = kv - on_gpu[1] + state - on_gpu[2]
    held = in_ram + ram_context + shape.ram_weights(file_size)  # (the input embeddings: there too)
    if held + _margin(held) > ram_available:
        return None
    device_weights = on_gpu[0] + in_gpu
    placement = (
        Placement(_name(gpu), gpu.index, layers, device_weights, on_gpu[1], compute,
                  runtime_overhead(gpu.backend),
                  (device_weights + on_gpu[1] + on_gpu[2] + compute) // 20,
                  recurrent_state=on_gpu[2], experts=gpu_experts, expert_bytes=in_gpu),
        Placement("RAM", None, n + 1 - layers, in_ram, kv - on_gpu[1], 0, 0,
                  _margin(in_ram + ram_context), recurrent_state=state - on_gpu[2],
                  experts=cpu_experts, expert_bytes=sum(experts) - in_gpu))
    parts = _parts(placement)
    n_moe = len(gpu_experts) + len(cpu_experts)
    reason = (f"{quant} fits {gpu.name} with the experts of {len(cpu_experts)} of {n_moe} "
              f"layers in RAM (attention, shared weights and KV on the GPU)"
              if layers > n else
              f"{quant}: {layers} of {n} layers on {gpu.name} without their experts; the "
              f"experts and the other layers in RAM")
    return Plan(quant, gpu.backend, layers, memory_bytes=sum(parts.values()), **common,
                parts=parts, gpu_bytes=placement[0].total, placement=placement,
                main_gpu=gpu.index, cpu_experts=cpu_experts,
                reason=f"{reason}, with a {common['n_ctx']}-token context")


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
