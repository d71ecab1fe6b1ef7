"""The source laid out as it installs: a folder whose `localinfer/` holds links to `app/`'s
entries and to `backends/`, `model_store/`, `api/` and `tui/`, as pyproject.toml's
`package-dir` maps them. For tools that read a package from its folders (import graphs,
structure drawings) and for running a second checkout with PYTHONPATH:

    python3 packaging/installed_tree.py /tmp/tree     # then: PYTHONPATH=/tmp/tree ...

The links point into this checkout, so edits show at once; run it again after adding a file
at the top of app/.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """Each mapped package's import name → its folder, from pyproject.toml."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: root / folder for name, folder in config["package-dir"].items()}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package (dotted import name → file), read through the mapping."""
    found = {}
    for package, folder in package_dirs(root).items():
        for path in folder.rglob("*.py"):
            if not path.parent.joinpath("__init__.py").exists():
                continue  # a folder of files that are not modules (web/static)
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def build(dest: Path, root: Path = ROOT) -> Path:
    """Links the installed layout under `dest` (which must not exist or be empty)."""
    dirs = package_dirs(root)
    dest.mkdir(parents=True, exist_ok=True)
    for name in sorted(dirs, key=lambda n: n.count(".")):
        target = dest.joinpath(*name.split("."))
        if name.count(".") == 0:
            target.mkdir()
            for entry in dirs[name].iterdir():
                if entry.name != "__pycache__":
                    (target / entry.name).symlink_to(entry)
        else:
            target.symlink_to(dirs[name])
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: installed_tree.py DEST (a folder that does not exist yet)")
    dest = Path(sys.argv[1])
    if dest.exists() and any(dest.iterdir()):
        sys.exit(f"{dest} is not empty: name a new folder")
    print(build(dest))
