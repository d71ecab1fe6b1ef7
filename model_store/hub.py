"""The Hugging Face hub as a model source: list a repo's GGUF quants, read a remote file's
header with HTTP range requests, and download one file — resumable, locked, verified.

Everything goes through huggingface_hub, so HF_ENDPOINT, HF_HUB_OFFLINE and HF_TOKEN work
as users of the hub expect.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from huggingface_hub import HfApi, constants, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
)
from huggingface_hub.utils import build_hf_headers
from tqdm.auto import tqdm

from localinfer.errors import (
    DiskFull,
    InvalidModelFile,
    LocalinferError,
    ModelError,
    ModelNotFound,
)
from localinfer.model_store.gguf_info import GGUFInfo, read_gguf_header
from localinfer.model_store.planner import QUALITY

__all__ = ["HubError", "RemoteFile", "download", "list_ggufs", "file_sha256", "pick_file", "quant_of",
           "remote_info"]

_QUANT_IN_NAME = re.compile(r"[-_.]((?:I?Q\d(?:_[A-Z0-9]+)*)|F16|BF16|F32)\.gguf$", re.IGNORECASE)
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


class HubError(ModelError):
    """The hub could not be asked, or said no."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None
    quant: str | None


def _check_reachable() -> None:
    """Fail in seconds, not after the hub client's retries, when the hub cannot be reached."""
    if constants.HF_HUB_OFFLINE:
        return  # the hub client says so itself
    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=5).close()
    except OSError as exc:
        raise HubError(f"cannot reach {constants.ENDPOINT} ({exc.strerror or exc}) — check the "
                       f"network or HF_ENDPOINT; installed models still work") from None


def _hub_call(repo: str, action):
    try:
        _check_reachable()
        return action()
    except OfflineModeIsEnabled:
        raise HubError(f"'{repo}' is not installed and HF_HUB_OFFLINE is set — pull it while "
                       f"online, or pick an installed model (localinfer list)") from None
    except GatedRepoError:
        raise HubError(f"'{repo}' is gated — accept its terms on the hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise ModelNotFound(repo) from None
    except LocalinferError:  # ours, raised inside the action (a cancelled download's)
        raise
    except Exception as exc:  # the hub client's transport errors have no common public base
        if isinstance(exc, HfHubHTTPError) and exc.response is not None \
                and exc.response.status_code == 404:
            raise ModelNotFound(repo) from None
        raise HubError(f"the hub failed for '{repo}': {exc}".splitlines()[0]) from None


def quant_of(filename: str) -> str | None:
    match = _QUANT_IN_NAME.search(filename)
    return match.group(1).upper() if match else None


def list_ggufs(repo: str, revision: str = "main") -> list[RemoteFile]:
    """The repo's single-file GGUFs (split files are not supported yet), largest first."""
    entries = _hub_call(repo, lambda: list(HfApi().list_repo_tree(repo, revision=revision,
                                                                  recursive=True)))
    files = []
    for entry in entries:
        path = getattr(entry, "path", "")
        if not path.lower().endswith(".gguf") or _SPLIT.search(path) or "mmproj" in path.lower():
            continue
        lfs = getattr(entry, "lfs", None)
        files.append(RemoteFile(path, int(getattr(entry, "size", 0) or 0),
                                getattr(lfs, "sha256", None) if lfs else None, quant_of(path)))
    return sorted(files, key=lambda f: -f.size)


def pick_file(repo: str, files: Sequence[RemoteFile], quant: str) -> RemoteFile:
    matches = [f for f in files if f.quant == quant.upper()]
    if not matches:
        offered = ", ".join(sorted({f.quant or f.path for f in files},
                                   key=lambda q: QUALITY.index(q) if q in QUALITY else 99))
        raise HubError(f"'{repo}' has no {quant} file — it offers {offered}")
    return min(matches, key=lambda f: len(f.path))  # the plain one over variants


def remote_info(repo: str, file: RemoteFile, revision: str = "main",
                first_chunk: int = 4 * 1024 * 1024, limit: int = 64 * 1024 * 1024) -> GGUFInfo:
    """The GGUF header of a file on the hub, read with range requests (no download)."""
    url = hf_hub_url(repo, file.path, revision=revision)
    headers = build_hf_headers()
    end = first_chunk
    while True:
        def fetch():
            response = httpx.get(url, headers={**headers, "Range": f"bytes=0-{end - 1}"},
                                 follow_redirects=True, timeout=30)
            response.raise_for_status()
            return response.content
        data = _hub_call(repo, fetch)
        try:
            return read_gguf_header(data, Path(file.path), file.size)
        except InvalidModelFile as exc:
            if "cut short" not in str(exc) or end >= min(limit, file.size or limit):
                raise
            end *= 4  # the vocabulary did not fit: ask for more


Progress = Callable[[int, "int | None"], None]  # (bytes so far, total bytes or None)


def _silent_bar(progress: Progress) -> type[tqdm]:
    """A progress-bar class for huggingface_hub that prints nothing and reports to `progress`."""

    class _Bar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True  # the caller draws its own bar (the TUI)
            super().__init__(*args, **kwargs)
            self.done = kwargs.get("initial") or 0
            progress(self.done, self.total)

        def update(self, n: float | None = 1) -> bool | None:
            self.done += int(n or 0)
            progress(self.done, self.total)
            return None

    return _Bar


def download(repo: str, file: RemoteFile, dest: Path, revision: str = "main",
             progress: Progress | None = None) -> Path:
    """Download into `dest` (a file path) through a staging folder; verify the sha256 first.

    huggingface_hub resumes an interrupted transfer from its `.incomplete` file and locks
    each download; the file appears at `dest` only after its hash matched the hub's.
    With `progress`, the hub's own bar is replaced by calls to it.
    """
    staging = dest.parent / ".staging"
    staging.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(staging).free
    if file.size and free < file.size:
        raise DiskFull(f"{file.path} needs {file.size / 2**30:.1f} GiB but the disk has "
                       f"{free / 2**30:.1f} GiB free — free some space, or set "
                       "LOCALINFER_HOME to a folder on a bigger disk")
    bar = _silent_bar(progress) if progress else None
    got = Path(_hub_call(repo, lambda: hf_hub_download(repo, file.path, revision=revision,
                                                       local_dir=staging, tqdm_class=bar)))
    if file.sha256:
        digest = file_sha256(got)
        if digest != file.sha256:
            got.unlink(missing_ok=True)
            raise HubError(f"{file.path} failed its checksum (got {digest[:12]}…, the hub says "
                           f"{file.sha256[:12]}…) — it was deleted; pull again")
    got.replace(dest)
    return dest


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 * 1024 * 1024):
            h.update(chunk)
    return h.hexdigest()

