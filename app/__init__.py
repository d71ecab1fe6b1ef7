"""localinfer: run large language models on your own machine."""

from __future__ import annotations

import ctypes
import sys

__version__ = "0.1.0"
__all__ = ["__version__"]


def _share_cxx_runtime() -> None:
    """The system's C++ runtime (libstdc++) made global in this process, before any of
    llama.cpp's libraries loads.

    A CUDA build of llama.cpp (seen with nvcc 13.0 and GCC 13) carries a copy of libstdc++
    inside libggml-cuda.so and exports it, and its other libraries need no other. Where the
    system's libstdc++ came into the process first without being made global (numpy brings it
    so, and sentencepiece), libllama's C++ calls bind partly to one copy and partly to the
    other, and a model load crashes in the iostream code of llama_model::print_info: every
    hybrid model did (its per-layer KV head counts are printed that way) in a process that
    imported numpy or read a GGUF header before llama.cpp (a runner loads llama.cpp first,
    by the order of its imports alone). Global before libllama loads, the system's copy
    answers every call, whatever the order. Nothing to do elsewhere: macOS and Windows
    resolve symbols per library."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
    except OSError:  # no C++ runtime on this machine: llama.cpp brings its own
        pass


_share_cxx_runtime()
