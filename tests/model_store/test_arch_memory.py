"""The plan's KV cache, sliding-window cache and recurrent state against what llama.cpp
allocates for each architecture (random-weight files of real shapes, tests/families.py):
the sizes its load log reports, within 5% (or the log's own rounding, 0.01 MiB)."""

from __future__ import annotations

import dataclasses
import logging
import re

import llama_cpp
import pytest

from ..families import arch_model, plan_model
from localinfer.backends.base import LoadOptions
from localinfer.errors import ContextTooLarge
from localinfer.model_store.fit import estimate_memory
from localinfer.model_store.gguf_info import read_gguf_info
from localinfer.model_store.hardware import GPU
from localinfer.model_store.planner import WontFit, plan
from localinfer.model_store.shape import POOLED_SEQUENCES, swa_cells
from localinfer.service import prepare
from localinfer.settings import Settings

_MIB = 2**20
_ROUNDING = 0.006 * _MIB  # the log writes MiB with two decimals


def _allocated(path, n_ctx: int, n_slots: int, swa_full: bool, snapshots: int,
               caplog) -> dict[str, float]:
    """Load the model and a context as the engine does, but for the settings given: the
    KV, SWA-cache and recurrent-state bytes the log reports."""
    from localinfer.backends.native.ggml import ensure_loaded, route_llama_log

    route_llama_log()
    ensure_loaded()
    llama_cpp.llama_backend_init()
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="localinfer.llama_cpp")
    model = llama_cpp.llama_model_load_from_file(str(path).encode(),
                                                 llama_cpp.llama_model_default_params())
    assert model
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_seq_max = n_ctx * n_slots, n_slots
    params.n_batch = params.n_ubatch = 512
    params.swa_full, params.n_rs_seq = swa_full, snapshots
    ctx = llama_cpp.llama_init_from_model(model, params)
    try:
        assert ctx
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    text = caplog.text

    def mib(pattern: str) -> float:
        return sum(float(m) for m in re.findall(pattern, text)) * _MIB

    swa = re.search(r"creating +SWA KV cache, size = (\d+) cells", text)
    return {"kv": mib(r"KV buffer size =\s+([\d.]+) MiB"),
            "state": mib(r"RS buffer size =\s+([\d.]+) MiB"),
            "swa_cells": int(swa[1]) if swa else None}


def _near(planned: float, allocated: float) -> bool:
    return abs(planned - allocated) <= max(0.05 * allocated, _ROUNDING)


# (architecture, context per slot, slots, swa_full, snapshots of the recurrent state)
CASES = [
    ("qwen35", 512, 1, True, 0),  # 1 attention layer of 4: 0.25 MiB, not 1; 57 KiB of state
    ("qwen35", 512, 4, True, 3),  # state per slot, 1 + 3 snapshots each
    ("mamba2", 512, 1, True, 0),  # no KV at all; 137 KiB of state
    ("mamba2", 1024, 8, True, 0),
    ("lfm2", 512, 1, True, 0),  # head_count_kv [0, 2, 0, 2]: 2 attention layers
    ("lfm2", 512, 128, True, 0),  # 2 KiB of short-convolution state per slot
    ("gemma3", 512, 1, True, 0),  # a full-size SWA cache (--swa-full)
    ("gemma3", 4096, 1, False, 0),  # 5 layers at their window: 64 + a micro-batch, padded
    ("gemma3", 4096, 2, False, 0),  # a window per slot
    ("qwen3moe", 512, 1, True, 0),
]


@pytest.mark.parametrize("arch, n_ctx, n_slots, swa_full, snapshots", CASES)
def test_the_plan_counts_what_llama_cpp_allocates(arch, n_ctx, n_slots, swa_full, snapshots,
                                                  caplog):
    path = arch_model(arch)
    info = read_gguf_info(path)
    planned = estimate_memory(info, n_ctx, n_slots, swa_full=swa_full, snapshots=snapshots)
    got = _allocated(path, n_ctx, n_slots, swa_full, snapshots, caplog)
    assert _near(planned.kv_cache, got["kv"]), (planned.kv_cache / _MIB, got["kv"] / _MIB)
    assert _near(planned.recurrent_state, got["state"]), (planned.recurrent_state / _MIB,
                                                          got["state"] / _MIB)
    if not swa_full:  # the cells of the window's cache, exactly
        window = next(layer.window for layer in info.shape().per_layer() if layer.window)
        assert swa_cells(window, n_ctx, n_slots) == got["swa_cells"] * n_slots


def test_a_speculating_hybrid_is_planned_with_a_state_per_guess(caplog):
    """The engine has llama.cpp keep a snapshot of a hybrid's state per guess (n_rs_seq):
    the service's plan counts them, as the load then allocates them."""
    from localinfer.backends.llamacpp import LlamaCppBackend

    path = arch_model("qwen35")
    options = LoadOptions(n_ctx=512, n_slots=2, draft_tokens=6, n_gpu_layers=0)
    prepared = prepare(str(path), options, Settings())
    plain = prepare(str(path), LoadOptions(n_ctx=512, n_slots=2, n_gpu_layers=0), Settings())
    state = read_gguf_info(path).shape().state_bytes(2)
    assert prepared.ram_bytes - plain.ram_bytes == 6 * state
    caplog.set_level(logging.INFO, logger="localinfer.llama_cpp")
    with LlamaCppBackend(path, prepared.options):
        pass
    reported = sum(float(m) for m in re.findall(r"RS buffer size =\s+([\d.]+) MiB",
                                                caplog.text)) * _MIB
    assert _near(7 * state, reported), (7 * state / _MIB, reported / _MIB)


# ----------------------------------------------------------- context checkpoints, in RAM
def _one_checkpoint(shape) -> int:
    """What llama.cpp writes for one (llama_state_seq_get_data_ext, partial): the recurrent
    state of a sequence, 28 bytes of header and 24 a recurrent layer."""
    return shape.state_bytes(1) + 28 + 24 * shape.n_recurrent


@pytest.mark.parametrize("arch", ["qwen35", "mamba2"])
def test_a_recurrent_models_checkpoints_are_a_part_of_the_plan_in_ram(arch):
    info = read_gguf_info(arch_model(arch))
    shape, files = info.shape(), {info.quant: info.file_size}
    plain = plan(shape, files, [], 64 * 2**30, n_ctx=512, n_slots=4)
    chosen = plan(shape, files, [], 64 * 2**30, n_ctx=512, n_slots=4, checkpoints=32)
    held = 4 * 32 * _one_checkpoint(shape)  # far below the 256 MiB cap
    assert chosen.parts["checkpoints"] == shape.checkpoints_bytes(4, 32) == held
    assert list(chosen.parts) == ["weights", "kv_cache", "recurrent_state", "checkpoints",
                                  "output_buffer", "compute", "runtime", "margin"]
    assert chosen.memory_bytes == plain.memory_bytes + held == sum(chosen.parts.values())
    assert estimate_memory(info, 512, 4, checkpoints=32).ram == (
        estimate_memory(info, 512, 4).ram + held)


@pytest.mark.parametrize("arch, checkpoints, swa_full", [("qwen3moe", 32, False),
                                                         ("gemma3", 32, True),
                                                         ("qwen35", 0, False)])
def test_no_checkpoints_part_for_a_model_with_nothing_to_save_or_with_them_off(
        arch, checkpoints, swa_full):
    """A dense transformer, a sliding-window one keeping every cell (--swa-full): a cut
    needs no checkpoint."""
    info = read_gguf_info(arch_model(arch))
    chosen = plan(info.shape(), {info.quant: info.file_size}, [], 64 * 2**30, n_ctx=512,
                  n_slots=4, checkpoints=checkpoints, swa_full=swa_full)
    assert "checkpoints" not in chosen.parts
    assert estimate_memory(info, 512, 4, checkpoints=checkpoints,
                           swa_full=swa_full).checkpoints == 0


def test_a_sliding_window_models_checkpoints_hold_its_window():
    """With small windowed caches (the default) a checkpoint holds the window's cells of
    every windowed layer: planned as host RAM, 32 a slot."""
    info = read_gguf_info(arch_model("gemma3"))
    shape = info.shape()
    one = shape.checkpoint_bytes(swa_full=False)
    window_kv = shape.kv_bytes(64, 1, swa_full=True) - shape.kv_bytes(64, 1, swa_full=True) // 6
    assert one > window_kv  # 5 windowed layers of 6, 64 cells each, and their headers
    chosen = plan(shape, {info.quant: info.file_size}, [], 64 * 2**30, n_ctx=512, n_slots=4,
                  checkpoints=32)
    assert chosen.parts["checkpoints"] == 4 * 32 * one
    assert shape.checkpoint_bytes(swa_full=True) == 0


def test_the_cap_bounds_a_slots_checkpoints_and_none_go_on_the_gpu():
    """A Qwen3.5-9B shape: a slot's state is ~50 MiB, so 32 checkpoints would take 1.6 GiB;
    256 MiB holds 5 of them (the engine keeps none bigger than the cap). On a GPU they are
    RAM: in the plan's whole, not in what the GPU takes."""
    info = read_gguf_info(plan_model("qwen3.5-9b"))
    shape, files = info.shape(), {info.quant: info.file_size}
    one = _one_checkpoint(shape)
    gpu = GPU("nvidia", 0, "what-if GPU of 24 GiB", 24 * 2**30, 24 * 2**30, "cuda")
    plain = plan(shape, files, [gpu], 64 * 2**30, n_ctx=8192, n_slots=2)
    chosen = plan(shape, files, [gpu], 64 * 2**30, n_ctx=8192, n_slots=2, checkpoints=32,
                  checkpoint_cap=256 * _MIB)
    assert chosen.parts["checkpoints"] == 2 * 5 * one <= 2 * 256 * _MIB < 2 * 32 * one
    assert chosen.gpu_bytes == plain.gpu_bytes and chosen.placement == plain.placement
    assert chosen.memory_bytes - plain.memory_bytes == chosen.parts["checkpoints"]
    roomy = plan(shape, files, [gpu], 64 * 2**30, n_ctx=8192, n_slots=2, checkpoints=32,
                 checkpoint_cap=2**40)
    assert roomy.parts["checkpoints"] == 2 * 32 * one
    assert plan(shape, files, [gpu], 64 * 2**30, n_ctx=8192, n_slots=2, checkpoints=32,
                checkpoint_cap=one - 1).parts.get("checkpoints") is None  # none fits the cap


def test_a_large_window_gets_room_for_two_checkpoints_unless_a_cap_is_set():
    """Gemma 3 27B's window checkpoint (~416 MiB) is over the 256 MiB a slot keeps of small
    ones: with no cap set a slot keeps two of them, and the plan counts them; a cap the
    user set below one keeps none. Qwen3.5-9B's (~50 MiB) stay within 256 MiB either way."""
    gemma = read_gguf_info(plan_model("gemma3-27b")).shape()
    one = gemma.checkpoint_bytes()
    assert 300 * _MIB < one < 600 * _MIB
    assert gemma.checkpoints_bytes(n_slots=4, n_checkpoints=32) == 4 * 2 * one
    assert gemma.checkpoints_bytes(n_slots=4, n_checkpoints=32, cap=256 * _MIB) == 0
    assert gemma.checkpoints_bytes(n_slots=4, n_checkpoints=1) == 4 * one
    qwen = read_gguf_info(plan_model("qwen3.5-9b")).shape()
    assert (qwen.checkpoints_bytes(n_slots=2, n_checkpoints=32)
            == qwen.checkpoints_bytes(n_slots=2, n_checkpoints=32, cap=256 * _MIB)
            == 2 * (256 * _MIB // qwen.checkpoint_bytes()) * qwen.checkpoint_bytes())


@pytest.mark.parametrize("arch", ["qwen35", "mamba2"])
def test_ram_that_holds_the_model_but_not_its_checkpoints_is_refused(arch):
    """On the CPU: the planner and the service's RAM check both count the checkpoints. The
    check's advice: a smaller context where the KV cache gives the room back (the hybrid),
    else fewer checkpoints (Mamba2 has no KV cache)."""
    path = arch_model(arch)
    info = read_gguf_info(path)
    shape, files = info.shape(), {info.quant: info.file_size}
    held = shape.checkpoints_bytes(4, 32)
    plain = plan(shape, files, [], 64 * 2**30, n_ctx=512, n_slots=4)
    budget = plain.memory_bytes + held // 2
    assert plan(shape, files, [], budget, n_ctx=512, n_slots=4).device == "cpu"
    with pytest.raises(WontFit, match="after 0.0\\d GiB of context checkpoints"):
        plan(shape, files, [], budget, n_ctx=512, n_slots=4, checkpoints=32)
    with pytest.raises(WontFit, match="checkpoints of 4 slots take"):
        plan(shape, files, [], held - 1, n_ctx=512, n_slots=4, checkpoints=32)

    # (flash attention set: left to the service, it would turn off without the checkpoints,
    # and stay on with them where the attention scores and a compute buffer reserved for 32
    # outputs leave no room)
    options = LoadOptions(n_ctx=4096, n_slots=4, n_gpu_layers=0, flash_attn=True)
    without = dataclasses.replace(options, ctx_checkpoints=0)
    need = prepare(str(path), without, Settings()).ram_bytes
    assert prepare(str(path), options, Settings()).ram_bytes == need + held
    prepare(str(path), without, Settings(), available_memory=lambda: need + held // 2)
    with pytest.raises(ContextTooLarge, match=r"\+ checkpoints 0\.\d\d \+.* fewer context "
                                              r"checkpoints") as refused:
        prepare(str(path), options, Settings(), available_memory=lambda: need + held // 2)
    fits = re.search(r"--ctx (\d+) or less", str(refused.value))
    if arch == "mamba2":
        assert fits is None
    else:
        assert 512 < int(fits[1]) < 4096
        assert estimate_memory(info, int(fits[1]), 4, n_outputs=options.n_outputs,
                               checkpoints=32).ram <= need + held // 2


def test_the_engines_checkpoints_stay_within_the_plan():
    """The tiny Qwen3.5: growing prompts read in chunks of 32 save two checkpoints a turn;
    the slot keeps 3, and what they hold is what the plan counts for them, to the byte."""
    from localinfer.backends.base import SamplingParams
    from localinfer.backends.llamacpp import LlamaCppBackend

    path = arch_model("qwen35")
    shape = read_gguf_info(path).shape()
    options = LoadOptions(n_ctx=1024, n_gpu_layers=0, prefill_chunk=32, ctx_checkpoints=3)
    prepared = prepare(str(path), options, Settings())
    plain = prepare(str(path), dataclasses.replace(options, ctx_checkpoints=0), Settings())
    planned = shape.checkpoints_bytes(1, 3)
    assert prepared.ram_bytes - plain.ram_bytes == planned
    saved = []
    with LlamaCppBackend(path, prepared.options) as backend:
        prompt = []
        for turn in range(3):
            prompt += backend.tokenize(f" Turn {turn}: the story goes on and on, further "
                                       f"than before, with more words each time.",
                                       add_special=not prompt)
            backend.generate(prompt, SamplingParams(max_tokens=2)).text()
            checkpoints = backend.engine.slots[0].checkpoints
            saved.append(len(checkpoints))
            assert sum(len(c.data) for c in checkpoints) <= planned
    assert saved[-1] == 3 and sum(len(c.data) for c in checkpoints) == planned


@pytest.mark.parametrize("which", ["qwen3-embed", "qwen3-rerank", "bert-rerank"])
def test_the_plan_counts_the_pooled_context_an_embedder_or_reranker_makes(which, caplog):
    """An embedding or rerank model makes a second context on its first request, which the
    plan holds room for: its KV as llama.cpp allocates it (none for an encoder), and its
    compute buffer, at most (a causal model's is a micro-batch of vocabulary-wide outputs:
    ~300 MiB for Qwen3's vocabulary, whatever the layers)."""
    from localinfer.backends.llamacpp import LlamaCppBackend

    from ..families import embedding_model, reranker_model

    path = embedding_model() if which == "qwen3-embed" else reranker_model(which.split("-")[0])
    info = read_gguf_info(path)
    shape = info.shape()
    assert shape.pooled == which.split("-")[1]
    files = {info.quant: info.file_size}
    with_pooled = plan(shape, files, [], 20 << 30, n_ctx=4096).parts
    alone = plan(dataclasses.replace(shape, pooled=""), files, [], 20 << 30, n_ctx=4096).parts
    backend = LlamaCppBackend(path, LoadOptions(n_ctx=4096))
    try:
        caplog.set_level(logging.DEBUG, logger="localinfer.llama_cpp")
        caplog.clear()
        if shape.pooled == "embed":
            backend.embed_many(["What do cats eat?"])
        else:
            backend.rerank("What do cats eat?", ["Cats hunt small animals."])
        text = caplog.text
    finally:
        backend.close()
    kv = sum(float(m) for m in re.findall(r"KV buffer size =\s+([\d.]+) MiB", text)) * _MIB
    compute = sum(float(m) for m in re.findall(r"compute buffer size =\s+([\d.]+) MiB",
                                                text)) * _MIB
    assert compute > 0  # (the pooled context was made while the log was read)
    assert with_pooled["kv_cache"] - alone["kv_cache"] == pytest.approx(kv, abs=_ROUNDING)
    planned = with_pooled["compute"] - alone["compute"]
    assert compute - _ROUNDING <= planned <= 2 * compute + 64 * _MIB


@pytest.mark.parametrize("arch", ["qwen35", "mamba2"])
def test_a_pooled_context_keeps_a_recurrent_state_per_input_it_reads_at_once(arch, caplog):
    """A hybrid's or a recurrent model's pooled context (its embeddings') holds a recurrent
    state for each input a decode may read (POOLED_SEQUENCES): counted in the plan of an
    embedding model, and in what a chat model checks is free before it embeds."""
    from localinfer.backends.llamacpp import LlamaCppBackend
    from localinfer.model_store.planner import pooled_bytes
    from localinfer.model_store.shape import POOLED_UBATCH

    path = arch_model(arch)
    shape = dataclasses.replace(read_gguf_info(path).shape(), pooled="embed",
                                pooled_ubatch=POOLED_UBATCH)
    _kv, state, _compute, _outputs = pooled_bytes(shape, 512)
    assert state == shape.state_bytes(1) * POOLED_SEQUENCES > 0
    backend = LlamaCppBackend(path, LoadOptions(n_ctx=512, n_slots=1))
    try:
        caplog.set_level(logging.DEBUG, logger="localinfer.llama_cpp")
        caplog.clear()
        backend.embed_many(["What do cats eat?"])
        text = caplog.text
    finally:
        backend.close()
    allocated = sum(float(m) for m in re.findall(r"RS buffer size =\s+([\d.]+) MiB", text))
    assert _near(state, allocated * _MIB), (state / _MIB, allocated)
    files = {"Q8_0": 64 << 20}
    with_pooled = plan(shape, files, [], 20 << 30, n_ctx=512).parts["recurrent_state"]
    alone = plan(dataclasses.replace(shape, pooled=""), files, [], 20 << 30,
                 n_ctx=512).parts["recurrent_state"]
    assert with_pooled - alone == state
