"""The planner's GPU layers and the RAM check reach the load options (hardware injected: no
GPU here), a draft model's memory counted."""

from __future__ import annotations

import dataclasses

import pytest

from localinfer.backends.base import LoadOptions
from localinfer.errors import ContextTooLarge
from localinfer.model_store.hardware import CPU, GPU, Hardware
from localinfer.model_store.fit import estimate_memory
from localinfer.service import prepare
from localinfer.settings import Settings

CPU_X86 = CPU("AMD Ryzen 9 7950X", 16, 32, ("avx", "avx2", "avx512f", "fma", "f16c"))


def machine(free_mib: int, offload: bool = True) -> Hardware:
    gpu = GPU("nvidia", 0, "NVIDIA GeForce RTX 4090", 24564 * 2**20, free_mib * 2**20, "cuda",
              "550.54.14")
    return Hardware(CPU_X86, 64 * 2**30, 60 * 2**30, (gpu,), offload)


def _layers(hw: Hardware | None, **options) -> int:
    prepared = prepare("smollm2:135m", LoadOptions(n_ctx=2048, **options), Settings(),
                       hardware=lambda: hw)
    return prepared.options.n_gpu_layers, prepared.info.n_layer


def test_a_roomy_gpu_takes_every_layer():
    layers, n_layer = _layers(machine(23000))
    assert layers == n_layer + 1  # the output layer too


def test_a_nearly_full_gpu_takes_some_layers():
    layers, n_layer = _layers(machine(750))  # 608 MiB of it go to CUDA's own runtime
    assert 0 < layers < n_layer


def test_no_gpu_or_a_cpu_build_or_an_explicit_choice():
    assert _layers(None)[0] == 0
    assert _layers(machine(23000, offload=False))[0] == 0
    assert _layers(machine(23000), n_gpu_layers=5)[0] == 5


def test_a_draft_model_takes_its_share_of_the_gpu_first():
    alone, n_layer = _layers(machine(900))
    with_draft, _ = _layers(machine(900), draft_model="smollm2:135m")
    assert alone == n_layer + 1
    assert 0 < with_draft < n_layer  # the draft goes whole onto the GPU: fewer layers are left


def test_a_draft_model_counts_in_the_ram_check():
    info = prepare("smollm2:135m", LoadOptions(n_ctx=2048, n_gpu_layers=0), Settings()).info
    model = estimate_memory(info, 2048).total
    room = lambda: int(model * 1.9)  # noqa: E731  the model fits; with its draft, a smaller context
    options = LoadOptions(n_ctx=2048, n_gpu_layers=0)
    prepare("smollm2:135m", options, Settings(), available_memory=room)
    with pytest.raises(ContextTooLarge, match="GiB for the draft model — use --ctx"):
        prepare("smollm2:135m", dataclasses.replace(options, draft_model="smollm2:135m"),
                Settings(), available_memory=room)


def test_bench_runs_on_the_device_the_planner_picks(smollm2_path):
    from localinfer.bench import planned_device

    layers, device = planned_device(smollm2_path, 2048, 8, hw=machine(23000))
    assert layers == 31 and device == "GPU NVIDIA GeForce RTX 4090, 31 of 31 layers"
    layers, device = planned_device(smollm2_path, 2048, 8, hw=machine(750))
    assert 0 < layers < 30 and device.startswith("GPU NVIDIA GeForce RTX 4090")
    assert planned_device(smollm2_path, 2048, 8, hw=machine(23000, offload=False)) == (0, "CPU")
    assert planned_device(smollm2_path, 2048, 8, 0, hw=machine(23000)) == (0, "CPU")
