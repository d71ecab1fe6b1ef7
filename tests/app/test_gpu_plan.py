"""The planner's GPU layers reach the load options (hardware injected: no GPU here)."""

from __future__ import annotations

from localinfer.backends.base import LoadOptions
from localinfer.model_store.hardware import CPU, GPU, Hardware
from localinfer.service import prepare
from localinfer.settings import Settings

CPU_X86 = CPU("AMD Ryzen 9 7950X", 16, 32, ("avx", "avx2", "avx512f", "fma", "f16c"))


def machine(free_mib: int, offload: bool = True) -> Hardware:
    gpu = GPU("nvidia", 0, "NVIDIA GeForce RTX 4090", 24564 * 2**20, free_mib * 2**20, "cuda",
              "550.54.14")
    return Hardware(CPU_X86, 64 * 2**30, 60 * 2**30, (gpu,), offload)


def _layers(hw: Hardware | None, **options) -> int:
    _, info, planned = prepare("smollm2:135m", LoadOptions(n_ctx=2048, **options), Settings(),
                               hardware=lambda: hw)
    return planned.n_gpu_layers, info.n_layer


def test_a_roomy_gpu_takes_every_layer():
    layers, n_layer = _layers(machine(23000))
    assert layers == n_layer + 1  # the output layer too


def test_a_nearly_full_gpu_takes_some_layers():
    layers, n_layer = _layers(machine(400))
    assert 0 < layers < n_layer


def test_no_gpu_or_a_cpu_build_or_an_explicit_choice():
    assert _layers(None)[0] == 0
    assert _layers(machine(23000, offload=False))[0] == 0
    assert _layers(machine(23000), n_gpu_layers=5)[0] == 5
