"""Picture files as users give them — a path at the terminal, bytes from a client — decoded
and bounded before a runner sees them: what any one image may cost is capped before it is
paid. The server's dialects (api/images.py), `run --image`, the REPL's `/image` and the chat
app all come through here.

Pillow reads the file's header first: a format it does not know, or more pixels than
MAX_PIXELS (a decompression bomb), is refused before anything is decoded. A picture is then
decoded to RGB and scaled down to MAX_SIDE on its longer side (projectors resize to a few
hundred pixels anyway: Gemma 3 to 896), so at most 12 MB of pixels cross to the runner.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path

from localinfer.backends.base import Image
from localinfer.errors import InvalidRequest

__all__ = ["MAX_BYTES", "MAX_IMAGES", "decode", "read"]

MAX_BYTES = 20 << 20  # one image's file
MAX_PIXELS = 50_000_000  # in its header, before it is decoded
MAX_SIDE = 2048  # decoded pictures are scaled down to this on their longer side
MAX_IMAGES = 16  # in one request


def decode(data: bytes) -> Image:
    """A picture file's pixels, bounded; InvalidRequest with one line when it is none."""
    from PIL import Image as Pil, ImageOps, UnidentifiedImageError

    # Pillow's own bomb check warns from 89 million pixels and refuses from 179 million, at
    # open: ours (MAX_PIXELS, below) is lower, so its warning is noise on a user's terminal
    warnings.filterwarnings("ignore", category=Pil.DecompressionBombWarning)
    if len(data) > MAX_BYTES:
        raise InvalidRequest(f"an image is over {MAX_BYTES >> 20} MB — use a smaller one")
    try:
        with Pil.open(io.BytesIO(data)) as picture:  # reads the header only
            width, height = picture.size
            if width * height > MAX_PIXELS:
                raise InvalidRequest(f"an image of {width}×{height} pixels is more than "
                                     f"{MAX_PIXELS // 1_000_000} million — use a smaller one")
            picture.draft("RGB", (MAX_SIDE, MAX_SIDE))  # a JPEG decodes at a lower scale
            # upright as it is shown: a phone stores its photos sideways, with an EXIF tag
            # that says how to turn them
            picture = ImageOps.exif_transpose(picture).convert("RGB")
            if max(picture.size) > MAX_SIDE:
                picture.thumbnail((MAX_SIDE, MAX_SIDE))
            return Image(picture.tobytes(), *picture.size)
    except InvalidRequest:
        raise
    except Pil.DecompressionBombError:  # (a 20,000×20,000 PNG was "not a picture")
        raise InvalidRequest(f"an image is more than {MAX_PIXELS // 1_000_000} million pixels "
                             f"— use a smaller one") from None
    except UnidentifiedImageError:
        raise InvalidRequest("an image is not a picture localinfer reads (PNG, JPEG, WebP, "
                             "GIF, BMP)") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise InvalidRequest(f"an image could not be read: {exc}") from None


def read(path: str | os.PathLike[str]) -> Image:
    """A picture file on this machine, decoded: its size is checked before it is read."""
    path = Path(path).expanduser()
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise InvalidRequest(f"{path} is not a file — give the path of a picture")
        if size > MAX_BYTES:
            raise InvalidRequest(f"{path} is over {MAX_BYTES >> 20} MB — use a smaller picture")
        data = path.read_bytes()
    except FileNotFoundError:
        raise InvalidRequest(f"no file at {path} — give the path of a picture") from None
    except OSError as exc:
        raise InvalidRequest(f"{path} could not be read: {exc.strerror or exc}") from None
    try:
        return decode(data)
    except InvalidRequest as exc:
        raise InvalidRequest(f"{path.name}: {exc}") from None
