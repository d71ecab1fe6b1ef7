"""What this machine has for running models, as the vendors' tools and llama.cpp's own build
say: the one probe every front end uses (`model_store.hardware` holds the data and the
parsers, and loads no native library)."""

from __future__ import annotations

from localinfer.backends.native import ggml as ggml_backends
from localinfer.model_store.hardware import (Hardware, NativeFacts, Runner, parse_system_info,
                                             run_tool, survey)

__all__ = ["detect", "native_facts"]


def detect(run: Runner = run_tool, system: str | None = None,
           machine: str | None = None) -> Hardware:
    return survey(native_facts(), run, system, machine)


def native_facts() -> NativeFacts:
    """Offload support, backends and devices of the llama.cpp build: each "none" where the
    native library did not load or could not say (then nothing can offload)."""
    return NativeFacts(_gpu_offload(), _compute_backends(), *_devices(), *_cpu_buffer_types())


def _gpu_offload() -> bool:
    try:
        import llama_cpp

        ggml_backends.ensure_loaded()
        return bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:  # the native library did not load: nothing can offload
        return False


def _compute_backends() -> tuple[str, ...]:
    try:
        import llama_cpp

        ggml_backends.ensure_loaded()
        return parse_system_info(llama_cpp.llama_print_system_info().decode("utf-8", "replace"))
    except Exception:  # the native library did not load
        return ()


def _devices() -> tuple[tuple, tuple]:
    try:
        return ggml_backends.devices(), ggml_backends.backend_libraries()
    except Exception:  # the native library did not load: it has no devices
        return (), ()


def _cpu_buffer_types() -> tuple[tuple[str, ...], tuple[str, ...]]:
    try:
        return (tuple(ggml_backends.cpu_extra_buffer_types()),
                ggml_backends.cpu_buffer_types_off())
    except Exception:  # the native library did not load
        return (), ()
