"""The models on this machine, as every front end sees them: the one listing, what a model's
header says it can do, its digest, whether it was pulled, and deleting one.

The front ends (api/, tui/, the CLI) ask here and in `service` / `pool` — never the store's
modules themselves (tests/test_layers.py); the rules live in model_store/sources.py and
pulled.py, this module only puts them in the words the front ends use.
"""

from __future__ import annotations

from pathlib import Path

from localinfer.chat_formats.detect import detect
from localinfer.errors import LocalinferError
from localinfer.model_store import pulled
from localinfer.model_store.gguf_info import GGUFInfo, has_fim_tokens, read_gguf_info
from localinfer.model_store.pulled import Manifest
from localinfer.model_store.sources import (Installed, delete_model, digest, installed_models,
                                            is_embedded, packaged_header)

__all__ = ["GGUFInfo", "Installed", "Manifest", "capabilities", "delete_model", "digest",
           "header", "installed_models", "is_embedded", "is_pulled", "listed_header"]


def header(path: Path) -> GGUFInfo | None:
    """A file's header, or None where it cannot be read (a damaged file is still listed,
    without details)."""
    try:
        return read_gguf_info(path)
    except LocalinferError:
        return None


def listed_header(name: str, models_dir: Path) -> GGUFInfo | None:
    """An embedded model not unpacked yet: its package's header (size and sha256 as the file
    will have them), so it lists the same before its first use and after; None where a
    package misses a part."""
    try:
        return packaged_header(name, models_dir)
    except (LocalinferError, OSError):
        return None


def is_pulled(models_dir: Path, name: str) -> bool:
    """A model from the hub (not one that ships with localinfer): deleting it removes a file."""
    return not is_embedded(name) and pulled.find(models_dir, name) is not None


def capabilities(info: GGUFInfo) -> list[str]:
    """What a model can do here, in Ollama's words: an embedding model embeds; a reranker
    reranks (our word: Ollama has no reranking); any other completes, takes tools where its
    own chat template writes them (a template that knows no tools gets them only through a
    generic instruction), thinks where its template marks reasoning, and fills in the middle
    where its vocabulary has FIM tokens (insert). Vision is the model's projector's, not its
    file's: /api/show adds it."""
    if info.rerank:
        return ["rerank"]
    if info.embedding:
        return ["embedding"]
    found = ["completion"]
    fmt = detect(info.chat_template)
    if fmt.template_tools:
        found.append("tools")
    if fmt.think:
        found.append("thinking")
    if has_fim_tokens(info.path):
        found.append("insert")
    return found
