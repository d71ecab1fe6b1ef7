"""The fit planner on a table of machines, with a real model's shape and real file sizes."""

from __future__ import annotations

import pytest

from localinfer.model_store.hardware import GPU, apple_gpu_share
from localinfer.model_store.planner import ModelShape, WontFit, plan

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
        assert chosen.memory_bytes <= budget


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
