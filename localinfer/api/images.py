"""Images as clients send them (base64, data URLs), decoded and bounded before a runner sees
them: what any one image may cost is capped before it is paid.

Pillow reads the file's header first: a format it does not know, or more pixels than
MAX_PIXELS (a decompression bomb), is refused before anything is decoded. A picture is then
decoded to RGB and scaled down to MAX_SIDE on its longer side (projectors resize to a few
hundred pixels anyway: Gemma 3 to 896), so at most 12 MB of pixels cross to the runner.
URLs are not fetched: a server that fetches what a request names can be made to reach
anything it can (SSRF), so images come in the request itself.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import re
from collections.abc import Sequence

from localinfer.api.errors import ApiError
from localinfer.backends.vision import Image

__all__ = ["MAX_IMAGES", "decode_all", "from_base64", "from_url"]

MAX_BYTES = 20 << 20  # one image's file
MAX_PIXELS = 50_000_000  # in its header, before it is decoded
MAX_SIDE = 2048  # decoded pictures are scaled down to this on their longer side
MAX_IMAGES = 16  # in one request

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


def _decode(data: bytes) -> Image:
    from PIL import Image as Pil, UnidentifiedImageError

    try:
        with Pil.open(io.BytesIO(data)) as picture:  # reads the header only
            width, height = picture.size
            if width * height > MAX_PIXELS:
                raise ApiError(400, f"an image of {width}×{height} pixels is more than "
                                    f"{MAX_PIXELS // 1_000_000} million — send a smaller one")
            picture.draft("RGB", (MAX_SIDE, MAX_SIDE))  # a JPEG decodes at a lower scale
            picture = picture.convert("RGB")
            if max(picture.size) > MAX_SIDE:
                picture.thumbnail((MAX_SIDE, MAX_SIDE))
            return Image(picture.tobytes(), *picture.size)
    except ApiError:
        raise
    except (UnidentifiedImageError, Pil.DecompressionBombError):
        raise ApiError(400, "an image is not a picture this server reads (PNG, JPEG, WebP, "
                            "GIF, BMP)") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise ApiError(400, f"an image could not be read: {exc}") from None


async def decode_all(files: Sequence[bytes]) -> list[Image]:
    """Decoded pictures, off the event loop (a large JPEG takes a tenth of a second)."""
    if len(files) > MAX_IMAGES:
        raise ApiError(400, f"{len(files)} images are more than {MAX_IMAGES} in one request")
    if not files:
        return []
    loop = asyncio.get_running_loop()
    return list(await asyncio.gather(*(loop.run_in_executor(None, _decode, f) for f in files)))
