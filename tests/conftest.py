"""Shared fixtures: real models, loaded once per session; a private data dir per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from localinfer.backends.base import LoadOptions
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.model_store.sources import resolve


@pytest.fixture(autouse=True)
def _private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test touches the real user directory."""
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALINFER_HOME", str(home))
    monkeypatch.delenv("LOCALINFER_DEBUG", raising=False)
    return home


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
