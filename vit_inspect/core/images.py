"""Reading images safely and turning them into exactly what a model sees.

`load_image` accepts a path, bytes or a PIL image and returns an RGB PIL image or raises
`ImageError` with a sentence a user can act on. `Preprocess.apply` resizes, crops and normalises as
the model's own data config says, and also returns the RGB crop the model saw, so that maps
upsampled to that crop line up with it pixel for pixel.
"""
from __future__ import annotations

import io
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from vit_inspect.core.errors import ImageError

DEFAULT_MAX_PIXELS = 40_000_000  # larger images are refused before decoding (decompression bombs)
DEFAULT_MAX_BYTES = 30 * 1024 * 1024  # larger uploads are refused before reading
MIN_SIDE = 1  # a 1x1 image is a flat colour: still a valid input
# The only decoders an upload may reach. Pillow knows ~45 formats; some hand the file to an external
# program (EPS and PostScript run Ghostscript), others are rarely used and rarely audited. PSD gives
# its flattened composite image. Names are Pillow's format ids.
ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "PSD")
MAX_INTERMEDIATE_FACTOR = 16  # resize-then-crop only while the resized image is at most this many crops large

_RESAMPLING = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


@dataclass(frozen=True)
class ImageLimits:
    """What an image may be before we try to decode it."""

    max_pixels: int = DEFAULT_MAX_PIXELS  # width * height
    max_bytes: int = DEFAULT_MAX_BYTES  # encoded file size


def load_image(source: str | os.PathLike | bytes | Image.Image, limits: ImageLimits = ImageLimits()) -> Image.Image:
    """An RGB image from a path, encoded bytes or a PIL image.

    Only `ALLOWED_FORMATS` are decoded, in this process (no external program ever runs).
    EXIF orientation is honoured, animated or multi-page files give their first frame, transparent
    pixels are composited onto white, 16-bit and CMYK images are converted. Anything else (not an
    image, truncated, too large, too small) raises `ImageError`.
    """
    fresh = not isinstance(source, Image.Image)  # decoded here: ours to change in place
    if not fresh:
        image = source
    else:
        data = _read_bytes(source, limits)
        if not data:
            raise ImageError("The file is empty (0 bytes); please upload an image.")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
        except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning, OSError,
                ValueError, SyntaxError) as exc:
            raise ImageError(_unreadable(exc)) from None
    width, height = image.size
    if width * height > limits.max_pixels:
        raise ImageError(f"The image is {width}×{height} = {width * height:,} pixels; the limit is "
                         f"{limits.max_pixels:,}. Please upload a smaller image.")
    if min(width, height) < MIN_SIDE:
        raise ImageError(f"The image is {width}×{height} pixels; it has no pixels to analyse.")
    try:
        # A freshly opened file is at its first frame (frame 1 for PSD, whose frames count from 1
        # and whose first one is the flattened image); a given PIL image keeps the frame it is at.
        image.load()
        if fresh:  # turned in place: a full-size copy of a 12-MP photo costs 17-32 ms (BENCHMARKS, item 7)
            ImageOps.exif_transpose(image, in_place=True)
        else:
            image = ImageOps.exif_transpose(image)  # a turned copy: the caller's image stays as it was
        return _to_rgb(image)
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ImageError(_unreadable(exc)) from None


def _read_bytes(source: str | os.PathLike | bytes, limits: ImageLimits) -> bytes:
    if isinstance(source, (bytes, bytearray)):
        data = bytes(source)
    else:
        path = Path(source)
        try:
            if not path.is_file():
                raise ImageError(f"No image file at {str(path)!r}.", public="The image file is no longer available; "
                                                                          "please upload it again.")
            size = path.stat().st_size
            if size > limits.max_bytes:
                raise ImageError(f"The file is {size / 2**20:.1f} MiB; the limit is {limits.max_bytes / 2**20:.0f} MiB.")
            data = path.read_bytes()
        except (OSError, ValueError) as exc:  # unreadable, or a name with a null byte
            raise ImageError(f"Cannot read {str(path)!r} ({type(exc).__name__}).",
                             public="The image file could not be read; please upload it again.") from None
    if len(data) > limits.max_bytes:
        raise ImageError(f"The file is {len(data) / 2**20:.1f} MiB; the limit is {limits.max_bytes / 2**20:.0f} MiB.")
    return data


def _unreadable(exc: BaseException) -> str:
    if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return "The image has too many pixels to decode safely (possible decompression bomb)."
    if isinstance(exc, UnidentifiedImageError):
        return "This file is not an image format we can read (try PNG, JPEG, WebP, GIF, TIFF, BMP or PSD)."
    return f"The image could not be decoded; the file may be truncated or damaged ({type(exc).__name__})."


BAND_PIXELS = 1 << 20  # pixels of a high-bit-depth image scaled at once (8 MiB of float64)


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB, with transparency composited onto white and high bit depths scaled down: 16-bit and 32-bit
    integers by 255/65535 (or kept, for 32-bit values all within 0..255), floats from their own range
    [min, max] to 0..255 (NaN pixels black), rounded half up."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        top = 65535.0 if image.mode.startswith("I;16") or image.getextrema()[1] > 255 else 255.0
        return _scaled(image, lambda band: np.clip(band / top * 255.0 + 0.5, 0, 255))
    if image.mode == "F":
        low, high = (float(v) for v in image.getextrema())
        if not high > low:
            return Image.new("RGB", image.size)
        return _scaled(image, lambda band: (np.nan_to_num(band, nan=low) - low) / (high - low) * 255.0 + 0.5)
    has_alpha = image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def _scaled(image: Image.Image, scale) -> Image.Image:
    """RGB of `scale(float64 values)` taken in bands of rows of about `BAND_PIXELS` pixels: a 40-MP
    16-bit or float image never gets a full-size float64 copy (320 MB, and several of them at once)."""
    width, height = image.size
    out = np.empty((height, width), dtype=np.uint8)
    rows = max(1, BAND_PIXELS // max(width, 1))
    for top in range(0, height, rows):
        band = np.asarray(image.crop((0, top, width, min(height, top + rows))), dtype=np.float64)
        out[top:top + rows] = scale(band).astype(np.uint8)
    return Image.fromarray(out).convert("RGB")


@dataclass(frozen=True)
class Preprocess:
    """A model's own evaluation transform (timm data config or Hugging Face image processor)."""

    input_size: tuple[int, int]  # (H, W) the model is fed by default
    mode: str  # "crop": keep aspect ratio, resize to cover input_size / crop_pct (timm, DeiT);
    #            "squash": resize to input_size / crop_pct ignoring aspect ratio (HF image processors)
    crop_pct: float  # fraction of the resized image kept by the centre crop (1.0: no crop)
    interpolation: str  # PIL resampling filter name: bicubic, bilinear, ...
    mean: tuple[float, float, float]  # per-channel mean on the 0..1 scale
    std: tuple[float, float, float]  # per-channel std on the 0..1 scale

    def __post_init__(self) -> None:
        if self.mode not in ("crop", "squash"):
            raise ValueError(f"unknown preprocessing mode {self.mode!r}")
        if self.interpolation not in _RESAMPLING:
            raise ValueError(f"unknown interpolation {self.interpolation!r}")

    def _plan(self, image_size: tuple[int, int], input_size: tuple[int, int] | None) -> tuple[int, int, int, int]:
        """(resized width, resized height, crop left, crop top) for an image of (width, height) pixels."""
        height, width = input_size or self.input_size
        cover_h, cover_w = math.floor(height / self.crop_pct), math.floor(width / self.crop_pct)
        img_w, img_h = image_size
        if self.mode == "squash":
            new_h, new_w = cover_h, cover_w
        elif cover_h / img_h >= cover_w / img_w:
            # torchvision's Resize(shortest side) + CenterCrop, generalised to a non-square target.
            new_h, new_w = cover_h, max(cover_w, int(cover_h * img_w / img_h))
        else:
            new_h, new_w = max(cover_h, int(cover_w * img_h / img_w)), cover_w
        return new_w, new_h, int(round((new_w - width) / 2.0)), int(round((new_h - height) / 2.0))

    def crop_box(self, image_size: tuple[int, int], input_size: tuple[int, int] | None = None) -> tuple[float, ...]:
        """(left, top, right, bottom) in pixels of the ORIGINAL (width, height) image that `crop` keeps,
        so that maps of two models fed different crops of one image can be placed on common ground."""
        height, width = input_size or self.input_size
        new_w, new_h, left, top = self._plan(image_size, input_size)
        scale_x, scale_y = image_size[0] / new_w, image_size[1] / new_h
        return left * scale_x, top * scale_y, (left + width) * scale_x, (top + height) * scale_y

    def crop(self, image: Image.Image, input_size: tuple[int, int] | None = None) -> Image.Image:
        """The RGB image the model sees, of exactly `input_size` (default: the model's own)."""
        height, width = input_size or self.input_size
        resample = _RESAMPLING[self.interpolation]
        new_w, new_h, left, top = self._plan(image.size, input_size)
        cover_h, cover_w = math.floor(height / self.crop_pct), math.floor(width / self.crop_pct)
        if new_h * new_w > MAX_INTERMEDIATE_FACTOR * cover_h * cover_w:
            # Extreme aspect ratio (e.g. 10000x10): resample only the kept region, so no huge intermediate
            # image is built. Within one grey level of resize-then-crop.
            return image.resize((width, height), resample, box=self.crop_box(image.size, input_size))
        resized = image.resize((new_w, new_h), resample)  # exactly torchvision's Resize + CenterCrop
        return resized.crop((left, top, left + width, top + height))

    def normalize(self, rgb: np.ndarray) -> torch.Tensor:
        """(H, W, 3) uint8 -> (1, 3, H, W) contiguous float32, normalised with the model's mean and std:
        ((x / 255) - mean) / std, the operations of torchvision's ToTensor and Normalize in their order (so
        the same float32 values), on one contiguous (3, H, W) copy worked in place."""
        x = torch.from_numpy(np.ascontiguousarray(np.moveaxis(rgb, -1, 0), dtype=np.float32)).div_(255.0)  # (3, H, W)
        mean = torch.tensor(self.mean).view(3, 1, 1)
        std = torch.tensor(self.std).view(3, 1, 1)
        return x.sub_(mean).div_(std).unsqueeze(0)

    def to_rgb(self, pixels: torch.Tensor) -> np.ndarray:
        """(1, 3, H, W) or (3, H, W) normalised pixels -> (H, W, 3) uint8: x * std + mean, times 255, rounded
        and clipped (the inverse of `normalize` up to that rounding)."""
        x = pixels.detach().reshape(3, *pixels.shape[-2:]).float().cpu()
        x = x * torch.tensor(self.std).view(3, 1, 1) + torch.tensor(self.mean).view(3, 1, 1)
        return np.ascontiguousarray((x * 255.0).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy())

    def apply(self, image: Image.Image, input_size: tuple[int, int] | None = None) -> tuple[torch.Tensor, np.ndarray]:
        """(model input (1, 3, H, W) float32, the RGB crop it came from (H, W, 3) uint8)."""
        rgb_image = image if image.mode == "RGB" else image.convert("RGB")  # resizing never changes `image`
        rgb = np.asarray(self.crop(rgb_image, input_size), dtype=np.uint8)
        return self.normalize(rgb), rgb


def thumbnail_size(size: tuple[int, int], side: int) -> tuple[int, int]:
    """(width, height) of Pillow's `Image.thumbnail` of a (width, height) image into a ``side`` x ``side``
    square: unchanged when both sides fit; otherwise the longer side becomes ``side`` and the other is the
    floor or ceiling of its exact value (at least 1), whichever keeps the aspect ratio closest."""
    width, height = size
    if width <= side and height <= side:
        return width, height
    aspect = width / height
    if aspect <= 1:  # portrait or square: the height is the side
        exact, ratio = side * aspect, lambda w: abs(aspect - w / side)
    else:
        exact, ratio = side / aspect, lambda h: abs(aspect - side / h) if h else 0
    other = max(min(math.floor(exact), math.ceil(exact), key=ratio), 1)
    return (other, side) if aspect <= 1 else (side, other)


def preview_rgb(image: Image.Image, side: int) -> np.ndarray:
    """(h, w, 3) uint8 the whole image, its longer side at most ``side`` pixels: the pixels of Pillow's
    ``image.convert("RGB").thumbnail((side, side), BILINEAR)`` (the same size, `thumbnail_size`, and its
    reducing gap of 2), without that full-size copy for an RGB image (17-32 ms for a 12-MP photo)."""
    rgb_image = image if image.mode == "RGB" else image.convert("RGB")
    size = thumbnail_size(rgb_image.size, side)
    if size != rgb_image.size:
        rgb_image = rgb_image.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)
    return np.asarray(rgb_image, dtype=np.uint8)


ImageFile.LOAD_TRUNCATED_IMAGES = False  # truncated files are errors, never half-grey images


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def find_images(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Image files named directly, or found (sorted, non-recursively) in the folders named."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found.extend(sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()))
        else:
            found.append(path)
    return found


def square_crops(photo: Image.Image, count: int, rng: np.random.Generator) -> list[Image.Image]:
    """``count`` random views of ``photo`` for augmentation: each a square whose side is a uniform 50-100 % of the
    photo's shorter side, at a uniform position inside it, mirrored left to right with probability 1/2. Draws,
    per view: the side, the left and top corner, then the mirror (so a seeded ``rng`` gives the same views)."""
    width, height = photo.size
    views = []
    for _ in range(count):
        side = max(1, int(rng.uniform(0.5, 1.0) * min(width, height)))
        left, top = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
        view = photo.crop((left, top, left + side, top + side))
        views.append(view.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else view)
    return views
