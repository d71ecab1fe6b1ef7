"""What the Linux packaging works out for itself, without the 14-minute build."""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _build_linux():
    spec = importlib.util.spec_from_file_location("build_linux",
                                                  ROOT / "packaging" / "build_linux.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_debs_glibc_floor_is_what_the_bundles_files_ask_for(tmp_path):
    glibc_needed = _build_linux().glibc_needed
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libx.so").write_bytes(b"\x7fELF\x02\x01" + b"\x00GLIBC_2.2.5\x00"
                                               b"GLIBC_2.34\x00GLIBC_2.17\x00")
    (tmp_path / "notes.txt").write_bytes(b"GLIBC_2.99\x00")  # not an ELF file: not asked for
    assert glibc_needed(tmp_path) == "2.34"
    (tmp_path / "lib" / "libx.so").write_bytes(b"\x7fELF\x02\x01")
    assert glibc_needed(tmp_path) == "2.17"  # none named: the least any binary asks


@pytest.mark.skipif(sys.platform != "linux", reason="ELF files")
def test_no_installed_library_asks_for_more_glibc_than_this_machine_has():
    llama_libs = Path(importlib.util.find_spec("llama_cpp").submodule_search_locations[0]) / "lib"
    needed = _build_linux().glibc_needed(llama_libs)
    have = platform.libc_ver()[1]
    assert tuple(map(int, needed.split("."))) <= tuple(map(int, have.split(".")[:2]))
