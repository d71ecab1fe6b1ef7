"""The service: turns "run this model" into a loaded backend, checking everything first."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import psutil

from localinfer.backends.base import Backend, LoadOptions
from localinfer.model_store.fit import check_context
from localinfer.model_store.gguf_info import GGUFInfo, read_gguf_info
from localinfer.model_store.sources import ResolvedModel, resolve
from localinfer.settings import Settings

__all__ = ["load_model", "prepare"]

BackendFactory = Callable[[Path, LoadOptions, str], Backend]


def _available_memory() -> int:
    return psutil.virtual_memory().available


def _llama_cpp_backend(path: Path, options: LoadOptions, name: str) -> Backend:
    from localinfer.backends.llamacpp import LlamaCppBackend  # loads the native library

    return LlamaCppBackend(path, options, name=name)


def prepare(
    ref: str | None,
    options: LoadOptions,
    settings: Settings | None = None,
    available_memory: Callable[[], int] = _available_memory,
) -> tuple[ResolvedModel, GGUFInfo, LoadOptions]:
    """Resolve, validate the file and check the context fits — all before loading anything."""
    settings = settings or Settings()
    model = resolve(ref or settings.default_model, settings.models_dir)
    info = read_gguf_info(model.path)
    n_ctx = options.n_ctx or min(settings.default_ctx, info.n_ctx_train or settings.default_ctx)
    check_context(info, n_ctx, options.n_slots, available_memory(), options.n_batch, model.name)
    return model, info, dataclasses.replace(options, n_ctx=n_ctx)


def load_model(
    ref: str | None,
    options: LoadOptions,
    settings: Settings | None = None,
    available_memory: Callable[[], int] = _available_memory,
    backend_factory: BackendFactory = _llama_cpp_backend,
) -> Backend:
    model, _info, options = prepare(ref, options, settings, available_memory)
    return backend_factory(model.path, options, model.name)
