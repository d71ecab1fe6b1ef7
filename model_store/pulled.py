"""Models pulled from the hub, on disk: files under `hub/<owner>/<repo>/`, one manifest each.

A model is installed when its manifest exists, and a manifest is written (atomically) only
after its file is complete and verified, so a half-downloaded file is never installed.
A lock per file makes two pulls of the same file do one download.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock

from localinfer.errors import HubError, ModelNotFound
from localinfer.files import write_atomically
from localinfer.model_store import hub
from localinfer.model_store.catalog import HubRef, parse_hub_ref

__all__ = ["Manifest", "find", "installed", "pull", "remove"]

# (the repo's files, and the projector that would come with them: room is kept for it)
QuantChooser = Callable[[HubRef, Sequence[hub.RemoteFile], "hub.RemoteFile | None"], str]


@dataclass(frozen=True)
class Manifest:
    name: str
    repo: str
    file: str
    quant: str | None
    sha256: str | None
    size: int
    pulled_at: str
    source: str = "hub"
    # a split model: every part's file, the first (`file`) included; empty for one file
    parts: tuple[str, ...] = ()
    # a vision model's projector (an mmproj GGUF beside the model's file), None for text only
    projector: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", tuple(self.parts))  # (a list, as JSON has it)

    def path(self, models_dir: Path) -> Path:
        """The file llama.cpp loads: the model's, or its first part's."""
        return models_dir / "hub" / self.repo / self.file

    def paths(self, models_dir: Path) -> list[Path]:
        """Every file of the model."""
        files = [*(self.parts or (self.file,)), *([self.projector] if self.projector else [])]
        return [models_dir / "hub" / self.repo / f for f in files]

    def projector_path(self, models_dir: Path) -> Path | None:
        return models_dir / "hub" / self.repo / self.projector if self.projector else None


def _manifest_path(models_dir: Path, name: str) -> Path:
    safe = name.replace("/", "__").replace(":", "--")
    return models_dir / "manifests" / f"{safe}.json"


def installed(models_dir: Path) -> list[Manifest]:
    folder = models_dir / "manifests"
    manifests = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            manifests.append(Manifest(**json.loads(path.read_text("utf-8"))))
        except (ValueError, TypeError):
            continue  # a damaged manifest: the model is not installed
    return manifests


def find(models_dir: Path, name: str) -> Manifest | None:
    path = _manifest_path(models_dir, name)
    if not path.is_file():
        return None
    try:
        manifest = Manifest(**json.loads(path.read_text("utf-8")))
    except (ValueError, TypeError):
        return None
    return manifest if all(p.is_file() for p in manifest.paths(models_dir)) else None


def _write(models_dir: Path, manifest: Manifest) -> None:
    target = _manifest_path(models_dir, manifest.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, json.dumps(dataclasses.asdict(manifest), indent=2))


def pull(ref: HubRef, models_dir: Path, choose_quant: QuantChooser,
         progress: hub.Progress | None = None) -> Manifest:
    files, projectors = hub.list_repo(ref.repo)
    if not files:
        raise HubError(f"'{ref.repo}' holds no GGUF model")
    quant = ref.quant or choose_quant(ref, files, hub.pick_projector(
        projectors, min(files, key=lambda f: f.size)))
    remote = hub.pick_file(ref.repo, files, quant)
    projector = hub.pick_projector(projectors, remote)  # a vision model's, pulled with it
    key = hashlib.sha1(f"{ref.repo}/{remote.path}".encode()).hexdigest()[:16]
    (models_dir / ".locks").mkdir(parents=True, exist_ok=True)
    with FileLock(models_dir / ".locks" / f"{key}.lock"):
        # a split model's parts one after another, each verified; the manifest (what makes
        # the model installed) only once every part is in place
        downloads = (*remote.files, *((projector,) if projector else ()))
        total = sum(f.size for f in downloads)
        done_before = 0
        for part in downloads:
            dest = models_dir / "hub" / ref.repo / part.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not (dest.is_file() and part.sha256 and hub.file_sha256(dest) == part.sha256):
                hub.download(ref.repo, part, dest, progress=_overall(progress, done_before,
                                                                       total, downloads))
            done_before += part.size
        manifest = Manifest(
            name=ref.installed_name, repo=ref.repo, file=remote.path, quant=remote.quant,
            sha256=remote.sha256,
            size=sum((models_dir / "hub" / ref.repo / f.path).stat().st_size
                     for f in remote.files),
            pulled_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            parts=tuple(f.path for f in remote.parts),
            projector=projector.path if projector else None,
        )
        _write(models_dir, manifest)
    return manifest


def _overall(progress: hub.Progress | None, before: int, total: int,
             downloads: Sequence[hub.RemoteFile]) -> hub.Progress | None:
    """A file's progress as the whole model's: a split model's parts, its projector (bytes
    of the files before it added)."""
    if progress is None or len(downloads) == 1:
        return progress
    return lambda done, _of: progress(before + done, total or None)


def remove(models_dir: Path, name: str) -> str:
    """Forget the model; delete its file unless another installed name uses it. `name` may
    be spelled as `pull` takes it (`owner/repo:Q8_0` for `hf.co/owner/repo:Q8_0`)."""
    path = _manifest_path(models_dir, name)
    if not path.is_file():
        try:
            ref = parse_hub_ref(name)
        except ModelNotFound:
            ref = None
        if ref is not None:
            name, path = ref.installed_name, _manifest_path(models_dir, ref.installed_name)
    if not path.is_file():
        pulled = [m.name for m in installed(models_dir)]
        raise ModelNotFound(name, known=pulled, hint=(
            f"pulled models: {', '.join(pulled)}" if pulled else
            "no pulled model to remove (the embedded ones ship with localinfer; "
            "`localinfer list` shows every model)"))
    try:
        manifest: Manifest | None = Manifest(**json.loads(path.read_text("utf-8")))
    except (ValueError, TypeError):
        manifest = None  # damaged: removing it is all there is to do
    path.unlink()
    if manifest and not any(m.file == manifest.file and m.repo == manifest.repo
                            for m in installed(models_dir)):
        for file in manifest.paths(models_dir):
            file.unlink(missing_ok=True)
    return name
