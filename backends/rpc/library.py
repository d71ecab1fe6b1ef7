"""llama.cpp's RPC backend (ggml-rpc): a worker serves its devices to a head over TCP, and the
head's llama.cpp places layers on them as on local GPUs.

llama-cpp-python's wheels are built without it, and pip would keep reusing a wheel built
without it whatever flags a later install passes, so it is built here, once per llama.cpp
version, as a library of its own: two source files of the same llama.cpp release the
installed llama-cpp-python was built from (its sdist, from pip's cache or the index),
compiled against the installed ggml (a few seconds) into the user's cache folder. It links to
the ggml libllama already loaded, so the devices it adds are the ones llama.cpp sees.

Everything here talks to ggml and so may abort the process on a network fault: it runs in a
runner or worker process, never in the server, and only after `workers.probe` has checked the
endpoint in Python.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from filelock import FileLock

from localinfer.errors import LocalinferError

__all__ = ["BUNDLE_RPATH", "RpcUnavailable", "attach", "build", "built", "identity", "join",
           "library", "llama_order", "serve", "status"]

_SOURCES = ("ggml/src/ggml-rpc/ggml-rpc.cpp", "ggml/src/ggml-rpc/transport.cpp")
_HEADERS = re.compile(r"^(ggml/include/[^/]+\.h|ggml/src/[^/]+\.h|ggml/src/ggml-rpc/[^/]+\.h)$")
_LIB = "libggml-rpc.dylib" if sys.platform == "darwin" else "libggml-rpc.so"
# where a packaged app's copy finds libggml: beside it in the bundle (localinfer_rpc/ and
# llama_cpp/lib/ side by side), not in the environment it was built in
BUNDLE_RPATH = f"{'@loader_path' if sys.platform == 'darwin' else '$ORIGIN'}/../llama_cpp/lib"


class RpcUnavailable(LocalinferError):
    """The RPC backend cannot be built or loaded here."""


@dataclass(frozen=True)
class Build:
    library: Path
    protocol: str  # "7.0.0": a head and a worker must speak the same


def _version() -> str:
    from importlib.metadata import version

    return version("llama_cpp_python")


def _folder() -> Path:
    return platformdirs.user_cache_path("localinfer") / "rpc" / _version()


def built() -> Build | None:
    """The RPC backend built for this llama.cpp, None until one is: the one a packaged app
    carries (built when it was packaged: a bundle has neither pip nor a compiler), else the
    one in the cache folder."""
    bundled = getattr(sys, "_MEIPASS", None)
    for folder in ([Path(bundled) / "localinfer_rpc"] if bundled else []) + [_folder()]:
        found = _built_in(folder)
        if found:
            return found
    return None


def _built_in(folder: Path) -> Build | None:
    try:
        protocol = str(json.loads((folder / "build.json").read_text())["protocol"])
    except (OSError, ValueError, KeyError, TypeError):  # none, or damaged: built again
        return None
    library = folder / _LIB
    return Build(library, protocol) if library.is_file() else None


def library() -> Build:
    """The RPC backend for the installed llama.cpp, built first if it is not yet (once per
    llama.cpp version and machine; a lock keeps two processes from building it at once)."""
    found = built()
    if found:
        return found
    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / ".lock")):
        return built() or build(folder)


def build(folder: Path, rpath: str | None = None) -> Build:
    """Build the RPC backend into `folder` from the source of the installed llama.cpp's
    release, against this environment's libggml; `rpath` is where it finds libggml when
    loaded (default: this environment's llama_cpp/lib; a bundle's copy: BUNDLE_RPATH). The
    packaging builds it so, not from the user cache, which is keyed by version alone and may
    hold a build of another environment."""
    if sys.platform == "win32":
        raise RpcUnavailable("RPC workers are not built on Windows yet — run the worker and "
                             "the head on Linux or macOS")
    with tempfile.TemporaryDirectory(prefix="localinfer-rpc-") as scratch:
        tree = _unpack(_sdist(Path(scratch)), Path(scratch) / "src")
        protocol = _protocol_of(tree / "ggml/include/ggml-rpc.h")
        tmp = folder / f".{_LIB}.tmp"
        _compile(tree, tmp, rpath)
        os.replace(tmp, folder / _LIB)
    (folder / "build.json").write_text(json.dumps({"protocol": protocol,
                                                   "llama_cpp_python": _version()}))
    return _built_in(folder) or _fail("the RPC backend was built but cannot be found")


def status() -> dict:
    """Whether this machine can serve or use RPC workers, for `hw`: built, or buildable."""
    found = built()
    if found:
        return {"built": True, "protocol": found.protocol, "library": str(found.library),
                "summary": f"yes, RPC {found.protocol} (`localinfer worker` serves this "
                           f"machine; --workers uses others)"}
    if sys.platform == "win32":
        summary = "no: not built on Windows yet"
    elif _compiler():
        summary = "built on first use of `localinfer worker` or --workers (a few seconds)"
    else:
        summary = "no: building llama.cpp's RPC backend needs a C++ compiler (Debian: apt " \
                  "install g++)"
    return {"built": False, "protocol": None, "library": None, "summary": summary}


def _compiler() -> str | None:
    return (os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
            or shutil.which("clang++"))


def _fail(message: str):
    raise RpcUnavailable(message)


def _sdist(scratch: Path) -> Path:
    """llama-cpp-python's source release of the installed version: pip's cache has it where
    pip built the wheel here; otherwise the package index."""
    version = _version()
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
               ":all:", f"llama-cpp-python=={version}", "-d", str(scratch)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    found = sorted(scratch.glob("llama_cpp_python-*.tar.gz"))
    if done.returncode or not found:
        last = (done.stderr.strip().splitlines() or ["no file"])[-1]
        raise RpcUnavailable(f"cannot get llama-cpp-python {version}'s source to build the RPC "
                             f"backend ({last}) — connect this machine to the package index "
                             f"once")
    return found[0]


def _unpack(sdist: Path, into: Path) -> Path:
    """The llama.cpp files the RPC backend needs, and only those, out of the sdist."""
    with tarfile.open(sdist) as archive:
        members = []
        for member in archive.getmembers():
            parts = member.name.split("/vendor/llama.cpp/", 1)
            if len(parts) == 2 and member.isfile() and (parts[1] in _SOURCES
                                                        or _HEADERS.match(parts[1])):
                member.name = parts[1]
                members.append(member)
        archive.extractall(into, members=members, filter="data")
    missing = [s for s in _SOURCES if not (into / s).is_file()]
    if missing:
        raise RpcUnavailable(f"llama-cpp-python {_version()}'s source has no {missing[0]}: "
                             f"this llama.cpp has no RPC backend")
    return into


def _protocol_of(header: Path) -> str:
    text = header.read_text()
    parts = [re.search(rf"RPC_PROTO_{p}_VERSION\s+(\d+)", text) for p in ("MAJOR", "MINOR",
                                                                         "PATCH")]
    if not all(parts):
        raise RpcUnavailable(f"{header.name} names no RPC protocol version")
    return ".".join(m.group(1) for m in parts)


def _compile(tree: Path, out: Path, rpath: str | None = None) -> None:
    import importlib.util

    # (found, not imported: the server builds this without loading llama.cpp)
    libs = Path(importlib.util.find_spec("llama_cpp").submodule_search_locations[0]) / "lib"
    compiler = _compiler()
    if not compiler:
        raise RpcUnavailable("building the RPC backend needs a C++ compiler (c++, g++ or "
                             "clang++) — install one (Debian: apt install g++)")
    command = [compiler, "-std=c++17", "-O2", "-fPIC", "-shared", "-DNDEBUG", "-DGGML_SHARED",
               "-DGGML_BACKEND_SHARED", "-DGGML_BACKEND_BUILD", f"-I{tree / 'ggml/include'}",
               f"-I{tree / 'ggml/src'}", *(str(tree / s) for s in _SOURCES), f"-L{libs}",
               "-lggml", "-lggml-base", f"-Wl,-rpath,{rpath or libs}", "-pthread", "-o", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode:
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        raise RpcUnavailable(f"building the RPC backend failed: "
                             f"{(errors or done.stderr.splitlines() or ['?'])[0]}")


def identity() -> tuple[str, str]:
    """What a head and its workers must share: the llama-cpp-python release and the RPC
    protocol this machine speaks (building the backend if need be)."""
    return _version(), library().protocol


@functools.cache
def _lib() -> ctypes.CDLL:
    from localinfer.backends.native.ggml import ensure_loaded

    ensure_loaded()  # libggml first: the RPC library binds to the copy libllama uses
    lib = ctypes.CDLL(str(library().library))
    lib.ggml_backend_rpc_start_server.argtypes = [
        ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p)]
    lib.ggml_backend_rpc_start_server.restype = None
    lib.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    return lib


def serve(endpoint: str, cache_dir: Path | None, n_threads: int, devices: list[int]) -> None:
    """Serve these of the process's ggml devices (by index) at endpoint; never returns (run it
    on a thread: ctypes lets go of the GIL)."""
    from localinfer.backends.native.ggml import _ggml

    lib, ggml = _lib(), _ggml()
    handles = (ctypes.c_void_p * len(devices))(*(ggml.ggml_backend_dev_get(i) for i in devices))
    lib.ggml_backend_rpc_start_server(endpoint.encode(),
                                      str(cache_dir).encode() if cache_dir else None,
                                      n_threads, len(devices), handles)


def attach(endpoint: str) -> list[str]:
    """Add a worker's devices to llama.cpp's (as llama-server's --rpc does): the names they
    get, "RPC0", "RPC1", … in the order they join. The endpoint must answer (probe it first:
    ggml aborts the process when it does not)."""
    from localinfer.backends.native.ggml import _ggml

    lib, ggml = _lib(), _ggml()
    reg = lib.ggml_backend_rpc_add_server(endpoint.encode())
    if not reg:
        raise RpcUnavailable(f"the worker at {endpoint} offers no device")
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_register.restype = None
    ggml.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    ggml.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_register(reg)
    return [(ggml.ggml_backend_dev_name(ggml.ggml_backend_reg_dev_get(reg, i)) or b"").decode()
            for i in range(ggml.ggml_backend_reg_dev_count(reg))]


_joined: dict[str, object] = {}  # endpoint → its Tunnel, for the process's life


def join(endpoints: tuple[str, ...], key: str | None, head: str | None = None) -> int:
    """Make the workers' devices llama.cpp's, in the order given (once per process): each is
    probed in Python first, then reached through a loopback tunnel that carries the key. How
    many devices the workers have added."""
    from localinfer.backends.rpc.workers import HEAD, Tunnel, check_usable, probe

    for endpoint in endpoints:
        if endpoint in _joined:
            continue
        check_usable(probe(endpoint, key), *identity())
        tunnel = Tunnel(endpoint, key, head=head or HEAD)
        _joined[endpoint] = (tunnel, attach(tunnel.local))
    return sum(len(names) for _, names in _joined.values())


def llama_order(split: tuple[float, ...], main_gpu: int, n_local: int,
                n_remote: int) -> tuple[tuple[float, ...], int]:
    """A plan's shares and main GPU, numbered as the planner numbers devices (this machine's
    GPUs, then the workers'), in llama.cpp's order, which puts RPC devices first."""
    if not n_remote:
        return split, main_gpu
    padded = tuple(split) + (0.0,) * (n_local + n_remote - len(split))
    moved = padded[n_local:n_local + n_remote] + padded[:n_local] if split else ()
    return moved, main_gpu - n_local if main_gpu >= n_local else main_gpu + n_remote
