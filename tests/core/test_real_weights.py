"""Facts a user would check on the real DeiT-Ti/16 ImageNet weights from ../shared."""
from __future__ import annotations

import csv
import os

import numpy as np
import pytest
import torch
from support import IMAGENET, PHOTOS

from vit_inspect.core.images import load_image
from vit_inspect.passes.capture import capture_attention

CAT_CLASSES = {"Egyptian cat", "tabby", "tiger cat"}


def _top(handle, photo, k=3):
    x, _ = handle.preprocess.apply(load_image(PHOTOS / photo))
    with torch.no_grad():
        probs = handle.forward(x).softmax(-1)[0].numpy()
    return handle.top_labels(probs, k)


def test_chelsea_is_a_cat(deit):
    names = {t["label"].split(",")[0] for t in _top(deit, "chelsea.png")}
    assert names & CAT_CLASSES, names


def test_coffee_is_espresso(deit):
    top = _top(deit, "coffee.png", 1)[0]
    assert top["label"] == "espresso" and top["prob"] > 0.7


def test_real_model_geometry(deit):
    assert deit.weights.endswith("deit_tiny_patch16_224.safetensors")
    layout = deit.layout()
    assert (layout.grid_h, layout.grid_w, layout.num_tokens) == (14, 14, 197)
    assert (deit.depth, deit.num_heads, deit.embed_dim, len(deit.labels)) == (12, 3, 192, 1000)


def test_capture_on_real_weights_matches_fused(deit):
    x, _ = deit.preprocess.apply(load_image(PHOTOS / "coffee.png"))
    with torch.no_grad():
        plain = deit.forward(x)
        with capture_attention(deit) as rec:
            captured = deit.forward(x)
    torch.testing.assert_close(captured, plain, rtol=1e-4, atol=1e-4)
    assert rec.attention.shape == (1, 12, 3, 197, 197)


@pytest.mark.slow  # every 4th of 1000 ImageNet photos
def test_imagenet_top1(deit):
    """Top-1 over ../shared's 1000 ImageNet photos; every 4th photo locally, all 1000 when CI is set."""
    if not (IMAGENET / "labels.csv").is_file():
        pytest.skip("ImageNet samples not found")
    rows = list(csv.DictReader(open(IMAGENET / "labels.csv")))
    if not os.environ.get("CI"):
        rows = rows[::4]
    correct = 0
    for start in range(0, len(rows), 50):
        chunk = rows[start:start + 50]
        x = torch.cat([deit.preprocess.apply(load_image(IMAGENET / r["filename"]))[0] for r in chunk])
        with torch.no_grad():
            predicted = deit.forward(x).argmax(-1).numpy()
        correct += int(np.sum(predicted == np.array([int(r["class_index"]) for r in chunk])))
    accuracy = correct / len(rows)
    print(f"imagenet_samples top-1 = {accuracy:.3f} on {len(rows)} images")
    assert accuracy >= 0.78
