"""Model shapes read from headers, per layer: the KV cache of the attention layers only,
sliding-window layers at their window when asked, a recurrent state per slot, experts per
layer — on published models' shapes (header-only files of bench/random_gguf.py PLAN_SHAPES)
and the tiny random models llama.cpp loads."""

from __future__ import annotations

import pytest

from ..families import _random_gguf, arch_model, plan_model
from localinfer.model_store.gguf_info import read_gguf_info
from localinfer.model_store.shape import swa_cells

KIB, MIB, GIB = 2**10, 2**20, 2**30


@pytest.mark.parametrize("model, kv_per_token, state_per_slot, kinds", [
    # 8 of 32 layers attend, 4 KV heads of 256: 32 KiB, not 128; 24 Gated DeltaNet states of
    # (3 × (4096 + 2 × 16 × 128) + 128 × 4096) floats
    ("qwen3.5-9b", 32 * KIB, 24 * 2_195_456, ["hybrid: 8 attention + 24 Gated DeltaNet layers"]),
    # head_count_kv per layer [0, 0, 8, 0, 0, 8, …]: 6 layers of 8 heads of 64, not 16;
    # 10 convolutions of 2048 × (3 - 1) floats
    ("lfm2-1.2b", 12 * KIB, 10 * 16_384, ["hybrid: 6 attention + 10 short convolution layers"]),
    # no KV; 64 layers of (3 × (5120 + 2 × 128) + 128 × 5120) floats
    ("mamba2-2.7b", 0, 64 * 2_685_952, ["recurrent: 64 Mamba-2 layers, no KV cache"]),
    ("gemma3-27b", 62 * 16 * 256 * 2, 0, ["sliding window 1024 on 52 of 62 layers"]),
    ("qwen3-30b-a3b", 96 * KIB, 0, ["MoE 128 experts, 8 active"]),
])
def test_published_shapes(model, kv_per_token, state_per_slot, kinds):
    shape = read_gguf_info(plan_model(model)).shape()
    assert shape.kv_bytes_per_token() == kv_per_token
    assert shape.state_bytes(1) == state_per_slot
    assert shape.describe() == kinds


@pytest.mark.parametrize("arch, kv_per_token, state_per_slot, kinds", [
    ("qwen35", 512, 3 * 19_456, ["hybrid: 1 attention + 3 Gated DeltaNet layers"]),
    ("mamba2", 0, 2 * 70_144, ["recurrent: 2 Mamba-2 layers, no KV cache"]),
    ("lfm2", 512, 2 * 1024, ["hybrid: 2 attention + 2 short convolution layers"]),
    ("gemma3", 768, 0, ["sliding window 64 on 5 of 6 layers"]),
    ("qwen3moe", 512, 0, ["MoE 8 experts, 2 active"]),
])
def test_tiny_shapes(arch, kv_per_token, state_per_slot, kinds):
    shape = read_gguf_info(arch_model(arch)).shape()
    assert shape.kv_bytes_per_token() == kv_per_token
    assert shape.state_bytes(1) == state_per_slot
    assert shape.describe() == kinds


@pytest.mark.parametrize("window, n_ctx, n_slots, unified, cells", [
    (64, 512, 1, False, 512),  # the window and a micro-batch pass the context: all of it
    (64, 4096, 1, False, 768),  # 64 + 512, padded to 256
    (1024, 32768, 4, False, 4 * 1536),  # a stream of its own per slot
    (1024, 8192, 4, True, 4608),  # one stream: each slot's window and a micro-batch
    (4096, 2048, 1, False, 2048),
])
def test_a_sliding_window_cache_is_sized_as_llama_cpp_sizes_it(window, n_ctx, n_slots, unified,
                                                               cells):
    assert swa_cells(window, n_ctx, n_slots, 512, unified) == cells


def test_sliding_window_layers_at_their_window_only_when_asked():
    """A shape's KV counts sliding-window layers at every cell by default (--swa-full), and
    at their window when told llama.cpp keeps only that (the engine's default; the planner's
    and fit's default too)."""
    shape = read_gguf_info(plan_model("gemma3-27b")).shape()
    full = shape.kv_bytes(32768)
    assert full == 62 * 16 * 256 * 2 * 32768  # 15.5 GiB
    windowed = shape.kv_bytes(32768, swa_full=False)
    assert windowed == 10 * 16 * 256 * 2 * 32768 + 52 * 16 * 256 * 2 * 1536  # 3.1 GiB
    assert shape.kv_bytes(32768, 4, swa_full=False) == (10 * 16 * 256 * 2 * 32768 * 4
                                                        + 52 * 16 * 256 * 2 * 1536 * 4)


def test_a_recurrent_state_per_slot_and_per_snapshot():
    shape = read_gguf_info(plan_model("qwen3.5-9b")).shape()
    one = shape.state_bytes(1)
    assert one == pytest.approx(50.25 * MIB, abs=1)
    assert shape.state_bytes(4) == 4 * one
    assert shape.state_bytes(4, snapshots=8) == 36 * one  # n_rs_seq: 8 more copies each
    assert shape.context_bytes(4096, 4) == 4 * 4096 * 32 * KIB + 4 * one


def test_experts_per_layer_from_the_tensor_table():
    info = read_gguf_info(plan_model("qwen3-30b-a3b"))
    # gate and up (Q4_K) and down (Q6_K) of 128 experts of 768 × 2048, in each of 48 layers
    per_layer = 128 * 768 * 2048 * (2 * 144 + 210) // 256
    assert info.expert_bytes == (per_layer,) * 48
    assert (info.n_expert, info.n_expert_used) == (128, 8)
    shape = info.shape()
    assert shape.moe and shape.expert_bytes(info.file_size) == [per_layer] * 48
    assert sum(shape.expert_bytes(info.file_size)) / info.file_size == pytest.approx(0.95,
                                                                                     abs=0.01)
    assert not read_gguf_info(arch_model("qwen35")).shape().moe


def test_gpt_oss_weights_are_refused_and_no_file_is_left(tmp_path):
    """random_gguf has no random MXFP4 writer: gpt-oss's weights are one clear refusal, not
    a file llama.cpp would misread; its header and tensor table are written."""
    random_gguf = _random_gguf()
    shape, out = random_gguf.PLAN_SHAPES["gpt-oss-120b"], tmp_path / "gpt-oss.gguf"
    with pytest.raises(ValueError, match="header and tensor table only"):
        random_gguf.write_arch(shape, out, {}, "gpt-oss")
    assert not out.exists()
    random_gguf.write_plan_shape(shape, out, "gpt-oss", sparse=True)
    assert read_gguf_info(out).shape().moe


def test_a_dense_models_shape_is_as_it_was(smollm2_path):
    """A dense transformer lists no layers: every figure is the one formula's."""
    info = read_gguf_info(smollm2_path)
    shape = info.shape()
    assert shape.layers == () and not shape.describe()
    assert shape.kv_bytes_per_token() == 30 * 3 * (64 + 64) * 2
    assert shape.kv_bytes(2048, 3, "q8_0") == int(30 * 3 * 128 * 34 / 32 * 2048 * 3)
