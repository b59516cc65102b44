"""A corpus of hostile and odd images, generated in code (no binary blobs in git).

Each entry: name -> (file bytes, expectation). The expectation is either a substring of the
`ImageError` message the file must be refused with, or a callable that checks the decoded RGB array.
"""
from __future__ import annotations

import io
import struct
import zlib
from typing import Callable

import numpy as np
from PIL import Image

Check = Callable[[np.ndarray], None]


def _encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def decompression_bomb(side: int = 30000) -> bytes:
    """A valid-looking PNG header claiming side x side pixels, a few hundred bytes on disk."""
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # 1-bit greyscale
    rows = zlib.compress(b"\x00" * (1 + side // 8) * 4)  # the first 4 rows; a decoder would inflate ~112 MB
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", rows)
            + _png_chunk(b"IEND", b""))


def _halves(width: int, height: int, left=(255, 0, 0), right=(0, 0, 255)) -> Image.Image:
    array = np.zeros((height, width, 3), np.uint8)
    array[:, : width // 2] = left
    array[:, width // 2:] = right
    return Image.fromarray(array)


def _expect_colour(colour, size=None, tolerance=8) -> Check:
    def check(rgb: np.ndarray) -> None:
        if size is not None:
            assert rgb.shape[:2] == size, rgb.shape
        assert np.abs(rgb.reshape(-1, 3).mean(0) - np.array(colour)).max() <= tolerance, rgb.reshape(-1, 3).mean(0)
    return check


def _exif_rotated() -> bytes:
    """40 wide x 20 high, red left / blue right, tagged orientation 6 (display rotated 90° clockwise)."""
    image = _halves(40, 20)
    exif = Image.Exif()
    exif[0x0112] = 6
    return _encode(image, "JPEG", exif=exif.tobytes(), quality=95)


def _check_rotated(rgb: np.ndarray) -> None:
    assert rgb.shape[:2] == (40, 20), rgb.shape  # height, width swapped by the orientation tag
    top, bottom = rgb[:15].reshape(-1, 3).mean(0), rgb[25:].reshape(-1, 3).mean(0)
    assert top[0] > 200 and top[2] < 60, top  # red is on top after a clockwise turn
    assert bottom[2] > 200 and bottom[0] < 60, bottom


def _animated_gif() -> bytes:
    frames = [Image.new("RGB", (16, 16), c) for c in ((0, 255, 0), (255, 0, 0), (0, 0, 255))]
    return _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)


def _multipage_tiff() -> bytes:
    pages = [Image.new("RGB", (16, 16), c) for c in ((255, 255, 0), (0, 255, 255))]
    return _encode(pages[0], "TIFF", save_all=True, append_images=pages[1:])


def _palette_transparent() -> bytes:
    image = Image.new("P", (8, 8), 0)
    image.putpalette([0, 0, 0] + [200, 10, 10] * 255)
    image.info["transparency"] = 0  # index 0 (black) is transparent
    return _encode(image, "PNG", transparency=0)


def _sixteen_bit() -> bytes:
    array = np.full((8, 8), 32768, np.uint16)  # mid grey on a 16-bit scale
    return _encode(Image.fromarray(array), "PNG")  # uint16 -> mode I;16


def corpus() -> dict[str, tuple[bytes, str | Check]]:
    jpeg = _encode(_halves(64, 64), "JPEG")
    png = _encode(_halves(64, 64), "PNG")
    return {
        "zero_bytes.png": (b"", "empty"),
        "truncated.jpg": (jpeg[: len(jpeg) // 3], "truncated or damaged"),
        "truncated.png": (png[: len(png) // 2], "truncated or damaged"),
        "html_named.jpg": (b"<!doctype html><html><body><script>alert(1)</script></body></html>", "not an image format"),
        "text_named.jpg": (b"just some text\n" * 10, "not an image format"),
        "drawing.svg": (b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>',
                        "not an image format"),
        "bomb.png": (decompression_bomb(), "decompression bomb"),
        "one_pixel.png": (_encode(Image.new("RGB", (1, 1), (10, 200, 30)), "PNG"), _expect_colour((10, 200, 30), (1, 1))),
        "wide_10000x10.png": (_encode(Image.new("RGB", (10000, 10), (90, 90, 90)), "PNG"), _expect_colour((90, 90, 90), (10, 10000))),
        "tall_10x10000.png": (_encode(Image.new("RGB", (10, 10000), (90, 90, 90)), "PNG"), _expect_colour((90, 90, 90), (10000, 10))),
        "sixteen_bit.png": (_sixteen_bit(), _expect_colour((128, 128, 128), (8, 8), tolerance=1)),
        "cmyk.jpg": (_encode(Image.new("CMYK", (16, 16), (0, 255, 255, 0)), "JPEG", quality=95), _expect_colour((255, 0, 0), (16, 16), 12)),
        "rgba_transparent.png": (_encode(Image.new("RGBA", (8, 8), (0, 0, 0, 0)), "PNG"), _expect_colour((255, 255, 255), (8, 8), 0)),
        "rgba_half.png": (_encode(Image.new("RGBA", (8, 8), (0, 0, 0, 128)), "PNG"), _expect_colour((127, 127, 127), (8, 8), 1)),
        "la_transparent.png": (_encode(Image.new("LA", (8, 8), (0, 0)), "PNG"), _expect_colour((255, 255, 255), (8, 8), 0)),
        "palette_transparent.png": (_palette_transparent(), _expect_colour((255, 255, 255), (8, 8), 0)),
        "greyscale.png": (_encode(Image.new("L", (8, 8), 77), "PNG"), _expect_colour((77, 77, 77), (8, 8), 0)),
        "exif_rotated.jpg": (_exif_rotated(), _check_rotated),
        "animated.gif": (_animated_gif(), _expect_colour((0, 255, 0), (16, 16), 2)),
        "multipage.tiff": (_multipage_tiff(), _expect_colour((255, 255, 0), (16, 16), 0)),
        "image.webp": (_encode(Image.new("RGB", (16, 16), (20, 40, 220)), "WEBP", lossless=True), _expect_colour((20, 40, 220), (16, 16), 0)),
    }
