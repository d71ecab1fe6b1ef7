"""The Hugging Face hub as a model source: list a repo's GGUF quants, read a remote file's
header with HTTP range requests, and download one file — resumable, locked, verified.

Addresses and tokens come from huggingface_hub, so HF_ENDPOINT, HF_HUB_OFFLINE and HF_TOKEN
work as users of the hub expect; every request goes through one client (`hub_http`: proxies
from the environment, connections reused, retries), the listing and the file too — the file
fetched here to resume it across runs (see `download`).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import quote

import httpx
from huggingface_hub import constants, hf_hub_url

from localinfer.errors import (
    DiskFull,
    HubError,
    InvalidModelFile,
    LocalinferError,
    ModelNotFound,
)
from localinfer.model_store import hub_http
from localinfer.model_store.gguf_info import (GGUFInfo, ProjectorInfo, read_gguf_header,
                                              read_gguf_part, read_projector_header)
from localinfer.model_store.planner import QUALITY

__all__ = ["HubError", "RemoteFile", "download", "list_ggufs", "list_repo", "file_sha256",
           "pick_file", "pick_projector", "quant_of", "remote_info", "remote_projector"]

_QUANT_IN_NAME = re.compile(r"[-_.]((?:I?Q\d(?:_[A-Z0-9]+)*)|F16|BF16|F32)\.gguf$", re.IGNORECASE)
_SPLIT = re.compile(r"-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class RemoteFile:
    """A model on the hub: one GGUF file, or (`parts`) a model split in files —
    NAME-00001-of-0000N.gguf and the rest, the hub capping a file at 50 GB — named by its
    first part, its size the whole set's."""

    path: str
    size: int
    sha256: str | None
    quant: str | None
    parts: tuple[RemoteFile, ...] = ()

    @property
    def files(self) -> tuple[RemoteFile, ...]:
        """What to download: the one file, or every part in order."""
        return self.parts or (self,)


def _hub_call(repo: str, action):
    """Ask the hub (`action`, through hub_http's client); what fails becomes one line that
    says what to do."""
    if constants.HF_HUB_OFFLINE:
        raise HubError(f"'{repo}' is not installed and HF_HUB_OFFLINE is set — pull it while "
                       f"online, or pick an installed model (localinfer list)")
    try:
        return action()
    except LocalinferError:  # ours, raised inside the action (a cancelled download's)
        raise
    except httpx.HTTPStatusError as exc:
        raise _refusal(repo, exc.response) from None
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError) as exc:
        raise HubError(hub_http.unreachable(exc)) from None
    except (httpx.HTTPError, ValueError) as exc:  # cut off, timed out, or not what it should be
        raise HubError(f"the hub failed for '{repo}': {exc}".splitlines()[0]) from None


def _refusal(repo: str, response: httpx.Response) -> LocalinferError:
    """What the hub's answer means, by its error code (X-Error-Code) or its status."""
    code, status = response.headers.get("X-Error-Code"), response.status_code
    if code == "GatedRepo" or status == 403:
        return HubError(f"'{repo}' is gated — accept its terms on the hub and set HF_TOKEN")
    if code in ("RepoNotFound", "RevisionNotFound") or status in (401, 404):
        # the hub answers 401 for a repo that is missing, private, or gated to a stranger
        return ModelNotFound(repo)
    if status == 429:
        return HubError(f"the hub is limiting requests (429) — wait a minute and pull '{repo}' "
                        "again, or set HF_TOKEN (a signed-in user may ask more)")
    return HubError(f"the hub failed for '{repo}': {status} {response.reason_phrase}")


def _get(url: str, params: dict[str, str] | None = None,
         headers: dict[str, str] | None = None) -> httpx.Response:
    response = hub_http.get(url, {**hub_http.headers(), **(headers or {})}, params)
    response.raise_for_status()
    return response


def _tree(repo: str, revision: str) -> list[dict]:
    """Every file of the repo, page after page (the hub's Link header names the next)."""
    url = (f"{constants.ENDPOINT.rstrip('/')}/api/models/{repo}/tree/"
           f"{quote(revision, safe='')}")
    response = _get(url, {"recursive": "true"})
    entries = list(response.json())
    while next_page := response.links.get("next", {}).get("url"):
        response = _get(next_page)
        entries += response.json()
    return entries


def quant_of(filename: str) -> str | None:
    match = _QUANT_IN_NAME.search(filename)
    return match.group(1).upper() if match else None


def list_ggufs(repo: str, revision: str = "main") -> list[RemoteFile]:
    """The repo's GGUF models, largest first: single files, and split models whose every
    part is there (one entry each, named by the first part)."""
    return list_repo(repo, revision)[0]


def list_repo(repo: str, revision: str = "main") -> tuple[list[RemoteFile], list[RemoteFile]]:
    """The repo's GGUF models (as `list_ggufs`) and its vision projectors (`mmproj` files),
    from one listing."""
    entries = _hub_call(repo, lambda: _tree(repo, revision))
    files, sets, projectors = [], {}, []
    for entry in entries:
        path = entry.get("path", "") if entry.get("type") == "file" else ""
        if not path.lower().endswith(".gguf"):
            continue
        lfs = entry.get("lfs") or {}
        split = _SPLIT.search(path)
        file = RemoteFile(path, int(entry.get("size") or 0), lfs.get("oid"),
                          quant_of(_SPLIT.sub(".gguf", path) if split else path))
        if "mmproj" in path.lower():
            if not split:
                projectors.append(file)
        elif split:
            number, count = int(split["no"]), int(split["count"])
            sets.setdefault((path[:split.start()], count), {})[number] = file
        else:
            files.append(file)
    for (_, count), parts in sets.items():
        if sorted(parts) != list(range(1, count + 1)):
            continue  # a part missing: not a model llama.cpp can load
        ordered = tuple(parts[n] for n in sorted(parts))
        first = ordered[0]
        files.append(RemoteFile(first.path, sum(p.size for p in ordered), first.sha256,
                                first.quant, ordered))
    return sorted(files, key=lambda f: -f.size), projectors


# a projector's type, best first: f16 is what the converters write and every backend runs;
# a quantized projector costs its answers more than a quantized model's weights do
_PROJECTOR_TYPES = ("F16", "BF16", "Q8_0", "F32")


def pick_projector(projectors: Sequence[RemoteFile], model: RemoteFile) -> RemoteFile | None:
    """The projector a model goes with: one in the model's own folder if there is one, else
    the repo's; f16 before the other types, and the smallest of those left."""
    folder = PurePosixPath(model.path).parent
    near = [p for p in projectors if PurePosixPath(p.path).parent == folder] or list(projectors)
    if not near:
        return None
    return min(near, key=lambda p: (_PROJECTOR_TYPES.index(p.quant)
                                    if p.quant in _PROJECTOR_TYPES else 99, p.size, p.path))


def pick_file(repo: str, files: Sequence[RemoteFile], quant: str) -> RemoteFile:
    matches = [f for f in files if f.quant == quant.upper()]
    if not matches:
        offered = ", ".join(sorted({f.quant or f.path for f in files},
                                   key=lambda q: QUALITY.index(q) if q in QUALITY else 99))
        raise HubError(f"'{repo}' has no {quant} file — it offers {offered}")
    return min(matches, key=lambda f: len(f.path))  # the plain one over variants


def remote_projector(repo: str, file: RemoteFile, revision: str = "main") -> ProjectorInfo:
    """A projector's header on the hub, read with a range request (no download)."""
    return remote_info(repo, file, revision, 1 << 20, 16 << 20, read_projector_header)


def remote_info(repo: str, file: RemoteFile, revision: str = "main",
                first_chunk: int = 4 * 1024 * 1024, limit: int = 64 * 1024 * 1024,
                read=read_gguf_header) -> GGUFInfo:
    """The GGUF header of a file on the hub, read with range requests (no download). Of a
    split model: the first part's, with the size and weights of the whole set (each other
    part's tensor table read too: no part's header is large)."""
    if file.parts:
        info = remote_info(repo, file.parts[0], revision, first_chunk,
                           limit)
        n_params, separate = info.n_params, info.separate_output
        for part in file.parts[1:]:
            other = remote_info(repo, part, revision, min(first_chunk, 256 * 1024), limit)
            n_params, separate = n_params + other.n_params, separate or other.separate_output
        return dataclasses.replace(info, file_size=file.size, n_params=n_params,
                                   separate_output=separate)
    url = hf_hub_url(repo, file.path, revision=revision)
    end = first_chunk
    while True:
        data = _hub_call(repo, lambda: _get(url, headers={"Range": f"bytes=0-{end - 1}"}).content)
        try:
            return read(data, Path(file.path), file.size)
        except InvalidModelFile as exc:
            if "cut short" not in str(exc) or end >= min(limit, file.size or limit):
                raise
            end *= 4  # the vocabulary did not fit: ask for more


Progress = Callable[[int, "int | None"], None]  # (bytes so far, total bytes or None)

_CHUNK = 1024 * 1024
_ATTEMPTS = 5  # a connection that drops mid-file is picked up again this many times


def download(repo: str, file: RemoteFile, dest: Path, revision: str = "main",
             progress: Progress | None = None) -> Path:
    """Download into `dest` (a file path) through a staging folder; verify the sha256 first.

    The bytes go to `<staging>/<name>.<sha256>.partial`, a name that stays the same from one
    run to the next: a pull that was killed, cancelled or cut off goes on from where it
    stopped (an HTTP range request), in this process or a later one. (huggingface_hub 2
    downloads to a name unique to each process, so a later pull started over and the killed
    one's file stayed for good.) The caller holds the file's lock (store.pull). The file
    appears at `dest` only after its hash matched the hub's and it read as GGUF.
    """
    staging = dest.parent / ".staging"
    staging.mkdir(parents=True, exist_ok=True)
    partial = staging / f"{Path(file.path).name}.{(file.sha256 or 'unverified')[:16]}.partial"
    have = partial.stat().st_size if partial.exists() else 0
    free = shutil.disk_usage(staging).free
    if file.size and free < file.size - have:
        raise DiskFull(f"{file.path} needs {(file.size - have) / 2**30:.1f} GiB more but the "
                       f"disk has {free / 2**30:.1f} GiB free — free some space, or set "
                       "LOCALINFER_HOME to a folder on a bigger disk")
    _hub_call(repo, lambda: _fetch(hf_hub_url(repo, file.path, revision=revision), partial,
                                   file.size or None, progress))
    if file.sha256:
        digest = file_sha256(partial)
        if digest != file.sha256:
            partial.unlink(missing_ok=True)
            raise HubError(f"{file.path} failed its checksum (got {digest[:12]}…, the hub says "
                           f"{file.sha256[:12]}…) — it was deleted; pull again")
    try:  # what the hub holds may be anything: only a file that reads as GGUF is installed
        read_gguf_part(partial)
    except InvalidModelFile as exc:
        partial.unlink(missing_ok=True)
        raise HubError(f"{file.path} from '{repo}' is not a usable GGUF file: {exc.reason} — "
                       "nothing was installed") from None
    partial.replace(dest)
    _forget_leftovers(staging, Path(file.path).name)
    return dest


def _fetch(url: str, partial: Path, size: int | None, progress: Progress | None) -> None:
    """Append the rest of the file at `url` to `partial`, resuming from its length."""
    # identity: the bytes as stored, so a resumed range lines up with what is on disk
    headers = {**hub_http.headers(), "Accept-Encoding": "identity"}
    failures = 0
    while True:
        have = partial.stat().st_size if partial.exists() else 0
        if size is not None and have >= size:
            if have == size:
                return
            partial.unlink()  # longer than the file the hub has now: start over
            continue
        ask = {**headers, "Range": f"bytes={have}-"} if have else headers
        try:
            if _fetch_once(url, ask, partial, have, size, progress):
                return
            failures = 0  # it got further: a later drop may be picked up as often again
        except (httpx.TransportError, httpx.HTTPStatusError) as exc:
            answer = exc.response if isinstance(exc, httpx.HTTPStatusError) else None
            if answer is not None and answer.status_code not in hub_http.RETRY_STATUS:
                raise
            failures += 1  # a dropped connection, or the hub's CDN busy (5xx) or strict (429)
            if failures >= _ATTEMPTS:
                raise
            time.sleep((answer is not None and hub_http.retry_after(answer))
                       or min(2 ** (failures - 1), 8))
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise DiskFull(f"the disk filled while {partial.name} was downloaded — free "
                               "some space and pull again: it goes on where it stopped") from None
            raise


def _fetch_once(url: str, headers: dict[str, str], partial: Path, have: int, size: int | None,
                progress: Progress | None) -> bool:
    """One GET: True when the file is whole (as far as can be told without its size)."""
    # (httpx drops the Authorization header when the hub redirects to its CDN)
    with hub_http.client().stream("GET", url, headers=headers) as response:
        if response.status_code == 416 and have and size is None:
            return True  # nothing after what we have: it was whole
        _raise_for_status(response)
        start = _range_start(response) if response.status_code == 206 else 0
        if start not in (0, have):
            raise HubError(f"the hub answered a request for bytes {have}- with bytes {start}-")
        with partial.open("ab" if start else "wb") as out:
            done = start
            total = size or (int(response.headers.get("Content-Length", 0)) + start or None)
            if progress:
                progress(done, total)
            for chunk in response.iter_raw(_CHUNK):
                out.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
    return size is None or partial.stat().st_size >= size


def _range_start(response: httpx.Response) -> int:
    match = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    if not match:
        raise HubError("the hub answered a range request without a Content-Range")
    return int(match.group(1))


def _raise_for_status(response: httpx.Response) -> None:
    if response.status_code in (401, 403):
        raise HubError(f"the hub refused the download ({response.status_code}): the repo may be "
                       "gated or private — accept its terms on the hub and set HF_TOKEN")
    if response.status_code == 404:
        raise HubError("the hub no longer has this file (404) — pull again to see what it offers")
    if response.status_code >= 400:
        response.read()  # the connection goes back to the pool for the next try
    response.raise_for_status()


def _forget_leftovers(staging: Path, name: str) -> None:
    """Partial files of an older version of this file, and what huggingface_hub left in
    the staging folder before downloads were our own."""
    for stale in staging.glob(f"{name}.*.partial"):
        stale.unlink(missing_ok=True)
    shutil.rmtree(staging / ".cache", ignore_errors=True)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 * 1024 * 1024):
            h.update(chunk)
    return h.hexdigest()

