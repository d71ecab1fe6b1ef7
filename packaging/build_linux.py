"""Build localinfer's Linux bundle, tarball and .deb.

    python3 packaging/build_linux.py            # then: python3 packaging/smoke_test.py

1. llama-cpp-python built with GGML_BACKEND_DL and GGML_CPU_ALL_VARIANTS: llama.cpp's
   backends become libraries loaded at run time, one CPU library per instruction-set level,
   so one bundle runs on any x86-64 CPU at its best speed (a CUDA or Vulkan build adds its
   backend library beside them: see packaging/README.md). The wheel is kept in
   build/pkg/wheels and built once (about 20 minutes on 2 cores).
2. A virtual environment with that wheel, `pip install .` and PyInstaller, nothing else.
3. PyInstaller's one-folder bundle (packaging/localinfer.spec) → build/pkg/dist/localinfer.
4. build/pkg/out/localinfer-VERSION-linux-ARCH.tar.gz: the folder, run in place.
5. build/pkg/out/localinfer_VERSION_DEBARCH.deb: the folder in /opt/localinfer, `localinfer`
   on PATH, a desktop entry that opens `localinfer app`, and the icon.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
WORK = ROOT / "build" / "pkg"
DL_CMAKE_ARGS = "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF"
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-wheel", type=Path,
                        help="a llama-cpp-python wheel to bundle instead of building one")
    parser.add_argument("--cmake-args", default="",
                        help='more llama.cpp build flags, e.g. "-DGGML_CUDA=ON" for a bundle '
                             "that also carries the CUDA backend (loaded where a driver is)")
    args = parser.parse_args()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    wheel = args.llama_wheel or llama_wheel(args.cmake_args)
    python = build_venv(wheel)
    bundle = pyinstaller(python)
    out = WORK / "out"
    out.mkdir(parents=True, exist_ok=True)
    for made in (tarball(bundle, version, out), deb(bundle, version, out)):
        print(f"built {made.relative_to(ROOT)} ({made.stat().st_size / 2**20:.0f} MiB)")


def run(*cmd: str | Path, **kw) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def llama_wheel(extra_cmake_args: str = "") -> Path:
    """llama-cpp-python with run-time backends, built once per set of flags (pip's cache
    would hand back a wheel built with other flags, so it is built without it, kept here)."""
    flavour = "-".join(re.findall(r"GGML_(\w+)=ON", extra_cmake_args, re.IGNORECASE)).lower()
    wheels = WORK / ("wheels" + (f"-{flavour}" if flavour else ""))
    found = sorted(wheels.glob("llama_cpp_python-*.whl"))
    if found:
        return found[-1]
    version = next(d.split(">=")[1].strip('"') for d in _dependencies() if d.startswith("llama-cpp"))
    env = {**os.environ, "CMAKE_ARGS": f"{DL_CMAKE_ARGS} {extra_cmake_args}".strip(),
           "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    run(sys.executable, "-m", "pip", "wheel", "--no-cache-dir", "--no-deps", "--no-binary",
        "llama-cpp-python", "-w", wheels, f"llama-cpp-python=={version}", env=env)
    return sorted(wheels.glob("llama_cpp_python-*.whl"))[-1]


def _dependencies() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def build_venv(wheel: Path) -> Path:
    env_dir = WORK / "venv"
    python = env_dir / "bin" / "python"
    if not python.exists():
        venv.create(env_dir, with_pip=True)
    # --force-reinstall of the wheel alone: a wheel with other flags may be there already
    run(python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", wheel)
    run(python, "-m", "pip", "install", "-q", ROOT, "pyinstaller>=6.10")
    return python


def pyinstaller(python: Path) -> Path:
    dist = WORK / "dist"
    run(python, "-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN",
        "--distpath", dist, "--workpath", WORK / "work", PACKAGING / "localinfer.spec")
    return dist / "localinfer"


def tarball(bundle: Path, version: str, out: Path) -> Path:
    target = out / f"localinfer-{version}-linux-{platform.machine()}.tar.gz"
    partial = target.with_suffix(".part")
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(bundle, arcname=f"localinfer-{version}")
    partial.replace(target)  # never a half-written archive under the real name
    return target


def deb(bundle: Path, version: str, out: Path) -> Path:
    stage = WORK / "deb"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(bundle, stage / "opt" / "localinfer", symlinks=True)
    (stage / "usr" / "bin").mkdir(parents=True)
    (stage / "usr" / "bin" / "localinfer").symlink_to("/opt/localinfer/localinfer")
    _install(PACKAGING / "linux" / "localinfer.desktop", stage / "usr/share/applications")
    _install(PACKAGING / "icons" / "localinfer.png", stage / "usr/share/icons/hicolor/256x256/apps")
    _install(PACKAGING / "icons" / "localinfer.svg", stage / "usr/share/icons/hicolor/scalable/apps")
    _install(PACKAGING / "linux" / "copyright", stage / "usr/share/doc/localinfer")
    control = (PACKAGING / "linux" / "control").read_text().format(
        version=version, arch=DEB_ARCH.get(platform.machine(), platform.machine()),
        glibc=glibc_needed(bundle), size_kib=_size(stage) // 1024)
    (stage / "DEBIAN").mkdir()
    (stage / "DEBIAN" / "control").write_text(control)
    target = out / f"localinfer_{version}_{DEB_ARCH.get(platform.machine(), platform.machine())}.deb"
    partial = target.with_suffix(".part")
    run("dpkg-deb", "--root-owner-group", "-Zxz", "--build", stage, partial)
    partial.replace(target)
    return target


def glibc_needed(folder: Path) -> str:
    """The newest glibc symbol version any ELF file in `folder` asks for (GLIBC_2.N in its
    version needs): the .deb's libc6 floor. The build machine's own glibc would overstate it
    (Debian 12's 2.36 shut out Ubuntu 22.04's 2.35 while nothing in the bundle needed 2.36)."""
    newest = (2, 17)  # x86-64 and arm64 binaries ask for at least this much
    for path in folder.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        with path.open("rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
            data = f.read()
        for match in re.finditer(rb"GLIBC_2\.(\d+)(?:\.(\d+))?\x00", data):
            newest = max(newest, (2, int(match[1])))
    return ".".join(map(str, newest))


def _install(source: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, folder / source.name)


def _size(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


if __name__ == "__main__":
    main()
