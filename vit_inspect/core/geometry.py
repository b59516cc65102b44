"""How an upload becomes the model's input: the model's centre crop, the whole image squashed, or the
whole image with its aspect ratio kept on a non-square patch grid; and which part of the upload the
model saw."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch
from PIL import Image

from vit_inspect.core.errors import SmallImageWarning, VitInspectError
from vit_inspect.core.images import Preprocess

GEOMETRY_MODES = ("crop", "squash", "keep")
MAX_KEEP_PATCHES_FACTOR = 4  # "keep" uses at most this many times the model's own number of patches


@dataclass(frozen=True)
class InputGeometry:
    """What part of an upload the model sees, and at what size."""

    mode: str = "crop"  # crop: the model's own preprocessing (resize, centre crop);
    #                    squash: the whole image resized to the model's input size, aspect ratio ignored;
    #                    keep: the whole image, aspect ratio kept, shorter side `size`, non-square grid
    size: int | None = None  # keep: shorter side in pixels (rounded to whole patches); None: the model's

    def __post_init__(self) -> None:
        if self.mode not in GEOMETRY_MODES:
            raise ValueError(f"unknown input geometry {self.mode!r}; choose one of {GEOMETRY_MODES}")
        if self.size is not None and not 1 <= self.size <= 4096:
            raise ValueError(f"the input size must be between 1 and 4096 pixels, got {self.size}")

    def describe(self, input_size: tuple[int, int]) -> str:
        """A short record, e.g. "keep aspect, 224×448 pixels"."""
        name = {"crop": "model's centre crop", "squash": "whole image squashed", "keep": "whole image, aspect kept"}
        return f"{name[self.mode]}, {input_size[0]}×{input_size[1]} pixels"


MIN_PATCHES = 4  # an image whose shorter side spans fewer of the model's patches than this is analysed with a warning


def enlarged_blur(image_size: tuple[int, int], patch_size: tuple[int, int]) -> str | None:
    """The warning for an image of (width, height) pixels whose shorter side is under `MIN_PATCHES` of the
    model's (patch height, patch width) patches: every preprocessing enlarges it to the model's input, so the
    model sees a blur a few patches wide, and its top-5 and maps say little about the picture. None otherwise.
    An upscaled image is analysed, not refused: a model made for small inputs has patches small enough."""
    width, height = image_size
    side = MIN_PATCHES * max(patch_size)
    if min(width, height) >= side:
        return None
    return (f"This image is {width}×{height} pixels, under {MIN_PATCHES} of the model's {patch_size[0]}×"
            f"{patch_size[1]}-pixel patches on a side ({side} pixels): the model sees it enlarged, as a blur, so "
            "its predictions and maps say little about the picture. Use a larger image where you have one.")


def warn_if_blurred(image_size: tuple[int, int], patch_size: tuple[int, int], stacklevel: int = 3) -> None:
    """`enlarged_blur`'s sentence as a `SmallImageWarning` (the command line prints it as a line of its own),
    attributed ``stacklevel`` frames up (3: the caller of the function that calls this)."""
    words = enlarged_blur(image_size, patch_size)
    if words is not None:
        warnings.warn(words, SmallImageWarning, stacklevel=stacklevel)


MAX_PASS_MAP_BYTES = 16 * 2 ** 30  # float32 attention maps one pass may keep for its backward, at most


def check_input_size(handle, input_size: tuple[int, int], max_bytes: int = MAX_PASS_MAP_BYTES) -> None:
    """Refuse, with a sentence, an (H, W) input ``handle``'s model cannot take: not whole patches (timm and
    transformers stop with an assertion), or one whose pass would keep more than ``max_bytes`` of float32
    attention maps for its backward, depth x heads x N^2 x 4 bytes with N tokens (4000 x 4000 pixels asked
    DeiT-Ti for 524 GiB; the allocator's traceback was all a user saw)."""
    height, width = input_size
    patch_h, patch_w = handle.patch_size
    if height < patch_h or width < patch_w or height % patch_h or width % patch_w:
        raise VitInspectError(
            f"The input size {height}x{width} is not a whole number of {patch_h}x{patch_w} patches; "
            f"use multiples of the patch size, e.g. {max(1, round(height / patch_h)) * patch_h}x"
            f"{max(1, round(width / patch_w)) * patch_w}.")
    tokens = handle.layout((height, width)).num_tokens
    nbytes = handle.depth * handle.num_heads * tokens ** 2 * 4
    if nbytes > max_bytes:
        raise VitInspectError(
            f"The input size {height}x{width} gives {tokens} tokens, whose attention maps ({handle.depth} layers x "
            f"{handle.num_heads} heads x {tokens}^2 x 4 bytes = {nbytes / 2 ** 30:.1f} GiB) the pass would keep for "
            f"its backward: more than the {max_bytes / 2 ** 30:.3g} GiB allowed; choose a smaller size.")


def keep_aspect_size(image_size: tuple[int, int], shorter_side: int, patch_size: tuple[int, int],
                     max_patches: int) -> tuple[int, int]:
    """(H, W) in whole patches for an image of (width, height) = ``image_size``: the shorter side
    about ``shorter_side`` pixels, the aspect ratio kept to within one patch, at most ``max_patches``."""
    width, height = image_size
    patch_h, patch_w = patch_size
    scale = shorter_side / min(width, height)
    rows = max(1, round(height * scale / patch_h))
    cols = max(1, round(width * scale / patch_w))
    if rows * cols > max_patches:
        shrink = math.sqrt(max_patches / (rows * cols))
        rows, cols = max(1, math.floor(rows * shrink)), max(1, math.floor(cols * shrink))
    return rows * patch_h, cols * patch_w


def seen_box(preprocess: Preprocess, image_size: tuple[int, int],
             input_size: tuple[int, int]) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) in the upload's pixels of the region `preprocess.crop` keeps."""
    width, height = image_size
    out_h, out_w = input_size
    cover_h, cover_w = math.floor(out_h / preprocess.crop_pct), math.floor(out_w / preprocess.crop_pct)
    if preprocess.mode == "squash":
        new_h, new_w = cover_h, cover_w
    elif cover_h / height >= cover_w / width:
        new_h, new_w = cover_h, max(cover_w, int(cover_h * width / height))
    else:
        new_h, new_w = max(cover_h, int(cover_w * height / width)), cover_w
    top, left = int(round((new_h - out_h) / 2.0)), int(round((new_w - out_w) / 2.0))
    scale_x, scale_y = width / new_w, height / new_h
    return left * scale_x, top * scale_y, (left + out_w) * scale_x, (top + out_h) * scale_y


def prepare(preprocess: Preprocess, image: Image.Image, geometry: InputGeometry, patch_size: tuple[int, int],
            input_size: tuple[int, int] | None = None) -> tuple[torch.Tensor, np.ndarray, tuple[float, float, float, float]]:
    """(model input (1, 3, H, W), the RGB crop it came from (H, W, 3) uint8, the seen region of the
    upload as (left, top, right, bottom) pixels) for one geometry; crop and squash at ``input_size``
    (default: the model's), keep at the size its shorter side gives (``input_size`` refused: it would be
    ignored)."""
    if geometry.mode == "keep" and input_size is not None:
        raise VitInspectError("An input size cannot be combined with the 'keep' geometry, which sizes the input "
                              "from its shorter side; give the shorter side instead.")
    if geometry.mode == "crop":
        input_size = input_size or preprocess.input_size
        used = preprocess
    else:
        used = replace(preprocess, mode="squash", crop_pct=1.0)  # the whole image, nothing cropped
        if geometry.mode == "squash":
            input_size = input_size or preprocess.input_size
        else:
            native = (preprocess.input_size[0] // patch_size[0]) * (preprocess.input_size[1] // patch_size[1])
            input_size = keep_aspect_size(image.size, geometry.size or min(preprocess.input_size), patch_size,
                                          MAX_KEEP_PATCHES_FACTOR * native)
    pixels, rgb = used.apply(image, input_size)
    return pixels, rgb, seen_box(used, image.size, input_size)


def parse_size(text: str | None) -> tuple[int, int] | None:
    """"224x320" -> (224, 320), (height, width) in pixels; None -> None (the model's own size)."""
    if text is None:
        return None
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise VitInspectError(f"--input-size must look like 224x320 (height x width), got {text!r}") from None
    return height, width
