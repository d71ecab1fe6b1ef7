"""Images as clients send them (base64, data URLs, and URLs where the server is told to
fetch them), their size bounded before they are decoded (each is then decoded and bounded as
any picture: app/images.py).

URLs are not fetched unless the `image_urls` setting says so: a server that fetches what a
request names can be made to reach anything it can (SSRF) — its own loopback, the LAN, a
cloud's metadata service. "public" fetches only from hosts whose every address is public
(checked as the name is resolved, and again at each redirect); "any" from anywhere.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpx

from localinfer.api.errors import ApiError
from localinfer.backends.base import Image
from localinfer.images import MAX_BYTES, MAX_IMAGES, decode
from localinfer.settings import ImageUrls

__all__ = ["Remote", "decode_all", "from_base64", "from_url"]

_DATA_URL = re.compile(r"data:image/[\w.+-]+;base64,", re.IGNORECASE)
FETCH_SECONDS = 15.0  # one image URL, redirects included
_REDIRECTS = 3


@dataclass(frozen=True)
class Remote:
    """An image a request names by its URL: fetched as the request starts, if allowed."""

    url: str


def from_base64(text: str) -> bytes:
    """An image file from its base64 text (Ollama's `images`), bounded before decoding."""
    if len(text) > MAX_BYTES * 4 // 3 + 4:
        raise ApiError(400, f"an image is over {MAX_BYTES >> 20} MB — send a smaller one")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "an image is not valid base64") from None


def from_url(url: str) -> bytes | Remote:
    """An image file from an OpenAI `image_url`: a data URL's bytes, or an http(s) URL to be
    fetched (decode_all: only where the image_urls setting allows it)."""
    found = _DATA_URL.match(url)
    if found is not None:
        return from_base64(url[found.end():])
    if url.startswith(("http://", "https://")) and len(url) <= 8192:
        return Remote(url)
    raise ApiError(400, "an image_url must be a data URL (data:image/png;base64,…) or an "
                        "http(s) URL")


async def _fetch(url: str, policy: ImageUrls) -> bytes:
    """An image URL's bytes, within FETCH_SECONDS and MAX_BYTES; each hop's host checked."""
    if policy is ImageUrls.OFF:
        raise ApiError(400, "image URLs are not fetched (a server that fetches URLs can be "
                            "made to reach anything it can) — send the image as a data URL "
                            "(data:image/png;base64,…), or start the server with --image-urls "
                            "public")
    try:
        async with asyncio.timeout(FETCH_SECONDS), httpx.AsyncClient(
                follow_redirects=False, timeout=FETCH_SECONDS) as client:
            for _ in range(_REDIRECTS + 1):
                if policy is ImageUrls.PUBLIC:
                    await _check_public(url)
                async with client.stream("GET", url) as reply:
                    if reply.is_redirect and "location" in reply.headers:
                        url = urljoin(url, reply.headers["location"])
                        if not url.startswith(("http://", "https://")):
                            raise ApiError(400, "an image URL redirected to a non-http URL")
                        continue
                    if reply.status_code != 200:
                        raise ApiError(400, f"the image URL answered {reply.status_code}")
                    data = bytearray()
                    async for piece in reply.aiter_bytes():
                        data += piece
                        if len(data) > MAX_BYTES:
                            raise ApiError(400, f"an image at a URL is over "
                                                f"{MAX_BYTES >> 20} MB — send a smaller one")
                    return bytes(data)
            raise ApiError(400, f"an image URL redirected more than {_REDIRECTS} times")
    except TimeoutError:
        raise ApiError(400, f"an image URL took more than {FETCH_SECONDS:.0f} s") from None
    except httpx.HTTPError as exc:
        raise ApiError(400, f"an image URL could not be fetched: {exc}") from None


async def _check_public(url: str) -> None:
    """Refuse a host with any address that is not public (loopback, private, link-local —
    169.254.169.254 — and the like)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host, parts.port or (443 if parts.scheme == "https" else 80),
            type=socket.SOCK_STREAM)
    except OSError:
        raise ApiError(400, f"an image URL's host {host!r} does not resolve") from None
    for *_, address in found:
        ip = ipaddress.ip_address(address[0].split("%")[0])
        if not ip.is_global:
            raise ApiError(400, f"an image URL's host {host!r} is at {ip}, not a public "
                                f"address — this server fetches public images only "
                                f"(image_urls: public)")


async def decode_all(files: Sequence[bytes | Remote],
                     policy: ImageUrls = ImageUrls.OFF) -> list[Image]:
    """Decoded pictures, off the event loop (a large JPEG takes a tenth of a second); those
    named by URL fetched first, as `policy` allows."""
    if len(files) > MAX_IMAGES:
        raise ApiError(400, f"{len(files)} images are more than {MAX_IMAGES} in one request")
    if not files:
        return []
    fetched = await asyncio.gather(*(_fetch(f.url, policy) if isinstance(f, Remote)
                                     else asyncio.sleep(0, f) for f in files))
    loop = asyncio.get_running_loop()
    return list(await asyncio.gather(*(loop.run_in_executor(None, decode, f)
                                       for f in fetched)))
