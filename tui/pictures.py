"""Pictures attached in the chat app: read from a path, kept with their message, shown to a
vision model.

A picture is kept as the model is shown it: the file read and bounded by
`localinfer.images.read`, scaled to KEEP_SIDE pixels on its longer side (as the web app
sends them: Gemma 3's tower reads 896, LLaVA's 336 or 672) and written as PNG — or, when
that is over PNG_UP_TO (a photo), as a JPEG of quality JPEG_QUALITY. The pixels the model
gets are always those of the kept file, decoded again: the first turn, every later turn
and a conversation reopened next week send the same picture, whatever became of the file
it came from (moved, edited, deleted).
"""

from __future__ import annotations

import base64
import io
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from localinfer.backends.base import Image
from localinfer.errors import InvalidRequest
from localinfer.images import MAX_IMAGES, decode, read

__all__ = ["KEEP_SIDE", "MAX_IMAGES", "Picture", "attach", "paths"]

KEEP_SIDE = 1024  # pixels on the longer side of a kept picture
PNG_UP_TO = 512 << 10  # a kept PNG over this is kept as a JPEG instead
JPEG_QUALITY = 90


@dataclass(eq=False)
class Picture:
    """One attached picture: the name it had, its kept size, and the kept file."""

    name: str
    width: int
    height: int
    data: bytes = field(repr=False)  # the kept file: PNG or JPEG
    missing: str = ""  # why the kept file cannot be shown to the model any more, if not
    _image: Image | None = field(default=None, repr=False)

    @property
    def available(self) -> bool:
        return not self.missing

    def chip(self) -> str:
        """The picture as the prompt and the message show it."""
        if self.missing:
            return f"🖼 {self.name} — not available"
        return f"🖼 {self.name} {self.width}×{self.height}"

    def image(self) -> Image:
        """The kept file's pixels, decoded once (InvalidRequest: they cannot be)."""
        if self._image is None:
            self._image = decode(self.data)
        return self._image

    def check(self) -> bool:
        """Whether the kept file still reads as a picture; `missing` says why not."""
        if self.missing:
            return False
        try:
            self.image()
        except InvalidRequest as exc:
            self.missing = str(exc)
            return False
        return True

    def data_url(self) -> str:
        """The kept file as an OpenAI `image_url` (a server decodes it to the same pixels)."""
        kind = "png" if self.data.startswith(b"\x89PNG") else "jpeg"
        return f"data:image/{kind};base64,{base64.b64encode(self.data).decode()}"


def attach(path: str | os.PathLike[str]) -> Picture:
    """A picture file read, bounded and kept (InvalidRequest with one line when it cannot
    be). Slow for a large photo (a tenth of a second or more): call it off the UI thread."""
    from PIL import Image as Pil

    path = Path(path).expanduser()
    read_in = read(path)
    picture = Pil.frombytes("RGB", (read_in.width, read_in.height), read_in.rgb)
    if max(picture.size) > KEEP_SIDE:
        picture.thumbnail((KEEP_SIDE, KEEP_SIDE), Pil.Resampling.LANCZOS)
    out = io.BytesIO()
    picture.save(out, "PNG", optimize=False)
    if out.tell() > PNG_UP_TO:
        out = io.BytesIO()
        picture.save(out, "JPEG", quality=JPEG_QUALITY)
    kept = Picture(path.name, *picture.size, out.getvalue())
    kept.image()  # what the model will be shown: the kept file's own pixels
    return kept


def paths(text: str) -> list[str]:
    """The paths typed or dropped into the path prompt: one path as it is (spaces and all)
    where such a file exists, else shell words (a terminal quotes or escapes a dropped
    file's path, and several dropped files come as several words); file:// URLs as paths."""
    text = text.strip()
    if not text:
        return []
    if Path(text).expanduser().exists():
        words = [text]
    else:
        try:
            words = shlex.split(text)
        except ValueError:  # an unbalanced quote: the text as one path
            words = [text.strip("'\"")]
    return [unquote(urlparse(w).path) if w.startswith("file://") else w for w in words]
