"""sentencepiece never comes into our processes, whatever the way in, and the model store
loads no native library.

On a CUDA build, a model load crashed the process when a private libstdc++ (sentencepiece's,
which the gguf package imports where it is installed, or numpy's) came into the process before
llama.cpp's shared libraries: the package's root now makes the system's libstdc++ global
first (app/__init__.py; the last test). The store imports gguf with sentencepiece kept out
(model_store/gguf_info.py). These tests put a stand-in sentencepiece on the path, as a user's
machine may have the real one, and look for it in sys.modules after each way in.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture(scope="module")
def sentencepiece_env(tmp_path_factory) -> dict[str, str]:
    """The environment of a process that could import sentencepiece (a stand-in)."""
    folder = tmp_path_factory.mktemp("site") / "sentencepiece"
    folder.mkdir()
    (folder / "__init__.py").write_text("SentencePieceProcessor = object\n")
    path = os.pathsep.join(p for p in (str(folder.parent), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def test_the_stand_in_is_what_gguf_would_import(sentencepiece_env):
    """The check can fail: gguf on its own brings the stand-in in."""
    done = subprocess.run([sys.executable, "-c", "import sys, gguf; "
                           "print('sentencepiece' in sys.modules)"], env=sentencepiece_env,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True"], done.stderr[-2000:]


def _modules() -> list[str]:
    """Every module of ours, sub-packages' too (the mapped folders found as installed)."""
    names = set()
    for package in ("localinfer", "localinfer.api", "localinfer.backends",
                    "localinfer.model_store", "localinfer.tui"):
        path = importlib.util.find_spec(package).submodule_search_locations
        names |= {m.name for m in pkgutil.walk_packages(path, package + ".")}
    return sorted(n for n in names if not n.endswith("__main__"))


def test_no_module_brings_sentencepiece_in(sentencepiece_env):
    """Each module imported alone, in a fresh child of one process (forked after the
    third-party libraries are in, so that each child imports only our own modules)."""
    script = textwrap.dedent("""
        import json, os, sys
        import fastapi, httpx, numpy, pydantic, rich, textual, typer, uvicorn  # noqa: F401
        bad = []
        for name in json.loads(sys.argv[1]):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                __import__(name)
                os.write(write, b"in" if "sentencepiece" in sys.modules else b"out")
                os._exit(0)
            os.close(write)
            with os.fdopen(read) as pipe:
                out = pipe.read()
            os.waitpid(pid, 0)
            if out != "out":
                bad.append(f"{name}: {out or 'the import failed'}")
        print(json.dumps(bad))
    """)
    modules = _modules()
    assert "localinfer.model_store.gguf_info" in modules and len(modules) > 30
    result = subprocess.run([sys.executable, "-c", script, json.dumps(modules)],
                            env=sentencepiece_env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_the_model_store_loads_no_native_library():
    """The store reads headers and plans: llama.cpp loads in the backends, not here."""
    store = [name for name in _modules() if name.startswith("localinfer.model_store.")]
    code = ("import importlib, json, sys\n"
            f"for name in {store!r}: importlib.import_module(name)\n"
            "print(json.dumps([m for m in ('llama_cpp', 'sentencepiece') if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(store) > 8 and json.loads(done.stdout) == []


@pytest.mark.parametrize("argv", [["show", "smollm2:135m", "--json"],
                                  ["run", "smollm2:135m", "--prompt", "Hi", "--max-tokens", "1"]])
def test_cli_commands_bring_no_sentencepiece_in(argv, smollm2_path, sentencepiece_env):
    script = textwrap.dedent("""
        import atexit, json, sys
        atexit.register(lambda: print("SENTENCEPIECE", "sentencepiece" in sys.modules,
                                      file=sys.stderr))
        sys.argv = ["localinfer", *json.loads(sys.argv[1])]
        from localinfer.cli import main
        main()
    """)
    result = subprocess.run([sys.executable, "-c", script, json.dumps(argv)],
                            env=sentencepiece_env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "SENTENCEPIECE False" in result.stderr, result.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux loader's scopes")
def test_the_cxx_runtime_is_global_before_llama_cpp_loads():
    """Once localinfer is in, the system's libstdc++ answers a C++ symbol from the global
    scope, numpy (which brings it in privately) imported first; llama.cpp's libraries, loaded
    later, bind to that copy and not to the one a CUDA build's libggml-cuda carries (its
    hybrid models crashed at load: app/__init__.py)."""
    code = textwrap.dedent("""
        import ctypes, json, sys
        import numpy  # noqa: F401
        scope = ctypes.CDLL(None)  # the process's global scope
        before = hasattr(scope, "_ZNSo9_M_insertIlEERSoT_")  # ostream << long
        import localinfer  # noqa: F401
        symbol = ctypes.cast(getattr(scope, "_ZNSo9_M_insertIlEERSoT_", None), ctypes.c_void_p)
        class Info(ctypes.Structure):
            _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                        ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
        info = Info()
        found = symbol.value and ctypes.CDLL(None).dladdr(symbol, ctypes.byref(info))
        print(json.dumps([before, "llama_cpp" in sys.modules,
                          info.fname.decode() if found else None]))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    before, llama_loaded, owner = json.loads(done.stdout)
    assert not before and not llama_loaded  # the check can fail: nothing made it global yet
    assert owner and "libstdc++.so" in owner
