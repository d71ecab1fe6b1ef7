"""Images as clients send them (base64, data URLs), their size bounded before they are
decoded (each is then decoded and bounded as any picture: localinfer/images.py).

URLs are not fetched: a server that fetches what a request names can be made to reach
anything it can (SSRF), so images come in the request itself.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from collections.abc import Sequence

from localinfer.api.errors import ApiError
from localinfer.backends.vision import Image
from localinfer.images import MAX_BYTES, MAX_IMAGES, decode

__all__ = ["decode_all", "from_base64", "from_url"]

_DATA_URL = re.compile(r"data:image/[\w.+-]+;base64,", re.IGNORECASE)


def from_base64(text: str) -> bytes:
    """An image file from its base64 text (Ollama's `images`), bounded before decoding."""
    if len(text) > MAX_BYTES * 4 // 3 + 4:
        raise ApiError(400, f"an image is over {MAX_BYTES >> 20} MB — send a smaller one")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "an image is not valid base64") from None


def from_url(url: str) -> bytes:
    """An image file from an OpenAI `image_url`: a data URL; other URLs are not fetched."""
    found = _DATA_URL.match(url)
    if found is None:
        if url.startswith(("http://", "https://")):
            raise ApiError(400, "image URLs are not fetched (a server that fetches URLs can be "
                                "made to reach anything it can) — send the image as a data "
                                "URL: data:image/png;base64,…")
        raise ApiError(400, "an image_url must be a data URL: data:image/png;base64,…")
    return from_base64(url[found.end():])


async def decode_all(files: Sequence[bytes]) -> list[Image]:
    """Decoded pictures, off the event loop (a large JPEG takes a tenth of a second)."""
    if len(files) > MAX_IMAGES:
        raise ApiError(400, f"{len(files)} images are more than {MAX_IMAGES} in one request")
    if not files:
        return []
    loop = asyncio.get_running_loop()
    return list(await asyncio.gather(*(loop.run_in_executor(None, decode, f) for f in files)))
