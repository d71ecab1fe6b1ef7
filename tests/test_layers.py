"""The package's layers, read from the source: a module imports only from its own layer or
those below it — at the top of a file or inside a function alike — and no modules import
each other in a circle. docs/ARCHITECTURE.md draws the same layers.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# bottom to top; a module of a layer may import its own layer and those before it
LAYERS = [
    ("foundation", ["localinfer", "localinfer.errors", "localinfer.files", "localinfer.settings"]),
    ("model store", ["localinfer.model_store"]),
    ("chat formats", ["localinfer.chat_formats"]),
    ("backends", ["localinfer.backends"]),
    ("services", ["localinfer.service", "localinfer.runners", "localinfer.pool", "localinfer.repl",
                  "localinfer.model_rows", "localinfer.bench", "localinfer.worker",
                  "localinfer.images", "localinfer.installed"]),
    ("front ends", ["localinfer.api", "localinfer.tui", "localinfer.web"]),
    ("commands", ["localinfer.cli", "localinfer.desktop", "localinfer.launch",
                  "localinfer.__main__"]),
]
# front ends of one layer that stay apart: each stands on the services alone (the server
# serves the web page: api may import web)
INDEPENDENT = ["localinfer.api", "localinfer.tui"]
# the front ends and the commands reach models through the manager (service, pool, installed,
# model_rows: the services layer) and the chat formats; of the backends, only the interface
# that crosses to them (the Backend, its events and parameters, the timings)
FRONT_ENDS = ["localinfer.api", "localinfer.tui", "localinfer.web", "localinfer.cli",
              "localinfer.desktop", "localinfer.launch", "localinfer.__main__"]
INTERFACE = ["localinfer.backends", "localinfer.backends.base", "localinfer.backends.metrics"]
INTERNALS = ["localinfer.backends", "localinfer.model_store"]


def _modules() -> dict[str, Path]:
    """Every module, read through pyproject.toml's package-dir (the folders at the top map
    onto `localinfer.*`)."""
    spec = importlib.util.spec_from_file_location("installed_tree",
                                                  ROOT / "packaging" / "installed_tree.py")
    tree = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tree)
    return tree.modules(ROOT)


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules that `path` imports anywhere in it (`from localinfer import x` names the
    module x where there is one)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n in modules}


def _layer(module: str) -> tuple[int, str]:
    """(layer index, the entry of LAYERS it falls under: the longest that names it)."""
    best = None
    for index, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and (
                    best is None or len(entry) > len(best[1])):
                best = (index, entry)
    assert best is not None, f"{module} is in no layer: add it to LAYERS (and the docs)"
    return best


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_the_layers_are_read_from_every_module():
    graph = _graph()
    assert {"localinfer.cli", "localinfer.backends.engine.scheduler", "localinfer.api.core",
            "localinfer.model_store.planner", "localinfer.tui.chat_app",
            "localinfer.tui.screens.model_picker"} <= graph.keys()
    assert "localinfer.backends.native.model" in graph["localinfer.backends.engine.scheduler"]
    assert "localinfer.pool" in graph["localinfer.cli"]  # imported inside a function


def test_no_module_imports_from_a_layer_above_it():
    upward = []
    for module, imported in sorted(_graph().items()):
        level, entry = _layer(module)
        for target in sorted(imported):
            target_level, target_entry = _layer(target)
            if target_level > level or (entry != target_entry and {entry, target_entry}
                                        <= set(INDEPENDENT)):
                upward.append(f"{module} ({LAYERS[level][0]}) imports {target} "
                              f"({LAYERS[target_level][0]})")
    assert not upward, "\n".join(upward)


def test_the_front_ends_reach_models_through_the_manager_only():
    """api/, tui/, the web app and the commands import no backend internals (engine, runner,
    ctypes, RPC) and nothing of the model store: `show`, `/api/tags` and the chat app's
    figures ask the services, which own those rules."""
    reached = []
    for module, imported in sorted(_graph().items()):
        if not any(module == f or module.startswith(f + ".") for f in FRONT_ENDS):
            continue
        for target in sorted(imported):
            inside = any(target == i or target.startswith(i + ".") for i in INTERNALS)
            if inside and target not in INTERFACE:
                reached.append(f"{module} imports {target}")
    assert not reached, "\n".join(reached)


def test_no_modules_import_each_other_in_a_circle():
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(" → ".join(path[path.index(target):] + [module, target]))
            elif target not in state:
                visit(target, path + [module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not cycles, "\n".join(cycles)


def test_the_planner_and_the_status_commands_load_no_native_library():
    """`localinfer ps` and `stop` read a host and a port; they loaded llama.cpp and
    huggingface_hub through the settings. The planner is arithmetic on a header."""
    import subprocess
    import sys

    for code in ("import localinfer.model_store.planner, localinfer.model_store.hardware",
                 "import sys; sys.argv = ['localinfer', 'ps']\n"
                 "from localinfer.cli import main\ntry: main()\nexcept SystemExit: pass",
                 "import sys; sys.argv = ['localinfer', 'stop', 'smollm2']\n"
                 "from localinfer.cli import main\ntry: main()\nexcept SystemExit: pass"):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                              capture_output=True, text=True, timeout=60,
                              env={"LOCALINFER_PORT": "9", "PATH": "/usr/bin:/bin"})
        imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()
                    if line.startswith("import time:")}
        assert "localinfer.settings" in imported or "planner" in code, done.stderr[-500:]
        assert not imported & {"llama_cpp", "huggingface_hub", "gguf", "numpy"}, code
