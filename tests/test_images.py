"""Preprocessing reproduces the model's own transform; the RGB crop is what the model saw."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import PHOTOS, tiny_handle
from vit_inspect.errors import ImageError
from vit_inspect.images import ImageLimits, Preprocess, load_image


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
    torch.testing.assert_close(x[0], expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(pre.normalize(rgb), x)


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
