"""llama.cpp's libraries load before gguf or sentencepiece, whatever the way in.

On a CUDA build, a model load crashes the process when sentencepiece (which the gguf package
imports where it is installed) came into the process before llama.cpp's shared libraries.
A CPU build does not crash, so these tests watch the order itself: an audit hook sees every
import of gguf or sentencepiece and looks in /proc/self/maps for libllama at that moment.
"""

from __future__ import annotations

import importlib.util
import json
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(),
                                reason="reads the process's memory map (Linux)")

_WATCH = textwrap.dedent("""
    import json, os, sys
    early = []
    def _hook(event, args):
        if event == "import" and args[0] in ("gguf", "sentencepiece"):
            with open("/proc/self/maps") as maps:
                if "libllama" not in maps.read():
                    early.append(args[0])
    sys.addaudithook(_hook)
""")


def _modules() -> list[str]:
    """Every module of ours (the subpackages live in folders of their own)."""
    names = set()
    for package in ("localinfer", "localinfer.api", "localinfer.backends",
                    "localinfer.model_store", "localinfer.tui"):
        path = importlib.util.find_spec(package).submodule_search_locations
        names |= {m.name for m in pkgutil.iter_modules(path, package + ".")}
    return sorted(n for n in names if not n.endswith("__main__"))


def test_no_module_brings_gguf_in_before_llama_cpp():
    """Each module imported alone, in a fresh child of one process (forked after the
    third-party libraries are in, so that each child imports only our own modules)."""
    script = _WATCH + textwrap.dedent("""
        import fastapi, httpx, numpy, pydantic, rich, textual, typer, uvicorn  # noqa: F401
        bad = {}
        for name in json.loads(sys.argv[1]):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                __import__(name)
                os.write(write, json.dumps(early).encode())
                os._exit(0)
            os.close(write)
            with os.fdopen(read) as pipe:
                out = pipe.read()
            os.waitpid(pid, 0)
            if out != "[]":
                bad[name] = out or "the import failed"
        print(json.dumps(bad))
    """)
    modules = _modules()
    assert "localinfer.model_store.gguf_info" in modules and len(modules) > 30
    result = subprocess.run([sys.executable, "-c", script, json.dumps(modules)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}


@pytest.mark.parametrize("argv", [["show", "smollm2:135m", "--json"],
                                  ["run", "smollm2:135m", "--prompt", "Hi", "--max-tokens", "1"]])
def test_cli_commands_load_llama_cpp_before_gguf(argv, smollm2_path):
    script = _WATCH + textwrap.dedent("""
        import atexit
        atexit.register(lambda: print("EARLY", json.dumps(early), file=sys.stderr))
        sys.argv = ["localinfer", *json.loads(sys.argv[1])]
        from localinfer.cli import main
        main()
    """)
    result = subprocess.run([sys.executable, "-c", script, json.dumps(argv)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "EARLY []" in result.stderr, result.stderr
