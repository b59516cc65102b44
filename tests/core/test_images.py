"""Preprocessing reproduces the model's own transform; the RGB crop is what the model saw."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from support import PHOTOS, tiny_handle

from vit_inspect.core.errors import ImageError
from vit_inspect.core.images import (
    ImageLimits,
    Preprocess,
    load_image,
    preview_rgb,
    thumbnail_size,
)


@pytest.mark.parametrize("photo", ["chelsea.png", "rocket.jpg", "astronaut.png"])
def test_crop_mode_matches_timm_transform(photo):
    import timm
    from timm.data import create_transform, resolve_data_config

    model = timm.create_model("deit_tiny_patch16_224", pretrained=False)
    cfg = resolve_data_config({}, model=model)
    expected = create_transform(**cfg)(Image.open(PHOTOS / photo).convert("RGB"))
    pre = Preprocess(input_size=(224, 224), mode="crop", crop_pct=cfg["crop_pct"], interpolation="bicubic",
                     mean=cfg["mean"], std=cfg["std"])
    x, rgb = pre.apply(load_image(PHOTOS / photo))
    assert x.shape == (1, 3, 224, 224) and rgb.shape == (224, 224, 3) and rgb.dtype == np.uint8
    assert torch.equal(x[0], expected) and x.is_contiguous()  # ToTensor + Normalize's operations, in their order
    torch.testing.assert_close(pre.normalize(rgb), x, rtol=0, atol=0)


def test_squash_mode_matches_hf_processor():
    from transformers import DeiTImageProcessor

    processor = DeiTImageProcessor()  # resize 256x256 (no aspect), centre crop 224, bicubic
    image = load_image(PHOTOS / "coffee.png")
    expected = processor(image, return_tensors="pt")["pixel_values"]
    pre = Preprocess(input_size=(224, 224), mode="squash", crop_pct=224 / 256, interpolation="bicubic",
                     mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    x, _ = pre.apply(image)
    assert (x - expected).abs().max() < 0.02  # HF resizes in float, we in uint8: at most ~1 grey level


def test_nonsquare_crop_keeps_aspect_and_centre():
    pre = Preprocess(input_size=(20, 40), mode="crop", crop_pct=1.0, interpolation="nearest",
                     mean=(0, 0, 0), std=(1, 1, 1))
    array = np.zeros((100, 100, 3), np.uint8)
    array[:, 50:] = 255  # right half white
    _, rgb = pre.apply(Image.fromarray(array))
    assert rgb.shape == (20, 40, 3)
    assert rgb[:, :20].max() == 0 and rgb[:, 20:].min() == 255


def test_handle_preprocess_then_forward_any_size():
    handle = tiny_handle("cls")
    x, rgb = handle.preprocess.apply(load_image(PHOTOS / "chelsea.png"), (32, 48))
    assert x.shape == (1, 3, 32, 48) and rgb.shape == (32, 48, 3)


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_load_image_basic_conversions():
    rgba = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    assert np.asarray(load_image(_png(rgba))).min() == 255  # transparent -> white
    grey = Image.new("L", (4, 4), 7)
    assert np.asarray(load_image(_png(grey))).tolist() == np.full((4, 4, 3), 7).tolist()
    assert load_image(_png(Image.new("RGB", (5, 3)))).size == (5, 3)


def test_load_image_refuses_junk_with_messages():
    with pytest.raises(ImageError, match="empty"):
        load_image(b"")
    with pytest.raises(ImageError, match="not an image format"):
        load_image(b"<html>hello</html>")
    with pytest.raises(ImageError, match="truncated or damaged"):
        load_image(_png(Image.new("RGB", (64, 64), (10, 20, 30)))[:80])
    with pytest.raises(ImageError, match="limit"):
        load_image(_png(Image.new("RGB", (100, 100))), ImageLimits(max_pixels=5000))


def _oriented(size: tuple[int, int], orientation: int) -> bytes:
    """A JPEG of ``size`` (width, height), left half red, right half blue, tagged with an EXIF orientation."""
    image = Image.new("RGB", size, (255, 0, 0))
    image.paste((0, 0, 255), (size[0] // 2, 0, size[0], size[1]))
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", exif=exif.tobytes(), quality=95)
    return buffer.getvalue()


def test_load_image_turns_a_decoded_file_in_place_and_never_a_given_image():
    # orientation 6: shown turned 90° clockwise, so the 40 x 20 picture's red left half ends up on top
    turned = np.asarray(load_image(_oriented((40, 20), 6)), dtype=np.int16)
    assert turned.shape == (40, 20, 3)
    # away from the boundary, which JPEG's chroma subsampling blurs
    assert turned[:16, :, 0].min() > 200 and turned[:16, :, 2].max() < 60  # red on top
    assert turned[24:, :, 2].min() > 200 and turned[24:, :, 0].max() < 60  # blue below
    given = Image.open(io.BytesIO(_oriented((40, 20), 6)))
    from_given = load_image(given)
    assert from_given.size == (20, 40) and np.array_equal(np.asarray(from_given), turned.astype(np.uint8))
    assert given.size == (40, 20) and given.getexif()[0x0112] == 6  # the caller's image is left as it was
    upright = load_image(_oriented((40, 20), 1))
    assert upright.size == (40, 20) and upright.mode == "RGB"


@pytest.mark.parametrize("size, side, expected", [
    ((451, 300), 448, (448, 298)),  # 448 / (451 / 300) = 298.0
    ((300, 451), 448, (298, 448)),
    ((1000, 1), 448, (448, 1)),  # 0.448 rounds to 0; a side is at least 1
    ((3, 1000), 448, (1, 448)),  # 1.344 -> 1
    ((448, 448), 448, (448, 448)),  # fits: unchanged
    ((100, 40), 448, (100, 40)),
    ((449, 449), 448, (448, 448)),
    ((4032, 3024), 448, (448, 336)),  # 448 * 3 / 4
    ((1000, 667), 10, (10, 7)),  # 6.67: 7 keeps the ratio closer than 6
])
def test_thumbnail_size_by_hand(size, side, expected):
    assert thumbnail_size(size, side) == expected


def test_preview_rgb_equals_pillows_thumbnail_of_an_rgb_copy():
    """The independent implementation is Pillow's own `Image.thumbnail`, as the pass used it before."""
    rng = np.random.default_rng(0)
    sizes = [(451, 300), (300, 451), (448, 448), (449, 449), (2000, 1500), (1500, 2000), (997, 13), (13, 997),
             (1200, 1), (90, 60)] + [tuple(int(v) for v in rng.integers(1, 1800, 2)) for _ in range(12)]
    for size in sizes:
        base = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
        for mode in ("RGB", "L", "RGBA", "P"):
            image = base if mode == "RGB" else base.convert(mode)
            before = image.copy()
            expected = image.convert("RGB")
            expected.thumbnail((448, 448), Image.Resampling.BILINEAR)
            got = preview_rgb(image, 448)
            assert got.dtype == np.uint8 and got.shape == (expected.height, expected.width, 3), (size, mode)
            assert np.array_equal(got, np.asarray(expected)), (size, mode)
            assert image.size == before.size and image.tobytes() == before.tobytes()  # the image is untouched
    assert thumbnail_size((4032, 3024), 448) == (448, 336)


def test_preprocess_leaves_an_rgb_image_unchanged_and_equals_a_converted_one():
    image = load_image(PHOTOS / "coffee.png")
    before = image.tobytes()
    pre = Preprocess(input_size=(224, 224), mode="crop", crop_pct=0.875, interpolation="bicubic",
                     mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    x, rgb = pre.apply(image)
    assert image.tobytes() == before and image.mode == "RGB"
    grey = image.convert("L")  # a non-RGB image is converted first, as before
    x_grey, rgb_grey = pre.apply(grey)
    _, rgb_of_copy = pre.apply(grey.convert("RGB"))
    assert np.array_equal(rgb_grey, rgb_of_copy) and np.array_equal(rgb_grey[..., 0], rgb_grey[..., 2])
    assert not np.array_equal(rgb, rgb_grey)


def test_high_bit_depths_are_scaled_by_hand_in_bands(monkeypatch):
    """16-bit: round(v * 255 / 65535) half up; 32-bit integers within 0..255 kept, beyond them scaled like
    16-bit and clipped; floats from [min, max] to 0..255, NaN black. Bands of 3 pixels (one row of a
    3-wide image) give the same pixels as one band."""
    from vit_inspect.core import images

    def rgb(image):
        return np.asarray(load_image(image))[..., 0].tolist()

    sixteen = Image.fromarray(np.array([[0, 128, 129], [32768, 65279, 65535]], dtype=np.uint16))
    small = Image.fromarray(np.array([[-3, 0, 7], [200, 255, 255]], dtype=np.int32))
    large = Image.fromarray(np.array([[-3, 0, 256], [32768, 65535, 70000]], dtype=np.int32))
    floats = Image.fromarray(np.array([[-1.0, 0.0, np.nan], [0.5, 1.0, 3.0]], dtype=np.float32))
    expected = {"16-bit": [[0, 0, 1], [128, 254, 255]],  # 128 / 257 = 0.498, 129 / 257 = 0.502
                "32-bit, small": [[0, 0, 7], [200, 255, 255]],  # -3 clipped
                "32-bit, large": [[0, 0, 1], [128, 255, 255]],
                "float": [[0, 64, 0], [96, 128, 255]]}  # (v + 1) / 4 * 255 + 0.5: 64.25, 96.1, 128.0
    for band in (images.BAND_PIXELS, 3):
        monkeypatch.setattr(images, "BAND_PIXELS", band)
        assert {"16-bit": rgb(sixteen), "32-bit, small": rgb(small), "32-bit, large": rgb(large),
                "float": rgb(floats)} == expected
    assert np.asarray(load_image(Image.fromarray(np.full((2, 2), 5.0, np.float32)))).max() == 0  # flat: black


def test_a_float_image_is_scaled_without_a_full_size_float64_copy(monkeypatch):
    """A 2000x2000 float image, bands of 65,536 pixels: the conversion's numpy allocations (tracemalloc)
    peak under a quarter of one full-size float64 copy (32 MB; converting it whole peaked at 95 MiB):
    the 4 MB uint8 output and a few band-sized temporaries of 0.5 MB."""
    import tracemalloc

    from vit_inspect.core import images

    monkeypatch.setattr(images, "BAND_PIXELS", 1 << 16)
    image = Image.fromarray(np.random.default_rng(0).normal(size=(2000, 2000)).astype(np.float32))
    tracemalloc.start()
    try:
        rgb = images._to_rgb(image)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rgb.size == (2000, 2000) and peak < 2000 * 2000 * 8 // 4
