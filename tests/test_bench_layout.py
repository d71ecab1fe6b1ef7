"""bench/'s layout, read from the source with `ast` (nothing imported, nothing run).

Every benchmark leaves its command line, figure and files to bench/harness.py, imports no
other benchmark (shared code lives in harness.py, clients.py and random_gguf.py), uses only
localinfer's public names, and writes its results with harness.write.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
MODULES = {path.stem for path in BENCH.glob("*.py")}
SHARED = {"harness", "clients", "random_gguf"}  # what a benchmark may import from bench/
# not benchmarks: tools that write GGUF files (a model, a vision projector: their own command
# lines), and the clients' command line (it appends JSON lines to --out for the benchmark or
# GPU session that runs it)
OWN_PARSER = {"random_gguf", "random_mmproj"}
WRITES_NOTHING = {"random_gguf", "random_mmproj", "serve_load"}
# a line `import x, y` or `from x import ...` inside code a script hands to `python -c`
_CODE_IMPORT = re.compile(r"^[ \t]*(?:import[ \t]+([\w.]+(?:[ \t]*,[ \t]*[\w.]+)*)[ \t]*$"
                          r"|from[ \t]+([\w.]+)[ \t]+import[ \t])", re.MULTILINE)


def _code_imports(text: str) -> list[str]:
    return [name.strip().split(".")[0] for names, module in _CODE_IMPORT.findall(text)
            for name in (names.split(",") if names else [module])]


def _file(name: str) -> str:
    return f"bench/{name}.py"


def imported_modules(tree: ast.AST) -> list[tuple[str, int]]:
    """(top-level module, line) of every import, in code and in code strings."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # bench/ is no package: a relative import is a sibling's
                found += [(node.module or alias.name, node.lineno) for alias in node.names]
            elif node.module:
                found.append((node.module.split(".")[0], node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(m, node.lineno) for m in _code_imports(node.value)]
    return found


def sibling_imports(name: str, tree: ast.AST, modules: set[str] = MODULES) -> list[str]:
    """(a) a benchmark imports no other benchmark; only the shared modules."""
    return [f"{_file(name)}:{line} imports the benchmark {module!r} (shared code belongs in "
            f"{', '.join(sorted(SHARED))})"
            for module, line in imported_modules(tree)
            if module in modules - SHARED and module != name]


def _called(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def harness_only_calls(name: str, tree: ast.AST) -> list[str]:
    """(b) the parser, the figure and its file come from harness.py."""
    if name == "harness":
        return []
    banned = {"savefig", "subplots"} | (set() if name in OWN_PARSER else {"ArgumentParser"})
    return [f"{_file(name)}:{node.lineno} calls {_called(node)}() (use harness.arguments, "
            "harness.figure, harness.write)"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _called(node) in banned]


def private_localinfer_names(name: str, tree: ast.AST) -> list[str]:
    """(c) only localinfer's public names."""
    return [f"{_file(name)}:{node.lineno} imports the private {alias.name!r} from "
            f"{node.module}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and not node.level
            and (node.module or "").split(".")[0] == "localinfer"
            for alias in node.names if alias.name.startswith("_")]


def _has_main_guard(tree: ast.Module) -> bool:
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
                and test.left.id == "__name__" and len(test.comparators) == 1
                and isinstance(test.comparators[0], ast.Constant)
                and test.comparators[0].value == "__main__"):
            return True
    return False


def _calls_harness_write(tree: ast.AST) -> bool:
    modules = {"harness"}  # names harness goes by here, and names its write goes by
    writes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "harness"}
        elif isinstance(node, ast.ImportFrom) and node.module == "harness" and not node.level:
            writes |= {a.asname or a.name for a in node.names if a.name == "write"}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr == "write"
                and isinstance(func.value, ast.Name) and func.value.id in modules):
            return True
        if isinstance(func, ast.Name) and func.id in writes:
            return True
    return False


def writes_with_harness(name: str, tree: ast.Module) -> list[str]:
    """(d) a benchmark's results go through harness.write."""
    if name in SHARED | WRITES_NOTHING or not _has_main_guard(tree):
        return []
    if _calls_harness_write(tree):
        return []
    return [f"{_file(name)} runs as a script but never calls harness.write"]


CHECKS = (sibling_imports, harness_only_calls, private_localinfer_names, writes_with_harness)


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_bench_file_keeps_the_layout(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    problems = [p for check in CHECKS for p in check(path.stem, tree)]
    assert not problems, "\n".join(problems)


def test_the_shared_modules_are_there():
    assert SHARED <= MODULES, f"missing in bench/: {sorted(SHARED - MODULES)}"


# Each check on a small source: a violation is found, and named by its file.
_MAIN = '\nif __name__ == "__main__":\n    main()\n'
VIOLATIONS = {
    "sibling import": (sibling_imports, "from stream_cost import start_server\n"),
    "sibling import as module": (sibling_imports, "import serve_load\n"),
    "sibling import in -c code": (sibling_imports,
                                  'CODE = "import sys\\nimport os, step_profile\\n"\n'),
    "sibling from-import in -c code": (sibling_imports, 'CODE = f"from {x}\\n" '
                                       '"from step_profile import uncached_tokens\\n"\n'),
    "savefig": (harness_only_calls, "fig.savefig('x.png')\n"),
    "plt.subplots": (harness_only_calls, "fig, ax = plt.subplots(figsize=(6, 4))\n"),
    "own parser": (harness_only_calls, "parser = argparse.ArgumentParser()\n"),
    "private localinfer name": (private_localinfer_names,
                                "from localinfer.bench import Workload, _FILLER\n"),
    "no harness.write": (writes_with_harness,
                         "import json\ndef main():\n    json.dump({}, open('x.json', 'w'))\n"
                         + _MAIN),
    "write not from harness": (writes_with_harness,
                               "from somewhere import write\ndef main():\n    write()\n" + _MAIN),
}
ALLOWED = {
    "shared imports": (sibling_imports, "import harness\nfrom clients import level\n"
                                        "from random_gguf import fast_step_model\n"),
    "harness.write": (writes_with_harness, "import harness\ndef main():\n"
                                           "    harness.write('x', {}, [], [])\n" + _MAIN),
    "write from harness": (writes_with_harness, "from harness import write\ndef main():\n"
                                                "    write('x', {}, [], [])\n" + _MAIN),
    "public localinfer names": (private_localinfer_names,
                                "from localinfer.bench import FILLER, prompt_tokens\n"),
    "harness.figure": (harness_only_calls, "fig, axes = harness.figure(1, 1)\n"),
    "prose that names a benchmark": (sibling_imports, '"""The load comes\nfrom serve_load\'s '
                                     'raw client;\nimport serve_load results."""\n'),
}


@pytest.mark.parametrize("check, source", VIOLATIONS.values(), ids=VIOLATIONS)
def test_a_violation_is_caught_and_names_its_file(check, source):
    problems = check("some_bench", ast.parse(source))
    assert problems and all("bench/some_bench.py" in p for p in problems), problems


@pytest.mark.parametrize("check, source", ALLOWED.values(), ids=ALLOWED)
def test_what_is_allowed_passes(check, source):
    assert check("some_bench", ast.parse(source)) == []


def test_random_gguf_may_have_its_own_parser_but_nobody_else():
    source = ast.parse("parser = argparse.ArgumentParser()\n")
    assert harness_only_calls("random_gguf", source) == []
    assert harness_only_calls("serve_load", source)
