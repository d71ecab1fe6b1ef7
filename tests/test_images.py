"""Picture files as every front end reads them (app/images.py): bounded before they
are decoded, scaled, and upright."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from localinfer.errors import InvalidRequest
from localinfer.images import MAX_SIDE, decode, read


def _file(image: Image.Image, kind: str, **save) -> bytes:
    out = io.BytesIO()
    image.save(out, kind, **save)
    return out.getvalue()


def test_a_photo_stored_sideways_is_read_upright():
    """A phone's JPEG: pixels 60 wide and 40 high, and an EXIF orientation of 6 (turn it a
    quarter clockwise to show it) — the model gets it 40 wide and 60 high."""
    sideways = Image.new("RGB", (60, 40), (200, 30, 30))
    sideways.paste((30, 30, 200), (0, 0, 60, 10))  # a blue band along the top
    exif = Image.Exif()
    exif[0x0112] = 6
    upright = decode(_file(sideways, "JPEG", exif=exif, quality=95))
    assert (upright.width, upright.height) == (40, 60)
    # the band is now down the right side: the last column blue, the first red
    right = upright.rgb[(30 * 40 + 39) * 3:(30 * 40 + 40) * 3]
    left = upright.rgb[(30 * 40) * 3:(30 * 40 + 1) * 3]
    assert right[2] > 150 > right[0] and left[0] > 150 > left[2]
    plain = decode(_file(sideways, "JPEG", quality=95))  # no tag: as stored
    assert (plain.width, plain.height) == (60, 40)


def test_a_large_picture_is_scaled_and_a_bad_one_is_one_line(tmp_path):
    big = decode(_file(Image.new("RGB", (4000, 1000)), "PNG"))
    assert (big.width, big.height) == (MAX_SIDE, MAX_SIDE // 4)
    with pytest.raises(InvalidRequest, match="million"):
        decode(_file(Image.new("1", (9000, 6000)), "PNG"))
    with pytest.raises(InvalidRequest, match="not a picture"):
        decode(b"GIF89a but not really")
    (tmp_path / "notes.png").write_text("hello")
    with pytest.raises(InvalidRequest, match="notes.png: an image is not a picture"):
        read(tmp_path / "notes.png")
    with pytest.raises(InvalidRequest, match="no file at"):
        read(tmp_path / "gone.png")


def _header_only_png(width: int, height: int) -> bytes:
    """A PNG's header claiming this size, with no pixels: what a bomb looks like when
    opened."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b""))
            + chunk(b"IEND", b""))


def test_a_huge_picture_is_called_too_large_and_prints_no_warning():
    """Pillow refuses 179 million pixels itself at open, which read as "not a picture", and
    warned on the terminal from 89 million, before our own bound said the real reason."""
    import warnings

    with pytest.raises(InvalidRequest, match="more than 50 million pixels — use a smaller one"):
        decode(_header_only_png(20_000, 20_000))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(InvalidRequest, match="10000×10000 pixels is more than 50 million"):
            decode(_header_only_png(10_000, 10_000))
    assert not [w for w in caught if "decompression bomb" in str(w.message)]
