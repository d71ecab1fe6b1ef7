"""The fit planner on a table of machines, with a real model's shape and real file sizes."""

from __future__ import annotations

import pytest

from localinfer.model_store.hardware import GPU, apple_gpu_share
from localinfer.model_store.planner import ModelShape, Placement, WontFit, plan
from localinfer.model_store.shape import Layer

GB = 10**9
GIB = 2**30

# Llama 3.1 8B Instruct: 32 layers, 8 KV heads of 128 (GQA), 128k vocabulary, an output layer
# of its own (so its 525M input-embedding weights of 8.03B stay in RAM); file sizes as
# published for its GGUF quants
LLAMA31_8B = ModelShape(n_layer=32, n_head_kv=8, head_dim_k=128, head_dim_v=128,
                        n_vocab=128256, n_ctx_train=131072, n_embd=4096,
                        input_embd_share=128256 * 4096 / 8_030_261_248)
FILES_8B = {"F16": 16.07 * GB, "Q8_0": 8.54 * GB, "Q6_K": 6.60 * GB, "Q5_K_M": 5.73 * GB,
            "Q4_K_M": 4.92 * GB, "IQ4_XS": 4.45 * GB, "Q3_K_M": 4.02 * GB, "Q2_K": 3.18 * GB}
FILES_8B = {k: int(v) for k, v in FILES_8B.items()}


def nvidia(name: str, total_mib: int, free_mib: int) -> GPU:
    return GPU("nvidia", 0, name, total_mib * 2**20, free_mib * 2**20, "cuda", "550.54.14")


def apple(total_gib: int) -> GPU:
    return GPU("apple", 0, "Apple M2 GPU", apple_gpu_share(total_gib * GIB), None, "metal")


@pytest.mark.parametrize("gpu,ram_gib,quant,device,layers", [
    # 17 layers: CUDA's own 608 MiB (measured on an H100: context, cuBLAS) count against
    # the 4 GiB, the input embeddings that stay in RAM do not
    (nvidia("NVIDIA GeForce GTX 1650", 4096, 3890), 16, "Q4_K_M", "cuda", 17),
    (nvidia("NVIDIA GeForce RTX 4060", 8188, 7782), 32, "Q5_K_M", "cuda", 33),
    (nvidia("NVIDIA GeForce RTX 3060", 12288, 11776), 32, "Q8_0", "cuda", 33),
    (nvidia("NVIDIA GeForce RTX 4090", 24564, 23552), 64, "F16", "cuda", 33),
    (nvidia("NVIDIA H100 80GB HBM3", 81559, 80970), 256, "F16", "cuda", 33),
    (apple(16), 16, "Q8_0", "metal", 33),
    (apple(8), 8, "IQ4_XS", "metal", 33),  # the embeddings stay outside Metal's working set
    (None, 16, "Q4_K_M", "cpu", 0),
])
def test_quant_choice_per_machine(gpu, ram_gib, quant, device, layers):
    chosen = plan(LLAMA31_8B, FILES_8B, [gpu] if gpu else [], ram_gib * GIB, n_ctx=8192)
    assert (chosen.quant, chosen.device, chosen.n_gpu_layers) == (quant, device, layers)
    assert chosen.n_ctx == 8192 and chosen.reason
    budget = (gpu.free_bytes or gpu.total_bytes) if gpu and layers == 33 else ram_gib * GIB
    if layers in (0, 33):
        assert (chosen.gpu_bytes if layers else chosen.memory_bytes) <= budget
    if layers == 33:  # Llama 3.1 is untied: its input embeddings stay in RAM, a row of their own
        embd = FILES_8B[quant] - LLAMA31_8B.gpu_weights(FILES_8B[quant])
        assert chosen.placement[-1] == Placement("RAM", None, 0, embd, 0, 0, 0, 0)
        # and the output buffer: the default 16 rows of logits, host memory
        assert chosen.parts["output_buffer"] == 16 * LLAMA31_8B.n_vocab * 4
        assert chosen.memory_bytes == chosen.gpu_bytes + embd + chosen.parts["output_buffer"]
        assert chosen.parts["weights"] == FILES_8B[quant]


def test_a_longer_context_pushes_to_a_smaller_quant():
    gpu = [nvidia("NVIDIA GeForce RTX 3060", 12288, 11776)]
    short = plan(LLAMA31_8B, FILES_8B, gpu, 32 * GIB, n_ctx=4096)
    long = plan(LLAMA31_8B, FILES_8B, gpu, 32 * GIB, n_ctx=32768)
    assert FILES_8B[long.quant] < FILES_8B[short.quant]


def test_parallel_slots_count_in_the_kv_cache():
    gpu = [nvidia("NVIDIA GeForce RTX 4060", 8188, 7782)]
    one = plan(LLAMA31_8B, FILES_8B, gpu, 32 * GIB, n_ctx=8192, n_slots=1)
    four = plan(LLAMA31_8B, FILES_8B, gpu, 32 * GIB, n_ctx=8192, n_slots=4)
    assert FILES_8B[four.quant] < FILES_8B[one.quant]
    assert four.memory_bytes - FILES_8B[four.quant] > one.memory_bytes - FILES_8B[one.quant]


def test_quantised_kv_cache_fits_a_better_quant():
    gpu = [nvidia("NVIDIA GeForce RTX 4060", 8188, 7782)]
    f16 = plan(LLAMA31_8B, FILES_8B, gpu, 32 * GIB, n_ctx=16384)
    q8 = plan(LLAMA31_8B, FILES_8B, gpu, 32 * GIB, n_ctx=16384, kv_type="q8_0")
    assert FILES_8B[q8.quant] > FILES_8B[f16.quant]


def test_context_is_capped_at_the_trained_length():
    small = ModelShape(30, 3, 64, 64, 49152, 8192, 576)
    chosen = plan(small, {"Q4_K_M": 105_000_000}, [], 4 * GIB, n_ctx=32768)
    assert chosen.n_ctx == 8192


def test_an_explicit_list_of_one_quant_is_used_even_above_the_cap():
    chosen = plan(LLAMA31_8B, {"F16": FILES_8B["F16"]}, [], 64 * GIB)
    assert (chosen.quant, chosen.device) == ("F16", "cpu")


def test_wont_fit_names_what_would():
    with pytest.raises(WontFit, match=r"smallest, Q2_K.*context of \d+ tokens would fit"):
        plan(LLAMA31_8B, FILES_8B, [], 4 * GIB, n_ctx=131072)
    with pytest.raises(WontFit, match="smaller model"):
        plan(LLAMA31_8B, FILES_8B, [], 2 * GIB)


# ---------------------------------------------------------------------------- several GPUs
# Llama 3.1 70B and 405B Instruct: 80 and 126 layers, 8 KV heads of 128, an output layer of
# their own; file sizes as published for their GGUF quants (405B's come as split files)
LLAMA31_70B = ModelShape(n_layer=80, n_head_kv=8, head_dim_k=128, head_dim_v=128,
                         n_vocab=128256, n_ctx_train=131072, n_embd=8192,
                         input_embd_share=128256 * 8192 / 70_553_706_496)
FILES_70B = {q: int(v * GB) for q, v in {
    "Q8_0": 74.98, "Q6_K": 57.89, "Q5_K_M": 49.95, "Q4_K_M": 42.52, "IQ4_XS": 37.90,
    "Q3_K_M": 34.27, "IQ3_XS": 29.31, "Q2_K": 26.38}.items()}
LLAMA31_405B = ModelShape(n_layer=126, n_head_kv=8, head_dim_k=128, head_dim_v=128,
                          n_vocab=128256, n_ctx_train=131072, n_embd=16384,
                          input_embd_share=128256 * 16384 / 405_853_388_800)
FILES_405B = {q: int(v * GB) for q, v in {
    "Q8_0": 431.3, "Q6_K": 333.2, "Q5_K_M": 286.7, "Q4_K_M": 243.1, "Q3_K_M": 196.3,
    "Q2_K": 151.1}.items()}


def card(index: int, name: str, total_mib: int, free_mib: int) -> GPU:
    """A GPU as NVML reports it (nvidia-smi --query-gpu=index,name,memory.total,memory.free)."""
    return GPU("nvidia", index, name, total_mib * 2**20, free_mib * 2**20, "cuda", "550.54.14")


RTX4090 = lambda i, free=23552: card(i, "NVIDIA GeForce RTX 4090", 24564, free)  # noqa: E731
RTX3060 = lambda i: card(i, "NVIDIA GeForce RTX 3060", 12288, 11776)  # noqa: E731
H100 = lambda i: card(i, "NVIDIA H100 80GB HBM3", 81559, 80970)  # noqa: E731


@pytest.mark.parametrize("model, files, gpus, ram_gib, quant, layers, split", [
    # a model that fits one GPU stays on it: the one with the most free memory
    (LLAMA31_8B, FILES_8B, [RTX4090(0, free=20000), RTX4090(1)], 64, "F16", {1: 33}, ()),
    # 2 × 24 GiB: 70B split evenly, all 81 layers on the GPUs
    (LLAMA31_70B, FILES_70B, [RTX4090(0), RTX4090(1)], 64, "IQ4_XS", {0: 41, 1: 40},
     (0.5, 0.5)),
    # 24 + 12 GiB: in proportion to each card's room
    (LLAMA31_70B, FILES_70B, [RTX4090(0), RTX3060(1)], 64, "IQ3_XS", {0: 55, 1: 26}, None),
    # 4 × 80 GiB: 405B over all four
    (LLAMA31_405B, FILES_405B, [H100(i) for i in range(4)], 512, "Q5_K_M",
     {0: 32, 1: 32, 2: 32, 3: 31}, (0.25, 0.25, 0.25, 0.25)),
    # one GPU almost full (another process): the model goes on the other, alone
    (LLAMA31_8B, FILES_8B, [RTX4090(0, free=900), RTX4090(1)], 64, "F16", {1: 33}, ()),
])
def test_several_gpus(model, files, gpus, ram_gib, quant, layers, split):
    chosen = plan(model, files, gpus, ram_gib * GIB, n_ctx=8192)
    on_gpus = {d.index: d.layers for d in chosen.placement if d.index is not None}
    assert (chosen.quant, on_gpus) == (quant, layers), chosen.reason
    assert chosen.n_gpu_layers == model.n_layer + 1 and chosen.device == "cuda"
    if split is None:  # proportional to room: 24 GiB takes about twice the 12's layers
        assert chosen.tensor_split[0] == pytest.approx(2 * chosen.tensor_split[1], rel=0.2)
    else:
        assert chosen.tensor_split == pytest.approx(split, abs=0.01)
    assert chosen.split_mode == ("layer" if len(layers) > 1 else "none")
    assert chosen.main_gpu == next(iter(layers))
    free = {g.index: g.free_bytes for g in gpus}
    on_gpu = [d for d in chosen.placement if d.index is not None]
    for device in on_gpu:  # each device's share within its free memory
        assert device.total <= free[device.index], device
    assert chosen.gpu_bytes == sum(d.total for d in on_gpu)
    # the input embeddings of an untied model (every one here): in RAM, on a row of no layers
    embd = files[quant] - model.gpu_weights(files[quant])
    assert chosen.placement[len(on_gpu):] == ((Placement("RAM", None, 0, embd, 0, 0, 0, 0),)
                                              if embd else ())


def test_what_the_gpus_cannot_take_stays_in_ram():
    """70B Q4_K_M (the best quant a partial offload may use) on 24 + 12 GiB and 64 GiB of
    RAM: the layers the two cards hold, dealt out by their room, and the rest in RAM."""
    gpus = [RTX4090(0), RTX3060(1)]
    chosen = plan(LLAMA31_70B, {"Q8_0": FILES_70B["Q8_0"], "Q4_K_M": FILES_70B["Q4_K_M"]},
                  gpus, 64 * GIB, n_ctx=8192)
    assert chosen.quant == "Q4_K_M" and 40 < chosen.n_gpu_layers < 80
    gpu_part = [d for d in chosen.placement if d.index is not None]
    ram_part = [d for d in chosen.placement if d.index is None]
    assert [d.index for d in gpu_part] == [0, 1] and len(ram_part) == 1
    assert sum(d.layers for d in gpu_part) == chosen.n_gpu_layers
    assert sum(d.layers for d in chosen.placement) == LLAMA31_70B.n_layer + 1
    assert gpu_part[0].layers > gpu_part[1].layers
    for device, gpu in zip(gpu_part, gpus):
        assert device.total <= gpu.free_bytes
    assert chosen.split_mode == "layer" and len(chosen.tensor_split) == 2


def test_layers_are_dealt_out_as_llama_cpp_deals_them():
    """llama-model.cpp: layer il goes to the first device whose cumulative share exceeds
    (il - first offloaded) / n_gpu_layers; the output layer is the last of n_layer + 1."""
    from localinfer.model_store.planner import layers_per_device

    assert layers_per_device(32, 33, [1, 1]) == [17, 16]
    assert layers_per_device(32, 33, [3, 1]) == [25, 8]
    assert layers_per_device(32, 10, [1, 1]) == [5, 5]  # the last 10 (output layer among them)
    assert layers_per_device(32, 33, [1, 0, 1]) == [17, 0, 16]  # a GPU left out gets none
    assert sum(layers_per_device(126, 127, [1, 1, 1, 1])) == 127


def worker(index: int, total_gib: float, free_gib: float, kind: str = "CPU") -> GPU:
    """An RPC worker's device as service.with_workers makes it from the worker's report."""
    return GPU("rpc", index, f"10.0.0.{5 + index}:50052/{kind}", int(total_gib * GIB),
               int(free_gib * GIB), "rpc", "AMD EPYC")


def test_a_cpu_head_and_two_workers_share_the_layers_by_their_free_memory():
    # 8B at Q8_0 (8.5 GB) fits none of three 6 GiB machines; together they hold it
    chosen = plan(LLAMA31_8B, FILES_8B, [worker(0, 8, 6), worker(1, 8, 6)], 6 * GIB,
                  n_ctx=4096)
    on = {p.device: p.layers for p in chosen.placement}
    assert chosen.device == "rpc" and chosen.split_mode == "layer"
    assert set(on) == {"worker 10.0.0.5:50052/CPU", "worker 10.0.0.6:50052/CPU", "RAM"}
    # llama.cpp is told 33 - (the first layers kept here); the output layer, the last it
    # deals out, stays here as well (the runner overrides where its tensors go)
    assert sum(on.values()) == 33 and chosen.n_gpu_layers == 33 - on["RAM"] + 1
    # about a third each: the head keeps a little less (its compute buffer and embeddings)
    assert all(8 <= n <= 13 for n in on.values()), on
    assert chosen.tensor_split == pytest.approx((0.5, 0.5), abs=0.06)
    for device in chosen.placement:  # nobody gets more than it has
        room = 6 * GIB
        assert device.total <= room, (device.device, device.total / GIB)
    # a worker with twice the free memory takes at least twice the layers (each device's
    # compute buffer comes off its room first)
    uneven = plan(LLAMA31_8B, FILES_8B, [worker(0, 16, 12), worker(1, 8, 6)], 6 * GIB,
                  n_ctx=4096)
    first, second = uneven.placement[0].layers, uneven.placement[1].layers
    assert 2 * second - 1 <= first <= 3 * second, uneven.placement


def test_the_pool_of_a_head_and_its_workers_picks_the_quant():
    # alone, 6 GiB of RAM takes Q4_K_M at best; with two 12 GiB workers, F16 fits the pool
    alone = plan(LLAMA31_8B, FILES_8B, [], 6 * GIB, n_ctx=4096)
    pooled = plan(LLAMA31_8B, FILES_8B, [worker(0, 16, 12), worker(1, 16, 12)], 6 * GIB,
                  n_ctx=4096)
    assert alone.quant == "Q4_K_M" and pooled.quant == "F16", pooled.reason
    # workers too small to help: the head alone, as before
    tiny = plan(LLAMA31_8B, FILES_8B, [worker(0, 1, 0.1)], 16 * GIB, n_ctx=4096)
    assert tiny.device == "cpu" and tiny.n_gpu_layers == 0


def test_a_gpu_head_keeps_a_model_that_fits_its_gpu_and_spreads_one_that_does_not():
    card = GPU("nvidia", 0, "NVIDIA GeForce RTX 4090", 24564 * 2**20, 23552 * 2**20, "cuda")
    remote = worker(1, 24, 23, "CUDA0")
    fits = plan(LLAMA31_8B, FILES_8B, [card, remote], 64 * GIB, n_ctx=8192)
    assert fits.device == "cuda" and [p.index for p in fits.placement] == [0, None], fits.reason
    # a 70B-sized model: the 4090 and the worker's card together
    big = ModelShape(n_layer=80, n_head_kv=8, head_dim_k=128, head_dim_v=128, n_vocab=128256,
                     n_ctx_train=131072, n_embd=8192, input_embd_share=0.015)
    files = {"Q8_0": int(75.0 * GB), "Q4_K_M": int(42.5 * GB), "IQ2_XS": int(21.1 * GB)}
    spread = plan(big, files, [card, remote], 64 * GIB, n_ctx=4096)
    assert spread.quant == "Q4_K_M" and spread.split_mode == "layer", spread.reason
    assert {p.index for p in spread.placement} == {0, 1, None}  # (None: the input embeddings)
    assert len(spread.tensor_split) == 2 and all(spread.tensor_split)


def test_shares_in_llama_cpps_order_put_the_workers_first():
    from localinfer.backends.rpc.library import llama_order

    # two GPUs here (0, 1), a worker's two devices after them (2, 3): llama.cpp lists RPC
    # devices first
    assert llama_order((0.1, 0.2, 0.3, 0.4), 0, 2, 2) == ((0.3, 0.4, 0.1, 0.2), 2)
    assert llama_order((0.0, 0.0, 1.0), 2, 2, 1) == ((1.0, 0.0, 0.0), 0)
    assert llama_order((0.5, 0.5), 1, 0, 2) == ((0.5, 0.5), 1)  # a CPU head: as planned
    assert llama_order((), 3, 2, 2) == ((), 1)  # one device, by main_gpu alone
    assert llama_order((0.6, 0.4), 0, 2, 0) == ((0.6, 0.4), 0)  # no worker joined


# ------------------------------------------------------------- a mixture of experts
# Qwen3-30B-A3B: 48 layers of attention (4 KV heads of 128) and 128 experts (8 active), the
# experts 95% of a Q4_K_M file (their share as its header's tensor table gives it: PLAN_SHAPES
# qwen3-30b-a3b); file sizes as published
QWEN3_30B_A3B = ModelShape(n_layer=48, n_head_kv=4, head_dim_k=128, head_dim_v=128,
                           n_vocab=151936, n_ctx_train=262144, n_embd=2048,
                           input_embd_share=151936 * 2048 / 30_532_122_624,
                           layers=(Layer(4, expert_share=0.95 / 48),) * 48,
                           n_expert=128, n_expert_used=8)
FILES_30B = {"Q8_0": int(32.48 * GB), "Q4_K_M": int(18.56 * GB)}


@pytest.mark.parametrize("gpu, in_ram", [
    (nvidia("NVIDIA GeForce RTX 4060 Ti 16GB", 16380, 15800), (10, 14)),
    (nvidia("NVIDIA GeForce RTX 4060", 8188, 7782), (31, 35)),
    (nvidia("NVIDIA GeForce RTX 3050", 6144, 5800), (37, 41)),
])
def test_a_moe_short_of_gpu_memory_keeps_its_experts_in_ram_first(gpu, in_ram):
    """As llama.cpp's --fit: every layer on the GPU with its attention and KV, the experts
    in RAM, then the first layers' experts back while they fit; the GPU is not overfilled."""
    chosen = plan(QWEN3_30B_A3B, FILES_30B, [gpu], 64 * GIB, n_ctx=8192)
    assert (chosen.quant, chosen.n_gpu_layers) == ("Q4_K_M", 49)
    first = chosen.cpu_experts[0]
    assert chosen.cpu_experts == tuple(range(first, 48))  # the last layers' experts
    assert in_ram[0] <= len(chosen.cpu_experts) <= in_ram[1], len(chosen.cpu_experts)
    on_gpu, ram = chosen.placement
    assert (on_gpu.index, ram.index) == (0, None)
    assert on_gpu.experts == tuple(range(first)) and ram.experts == chosen.cpu_experts
    assert on_gpu.kv_cache == chosen.parts["kv_cache"] == 48 * 4 * 256 * 2 * 8192
    assert ram.kv_cache == 0 and on_gpu.total <= gpu.free_bytes
    per_layer = int(0.95 / 48 * FILES_30B["Q4_K_M"])
    assert ram.expert_bytes == pytest.approx(len(chosen.cpu_experts) * per_layer, abs=48)
    assert chosen.gpu_bytes == on_gpu.total and "experts of" in chosen.reason


def test_a_moe_that_fits_stays_whole_and_one_too_big_for_attention_alone_splits_layers():
    whole = plan(QWEN3_30B_A3B, FILES_30B, [nvidia("NVIDIA GeForce RTX 4090", 24564, 23552)],
                 64 * GIB, n_ctx=8192)
    assert whole.quant == "Q4_K_M" and whole.n_gpu_layers == 49 and not whole.cpu_experts
    # two 12 GiB cards hold it split by layers: no expert leaves the GPUs
    two = plan(QWEN3_30B_A3B, FILES_30B, [card(0, "NVIDIA GeForce RTX 3060", 12288, 11776),
                                          card(1, "NVIDIA GeForce RTX 3060", 12288, 11776)],
               64 * GIB, n_ctx=8192)
    assert two.split_mode == "layer" and not two.cpu_experts
    # 2 GiB: not even every layer's attention and KV fit; some layers go, without experts
    small = plan(QWEN3_30B_A3B, FILES_30B, [nvidia("NVIDIA GeForce GT 1030", 2048, 1900)],
                 64 * GIB, n_ctx=8192)
    assert 0 < small.n_gpu_layers < 48 and small.cpu_experts == tuple(range(48))
    assert small.placement[0].expert_bytes == 0 and small.placement[0].total <= 1900 * 2**20


def test_a_dense_models_plan_has_no_experts_and_no_state():
    chosen = plan(LLAMA31_8B, FILES_8B, [nvidia("NVIDIA GeForce RTX 4060", 8188, 7782)],
                  32 * GIB, n_ctx=8192)
    assert not chosen.cpu_experts and "recurrent_state" not in chosen.parts
    assert chosen.parts["kv_cache"] == 32 * 8 * 256 * 2 * 8192
