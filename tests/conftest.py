"""Shared fixtures: real models, loaded once per session; a private data dir per test."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import llama_cpp
import pytest

from localinfer.backends.base import LoadOptions
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.model_store.sources import resolve

from .greedy import Reference


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that judges greedy replies by a reference decode is a `numerics` test."""
    for item in items:
        if {"smollm2_reference", "gemma3_reference"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.numerics)


def pytest_report_header() -> str:
    """The CPU features llama.cpp was built for and uses: greedy text depends on them."""
    return "llama.cpp: " + llama_cpp.llama_print_system_info().decode().strip()


@pytest.fixture(autouse=True)
def _private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test touches the real user directory."""
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALINFER_HOME", str(home))
    monkeypatch.delenv("LOCALINFER_DEBUG", raising=False)
    return home


@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MiB filesystem (tmpfs): a disk too small for any model."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture(scope="session")
def _session_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="session")
def smollm2_path(_session_store: Path) -> Path:
    return resolve("smollm2:135m", _session_store).path


@pytest.fixture(scope="session")
def gemma3_path(_session_store: Path) -> Path:
    return resolve("gemma3:270m", _session_store).path


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path):
    backend = LlamaCppBackend(smollm2_path, LoadOptions(n_ctx=1024, n_slots=2), name="smollm2:135m")
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def gemma3(gemma3_path: Path):
    backend = LlamaCppBackend(gemma3_path, LoadOptions(n_ctx=1024), name="gemma3:270m")
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_path: Path):
    """What greedy replies of smollm2 must be, up to near-ties (see tests/greedy.py)."""
    reference = Reference(smollm2_path)
    yield reference
    reference.close()


@pytest.fixture(scope="session")
def gemma3_reference(gemma3_path: Path):
    reference = Reference(gemma3_path)
    yield reference
    reference.close()


@pytest.fixture(scope="session")
def quant_files(smollm2_path: Path, tmp_path_factory) -> dict[str, Path]:
    """The real smollm2 file and two requantisations of it, made with llama.cpp's quantizer."""
    folder = tmp_path_factory.mktemp("quants")
    files = {"Q4_1": smollm2_path}
    for label, ftype in (("Q8_0", 7), ("Q4_K_M", 15)):
        out = folder / f"SmolLM2-135M-Instruct-{label}.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = ftype, True, 2
        assert llama_cpp.llama_model_quantize(str(smollm2_path).encode(), str(out).encode(),
                                              ctypes.byref(params)) == 0
        files[label] = out
    return files
