"""The compute backends of the running llama.cpp build, and the devices they drive.

A build made with GGML_BACKEND_DL keeps each backend (CUDA, Vulkan, one CPU library per
instruction-set level) in a library of its own, loaded at run time; until something loads
them llama.cpp has no backend at all and refuses every model. llama.cpp looks beside the
executable, which for Python (or a bundle) is not where the libraries are, so we load them
from llama-cpp-python's library folder. A build with the backends linked in needs nothing.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from localinfer.model_store.hardware import BackendLibrary, Device, by_bus

if TYPE_CHECKING:
    import numpy

__all__ = ["BackendLibrary", "Device", "backend_libraries", "cpu_buffer_type", "devices",
           "cpu_buffer_types_off", "cpu_extra_buffer_types", "ensure_loaded", "strike_buffer_types",
           "strike_unsafe_buffer_types",
           "library_dir", "route_llama_log", "route_mtmd_log", "tensor_floats", "tensor_name"]

log = logging.getLogger("localinfer.llama_cpp")

# enum ggml_backend_dev_type, in order
_DEVICE_KINDS = ("cpu", "gpu", "igpu", "accel", "meta")
_CORE = {"ggml-base"}  # linked by every build; not a backend
_state_lock = threading.Lock()
_state: dict[str, bool | None] = {"at_run_time": None}


# ggml_log_level: NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_log_lock = threading.Lock()
_log_state: dict = {"callback": None, "last_level": logging.INFO}


def _on_llama_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    # level 5 (CONT) continues the previous line at the previous level
    py_level = _LEVELS.get(level, _log_state["last_level"])
    _log_state["last_level"] = py_level
    message = text.decode("utf-8", errors="replace").rstrip("\n")
    if message and log.isEnabledFor(py_level):
        log.log(py_level, "%s", message)


def route_llama_log() -> None:
    """Send llama.cpp's own log into the `localinfer.llama_cpp` logger (once per process,
    until it exits: then back to llama.cpp's own printer, `_unroute_logs`)."""
    import llama_cpp

    with _log_lock:
        if _log_state["callback"] is None:  # kept: llama.cpp calls it for the process's life
            _log_state["callback"] = llama_cpp.llama_log_callback(_on_llama_log)
            llama_cpp.llama_log_set(_log_state["callback"], ctypes.c_void_p(0))
            atexit.register(_unroute_logs)


def _unroute_logs() -> None:
    """At exit, before the interpreter is torn down: llama.cpp's log (ggml's and libmtmd's
    with it) goes back to their own printers on stderr. A line llama.cpp writes after that —
    from a static destructor, or one of ggml's threads — must not call into a Python
    callback whose interpreter is gone."""
    import llama_cpp

    with _log_lock:
        if _log_state["callback"] is None:
            return
        none = llama_cpp.llama_log_callback()  # a null callback: the library's own printer
        llama_cpp.llama_log_set(none, ctypes.c_void_p(0))
        if _log_state.get("mtmd"):
            from llama_cpp import mtmd_cpp

            mtmd_cpp.mtmd_log_set(none, ctypes.c_void_p(0))
            mtmd_cpp.mtmd_helper_log_set(none, ctypes.c_void_p(0))
            _log_state["mtmd"] = False
        # kept, not freed: a thread of ggml's may be inside it still
        _log_state["retired"] = _log_state["callback"]
        _log_state["callback"] = None


def route_mtmd_log() -> None:
    """libmtmd (images) logs apart from llama.cpp, to stderr unless told: into ours too."""
    from llama_cpp import mtmd_cpp

    route_llama_log()
    with _log_lock:
        if not _log_state.get("mtmd"):
            mtmd_cpp.mtmd_log_set(_log_state["callback"], ctypes.c_void_p(0))
            mtmd_cpp.mtmd_helper_log_set(_log_state["callback"], ctypes.c_void_p(0))
            _log_state["mtmd"] = True


@functools.cache
def _ggml() -> ctypes.CDLL:
    """ggml's functions as libllama reaches them, their signatures declared once. A wheel
    holds libggml.so and libggml.so.0 as two copies of one file; loaded by name they would be
    two registries, and backends loaded into the one libllama does not use would leave it
    with none."""
    from llama_cpp import _ggml, llama_cpp

    lib = llama_cpp._lib  # symbols looked up here come from libllama's own libggml
    if not hasattr(lib, "ggml_backend_reg_count"):  # Windows: one ggml.dll, found by name
        lib = _ggml.libggml
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
        getattr(lib, fn).restype = ctypes.c_char_p
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_load_all_from_path.restype = None
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    lib.ggml_get_name.restype = ctypes.c_char_p
    for fn in ("ggml_nbytes", "ggml_nelements"):
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_nelements.restype = ctypes.c_int64
    lib.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
    lib.ggml_is_contiguous.restype = ctypes.c_bool
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                            ctypes.c_size_t]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_buft_name.restype = ctypes.c_char_p
    return lib


def tensor_name(tensor: int) -> bytes:
    """The name llama.cpp gave a tensor of its graph (`result_norm`, `l_out-3`, ...)."""
    return _ggml().ggml_get_name(tensor) or b""


def tensor_floats(tensor: int) -> numpy.ndarray | None:
    """A computed tensor's values copied out of whichever device holds them, flat; None where
    it is not a contiguous tensor of 32-bit floats."""
    import numpy

    lib = _ggml()
    count, size = lib.ggml_nelements(tensor), lib.ggml_nbytes(tensor)
    if count <= 0 or size != 4 * count or not lib.ggml_is_contiguous(tensor):
        return None  # (int32 indices are 4 bytes too: the caller checks the shape it expects)
    out = numpy.empty(count, dtype=numpy.float32)
    lib.ggml_backend_tensor_get(tensor, out.ctypes.data, 0, size)
    return out


def library_dir() -> Path:
    """Where the backend libraries are: beside llama.cpp's own (llama-cpp-python's lib
    folder, LLAMA_CPP_LIB_PATH if set; the bundle puts them there), or in the `bin` folder
    beside the package, where a wheel built with GGML_BACKEND_DL installs them."""
    import llama_cpp
    from llama_cpp import llama_cpp as bindings

    own = Path(bindings._base_path)
    for folder in (own, Path(llama_cpp.__file__).parent.parent / "bin"):
        if _library_files(folder):
            return folder
    return own


def _library_files(folder: Path) -> list[Path]:
    prefix, suffix = ("ggml-", ".dll") if sys.platform == "win32" else ("libggml-", ".so")
    return [path for path in sorted(folder.glob(f"{prefix}*{suffix}"))
            if path.stem.removeprefix("lib") not in _CORE]


def ensure_loaded() -> bool:
    """Load the backend libraries of a GGML_BACKEND_DL build, once per process.

    True when backends were loaded at run time, False when the build links them in.
    """
    route_llama_log()  # llama.cpp says which library it loaded: into our log, not stderr
    by_bus(os.environ)  # devices numbered as NVML numbers them (before CUDA starts)
    with _state_lock:
        if _state["at_run_time"] is None:
            lib = _ggml()
            dynamic = lib.ggml_backend_reg_count() == 0
            if dynamic:
                # the best CPU variant for this CPU, and each GPU backend whose driver loads
                lib.ggml_backend_load_all_from_path(str(library_dir()).encode())
            _strike_unsafe_buffer_types(lib)
            _state["at_run_time"] = dynamic
        return bool(_state["at_run_time"])


# The CPU's extra buffer types llama.cpp must not put weights in. "AMX": the Advanced Matrix
# Extensions kernels a build for the machine's own CPU offers on Xeons since Sapphire Rapids
# crash in their matrix product (ggml_backend_amx_mul_mat) on the first decode of every
# model tried, the embedded default among them, in llama-server as in this process
# (llama.cpp #20824, open). Without it the CPU's other kernels (its repacked layouts where
# they apply) serve those weights.
UNSAFE_BUFFER_TYPES = frozenset({"AMX"})
_struck: list[str] = []  # those this build offered, taken out


def cpu_buffer_types_off() -> tuple[str, ...]:
    """The CPU buffer types this build offered and localinfer took out (UNSAFE_BUFFER_TYPES)."""
    ensure_loaded()
    return tuple(_struck)


def _strike_unsafe_buffer_types(lib: ctypes.CDLL) -> None:
    """UNSAFE_BUFFER_TYPES out of the CPU's extra buffer types, once, before any model loads."""
    name = lambda buft: _text(lib.ggml_backend_buft_name(buft))  # noqa: E731
    struck = strike_unsafe_buffer_types(lambda: _cpu_extra_bufts(lib), name)
    _struck.extend(n for n in struck if n not in _struck)


def strike_unsafe_buffer_types(arrays: Callable[[], list], name: Callable[[int], str]
                               ) -> list[str]:
    """Take UNSAFE_BUFFER_TYPES out of the arrays `arrays()` gives (llama.cpp's getter of the
    list it reads at every model load: a static array, changed in place), then ask the getter
    again: where they are still there (a copy was changed), an error, never a crash to come.
    The names taken out."""
    struck: list[str] = []
    for bufts in arrays():
        struck += [n for n in strike_buffer_types(bufts, name, UNSAFE_BUFFER_TYPES)
                   if n not in struck]
    left = [name(buft) for bufts in arrays() for buft in _entries(bufts)]
    if UNSAFE_BUFFER_TYPES & set(left):
        raise RuntimeError(f"llama.cpp's {', '.join(sorted(UNSAFE_BUFFER_TYPES & set(left)))} "
                           f"kernels could not be turned off; they crash on this CPU")
    if struck:
        log.info("llama.cpp's %s kernels are off (they crash on this CPU); the CPU's extra "
                 "buffer types: %s", ", ".join(struck), ", ".join(left) or "none")
    return struck


def _cpu_extra_bufts(lib: ctypes.CDLL) -> list[ctypes._Pointer]:
    """Each CPU device's extra buffer types (`ggml_backend_dev_get_extra_bufts`): a static,
    null-terminated array of the CPU backend's, the one llama.cpp reads at a load."""
    found = []
    for index in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(index)
        if lib.ggml_backend_dev_type(dev) != 0:  # GGML_BACKEND_DEVICE_TYPE_CPU
            continue
        reg = lib.ggml_backend_dev_backend_reg(dev)
        address = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
        if address:
            get = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)
            bufts = get(dev)
            if bufts:  # (a null pointer: none)
                found.append(bufts)
    return found


def cpu_extra_buffer_types() -> list[str]:
    """The names of the buffer types llama.cpp may put the CPU's weights in besides plain
    memory ("CPU_REPACK": layouts for this CPU's vector units), in its order of preference."""
    ensure_loaded()
    lib = _ggml()
    return [_text(lib.ggml_backend_buft_name(buft))
            for bufts in _cpu_extra_bufts(lib) for buft in _entries(bufts)]


def _entries(bufts: ctypes.Array | ctypes._Pointer) -> list[int]:
    """The entries of a null-terminated array of pointers."""
    entries = []
    while bufts[len(entries)]:
        entries.append(bufts[len(entries)])
    return entries


def strike_buffer_types(bufts: ctypes.Array | ctypes._Pointer, name: Callable[[int], str],
                        names: frozenset[str]) -> list[str]:
    """Remove the entries named `names` from a null-terminated array of buffer types, in
    place, the others kept in their order (llama.cpp takes the first that supports a
    tensor), the array still ending in a null; the names removed."""
    entries = _entries(bufts)
    kept = [buft for buft in entries if name(buft) not in names]
    for at in range(len(entries)):
        bufts[at] = kept[at] if at < len(kept) else None
    return [name(buft) for buft in entries if name(buft) in names]


def devices() -> tuple[Device, ...]:
    """Every device the loaded backends can run on, GPUs first as llama.cpp orders them."""
    ensure_loaded()
    lib = _ggml()
    found = []
    for index in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = lib.ggml_backend_dev_type(dev)
        found.append(Device(
            backend=_text(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev))),
            name=_text(lib.ggml_backend_dev_name(dev)),
            description=_text(lib.ggml_backend_dev_description(dev)),
            kind=_DEVICE_KINDS[kind] if 0 <= kind < len(_DEVICE_KINDS) else "other",
            free_bytes=free.value, total_bytes=total.value))
    return tuple(found)


def cpu_buffer_type() -> int:
    """The buffer type of host memory, as the CPU device gives it (for tensors that must stay
    in this machine's RAM)."""
    ensure_loaded()
    lib = _ggml()
    lib.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    for index in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(index)
        if lib.ggml_backend_dev_type(dev) == 0:  # GGML_BACKEND_DEVICE_TYPE_CPU
            return lib.ggml_backend_dev_buffer_type(dev)
    raise RuntimeError("llama.cpp has no CPU device")


def _mapped_files() -> set[str] | None:
    try:
        text = Path("/proc/self/maps").read_text()
    except OSError:  # not Linux: cannot tell which libraries are loaded
        return None
    fields = (line.split(maxsplit=5) for line in text.splitlines())
    return {Path(f[5]).name for f in fields if len(f) == 6}  # the sixth: the mapped file


def backend_libraries(folder: Path | None = None,
                      loaded_files: Callable[[], set[str] | None] = _mapped_files
                      ) -> tuple[BackendLibrary, ...]:
    """The backend libraries a GGML_BACKEND_DL build may load, and which of them it did.

    Empty for a build with the backends linked in. `loaded_files`: the names of the files
    this process has loaded, None where the platform cannot tell.
    """
    if not ensure_loaded() and folder is None:
        return ()
    mapped = loaded_files()
    found = []
    for path in _library_files(folder or library_dir()):
        name = path.stem.removeprefix("lib")
        loaded = None if mapped is None else path.resolve().name in mapped
        # one CPU library of many is meant to load; a GPU one that did not is worth a reason
        gpu_missing = loaded is False and not name.startswith("ggml-cpu")
        found.append(BackendLibrary(name, loaded, _why_not_loaded(path) if gpu_missing else ""))
    return tuple(found)


def _why_not_loaded(path: Path) -> str:
    """llama.cpp's release builds load backends silently; the system's loader names what is
    missing (a driver: "libcuda.so.1: cannot open shared object file")."""
    try:
        ctypes.CDLL(str(path))
    except OSError as exc:
        return str(exc)
    return "it loads, but llama.cpp found no device for it"


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", "replace")
