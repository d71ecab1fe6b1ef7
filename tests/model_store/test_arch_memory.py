"""The plan's KV cache, sliding-window cache and recurrent state against what llama.cpp
allocates for each architecture (random-weight files of real shapes, tests/families.py):
the sizes its load log reports, within 5% (or the log's own rounding, 0.01 MiB)."""

from __future__ import annotations

import logging
import re

import llama_cpp
import pytest

from ..families import arch_model
from localinfer.backends.base import LoadOptions
from localinfer.model_store.fit import estimate_memory
from localinfer.model_store.gguf_info import read_gguf_info
from localinfer.model_store.shape import swa_cells
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
