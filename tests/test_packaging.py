"""The layout installs as it imports: the folders at the top (app/, backends/, model_store/,
api/, tui/) mapped onto `localinfer.*` by pyproject.toml's package-dir. Every package is
listed, a built wheel holds every module and the package data and imports from itself, and
the tree laid out as installed (packaging/installed_tree.py) imports the same modules."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tree():
    spec = importlib.util.spec_from_file_location("installed_tree",
                                                  ROOT / "packaging" / "installed_tree.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _packages() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(config["packages"])


def test_every_package_folder_is_listed_for_the_wheel():
    """A sub-folder with an __init__.py that pyproject.toml does not list would be left out
    of the wheel and the bundle, while the editable install still finds it."""
    folders = {name for name, path in _tree().modules().items() if path.name == "__init__.py"}
    assert folders == _packages(), (f"unlisted: {sorted(folders - _packages())}; "
                                    f"listed, no folder: {sorted(_packages() - folders)}")


def test_the_installed_tree_imports_the_same_modules(tmp_path):
    tree = _tree().build(tmp_path / "tree")
    code = ("import localinfer.backends.engine.scheduler as s, localinfer.chat_formats, "
            "localinfer.api.asgi, localinfer.tui.chat_app, localinfer.web; print(s.__file__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(tree / "localinfer/backends/engine/scheduler.py")


@pytest.mark.slow
def test_a_built_wheel_holds_every_module_and_imports_from_itself(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(tmp_path), str(ROOT)], capture_output=True, text=True,
                           timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("localinfer-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {"/".join(name.split(".")) + ("/__init__.py" if path.name == "__init__.py"
                                             else ".py")
                for name, path in _tree().modules().items()}
    assert expected <= names, sorted(expected - names)
    assert {"localinfer/model_store/catalog.json", "localinfer/web/static/index.html"} <= names
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, timeout=300)
    code = ("import localinfer, localinfer.backends.runner.process, localinfer.model_store.catalog"
            " as c; print(localinfer.__file__); print(len(c.catalog_names()) > 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(target / "localinfer" / "__init__.py"), "True"]
