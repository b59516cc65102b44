"""Peers' methods and the small analyses behind the researcher-facing controls, with hand-computed values:
vit-explain's whole-matrix discard and class-specific gradient rollout (checked against an independent
torch implementation written from vit-explain's definition), DINO's mass mask, prefix-token shares,
class search and input geometry."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from support import dog_and_cat, make_layout, tiny_handle

from vit_inspect.analysis import (
    gradient_fused_attention,
    gradient_rollout,
    mass_mask,
    prefix_shares,
    rollout,
    rollout_matrix,
    search_classes,
)
from vit_inspect.analysis.classes import class_name
from vit_inspect.core.geometry import InputGeometry, keep_aspect_size, prepare, seen_box
from vit_inspect.core.images import Preprocess
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.pipeline import analyze_image

CLASS_1X2 = make_layout(True, 0, 0, 1, 2)  # tokens: class, patch (0, 0), patch (0, 1)


def vit_explain_reference(attentions, discard_ratio, gradients=None):
    """vit-explain's rollout / grad_rollout from its definition (Gildenblat 2020), in torch: per layer fuse
    heads (mean of attention, or max(0, mean of attention x gradient)); zero the int(ratio * N²) lowest
    entries of the fused matrix except flat index 0; (A + I) / 2; rows to sum 1; multiply from the left.
    Read out the class token's row over the patches."""
    num_tokens = attentions[0].shape[-1]
    result = torch.eye(num_tokens, dtype=torch.float64)
    for layer, attention in enumerate(attentions):
        if gradients is None:
            fused = attention.mean(dim=1)  # (1, N, N)
        else:
            fused = (attention * gradients[layer]).mean(dim=1).clamp(min=0)
        flat = fused.reshape(1, -1).clone()
        count = int(flat.shape[-1] * discard_ratio)
        _, lowest = flat.topk(count, dim=-1, largest=False)
        lowest = lowest[lowest != 0]
        flat[0, lowest] = 0
        fused = flat.reshape(1, num_tokens, num_tokens)
        a = (fused + torch.eye(num_tokens, dtype=torch.float64)) / 2
        a = a / a.sum(dim=-1, keepdim=True)
        result = a @ result
    return result[0, 0, 1:].numpy()


def test_whole_matrix_discard_by_hand():
    # One layer, one head, 3 tokens. The lowest floor(0.34 * 9) = 3 of the 9 entries are 0.0 (2,0),
    # 0.1 (0,0) and 0.1 (1,2); (0,0), the class token on itself, is spared, so only two are zeroed
    # (as in vit-explain, the spared entry is not replaced). The per-row rule drops floor(0.34 * 3) = 1
    # entry per row instead.
    attention = np.array([[[[0.1, 0.7, 0.2], [0.4, 0.5, 0.1], [0.0, 0.3, 0.7]]]])
    matrix = rollout_matrix(attention, discard_ratio=0.34, residual=False, layout=CLASS_1X2, discard="matrix")
    # kept: row 0 unchanged; row 1 [0.4, 0.5, 0] -> /0.9; row 2 [0, 0.3, 0.7]
    np.testing.assert_allclose(matrix, [[0.1, 0.7, 0.2], [4 / 9, 5 / 9, 0.0], [0.0, 0.3, 0.7]])
    per_row = rollout_matrix(attention, discard_ratio=0.34, residual=False, layout=CLASS_1X2, discard="row")
    # per row, the lowest non-class entry: row 0 drops 0.2, row 1 drops 0.1, row 2 drops 0.3 (class column kept)
    np.testing.assert_allclose(per_row, [[0.125, 0.875, 0.0], [4 / 9, 5 / 9, 0.0], [0.0, 0.0, 1.0]])


def test_gradient_fused_attention_by_hand():
    attention = np.array([[[[0.5, 0.5], [1.0, 0.0]], [[0.2, 0.8], [0.0, 1.0]]]])  # (1 layer, 2 heads, 2, 2)
    grad = np.array([[[[2.0, -4.0], [1.0, 3.0]], [[5.0, 1.0], [-1.0, -2.0]]]])
    # heads: [[1, -2], [1, 0]] and [[1, 0.8], [0, -2]]; mean [[1, -0.6], [0.5, -1]]; clipped at 0
    np.testing.assert_allclose(gradient_fused_attention(attention, grad)[0], [[1.0, 0.0], [0.5, 0.0]])


@pytest.mark.parametrize("discard_ratio", [0.0, 0.5, 0.9])
def test_rollout_and_gradient_rollout_match_vit_explain(discard_ratio):
    layout = make_layout(True, 0, 0, 2, 3)
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(4, 2, layout.num_tokens, layout.num_tokens))
    attention = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)  # (depth, heads, N, N)
    grad = rng.normal(size=attention.shape)
    tensors = [torch.from_numpy(a[None]) for a in attention]
    grads = [torch.from_numpy(g[None]) for g in grad]
    ours = rollout(attention, layout, discard_ratio=discard_ratio, discard="matrix").ravel()
    np.testing.assert_allclose(ours, vit_explain_reference(tensors, discard_ratio), rtol=1e-10)
    fused = gradient_fused_attention(attention, grad)
    ours = gradient_rollout(fused, layout, discard_ratio=discard_ratio).ravel()
    np.testing.assert_allclose(ours, vit_explain_reference(tensors, discard_ratio, grads), rtol=1e-10)


def test_pipeline_gradient_rollout_matches_vit_explain_on_a_model():
    handle = tiny_handle("cls")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8))
    result = analyze_image(handle, image, target=3)
    pixels, _ = handle.preprocess.apply(image)
    with torch.enable_grad(), capture_attention(handle) as rec:
        logits = handle.forward(pixels.requires_grad_(True))
        rec.backward(logits[0, 3])
    attentions = [a.detach().double() for a in rec.attention_tensors()]
    grads = rec.attention_grad()[0].double()  # (depth, heads, N, N)
    expected = vit_explain_reference(attentions, 0.9, [g[None] for g in grads])
    # float16 storage of the fused layers: agreement to 1e-2 of the largest value
    np.testing.assert_allclose(result.gradient_rollout(0.9).ravel(), expected, atol=1e-2 * expected.max())


def test_mass_mask_by_hand():
    values = np.array([[0.5, 0.1], [0.3, 0.1]])
    np.testing.assert_array_equal(mass_mask(values, 0.6), [[True, False], [True, False]])  # 0.5 + 0.3 >= 0.6
    np.testing.assert_array_equal(mass_mask(values, 0.5), [[True, False], [False, False]])  # 0.5 alone
    np.testing.assert_array_equal(mass_mask(values, 0.85), [[True, True], [True, False]])  # ties: earlier first
    assert mass_mask(np.zeros((2, 2)), 0.6).sum() == 0
    assert mass_mask(np.stack([values, values[::-1]]), 0.5)[1, 1, 0]  # one mask per head
    with pytest.raises(ValueError):
        mass_mask(-values, 0.5)


def test_prefix_shares_by_hand():
    layout = make_layout(True, 1, 0, 1, 2)  # class, distillation, two patches
    matrix = np.array([[0.6, 0.2, 0.1, 0.1], [0.1, 0.1, 0.4, 0.4], [0.5, 0.25, 0.25, 0.0], [0.3, 0.1, 0.2, 0.4]])
    np.testing.assert_allclose(prefix_shares(matrix, layout), [0.6, 0.2])  # class token's row
    np.testing.assert_allclose(prefix_shares(matrix, layout, (0, 1)), [0.3, 0.1])
    np.testing.assert_allclose(prefix_shares(matrix, layout, "mean"), [0.4, 0.175])


LABELS = ["tench, Tinca tinca", "goldfish, Carassius auratus", "great white shark", "beagle", "tabby, tabby cat",
          "English foxhound", "Walker hound, Walker foxhound"] + [f"thing {i}" for i in range(7, 12)]


def test_class_search_by_index_name_and_probability():
    probs = np.zeros(len(LABELS))
    probs[[4, 10, 11, 5]] = [0.5, 0.3, 0.15, 0.05]  # "tabby" and "thing 10/11" hold digits "1"
    assert search_classes(LABELS, "1", probs)[0] == 1  # "1" is goldfish, never a label containing "1"
    assert search_classes(LABELS, "#1", probs)[0] == 1
    assert search_classes(LABELS, "1", probs)[1:3] == [10, 11]  # then labels with a word "1…", most probable first
    assert search_classes(LABELS, "beagle")[0] == 3
    assert search_classes(LABELS, "foxhound", probs) == [5, 6]  # an exact synonym, then a word
    assert search_classes(LABELS, "", probs, limit=3) == [4, 10, 11]  # empty: the top classes
    assert search_classes(LABELS, "99") == []
    assert class_name(LABELS, 1) == "goldfish, Carassius auratus (#1)"


def test_class_search_on_imagenet_labels(deit):
    assert search_classes(deit.labels, "1")[0] == 1 and deit.labels[1].startswith("goldfish")
    assert search_classes(deit.labels, "beagle")[0] == 162


def test_keep_aspect_size_and_seen_box_by_hand():
    # a 400x200 (w x h) image, shorter side 224 -> 14 rows, 28 columns of 16-pixel patches
    assert keep_aspect_size((400, 200), 224, (16, 16), 10_000) == (224, 448)
    assert keep_aspect_size((400, 200), 224, (16, 16), 98) == (112, 224)  # capped: 392 patches -> 7 x 14
    crop = Preprocess((224, 224), "crop", 0.875, "bicubic", (0.5,) * 3, (0.5,) * 3)
    # resize shorter side to 256 -> 512x256, centre 224x224 at (144, 16) -> /1.28 in the upload's pixels
    np.testing.assert_allclose(seen_box(crop, (400, 200), (224, 224)), (112.5, 12.5, 287.5, 187.5))


@pytest.mark.parametrize("mode, size, grid", [("crop", None, (4, 4)), ("squash", None, (4, 4)), ("keep", 32, (4, 8))])
def test_prepare_geometries_on_a_wide_image(mode, size, grid):
    handle = tiny_handle("cls")  # 32x32 input, 8-pixel patches
    image = Image.new("RGB", (80, 40), (200, 10, 10))
    pixels, rgb, box = prepare(handle.preprocess, image, InputGeometry(mode, size), handle.patch_size)
    assert rgb.shape[:2] == (grid[0] * 8, grid[1] * 8) and pixels.shape[-2:] == rgb.shape[:2]
    whole = mode != "crop"
    assert (box == (0.0, 0.0, 80.0, 40.0)) == whole
    result = analyze_image(handle, image, geometry=InputGeometry(mode, size))
    assert (result.layout.grid_h, result.layout.grid_w) == grid and result.geometry == mode


@pytest.mark.slow
def test_dog_and_cat_side_by_side_keep_aspect_shows_both(deit, tmp_path):
    """Two shared photos side by side: the centre crop loses the cat, keeping the aspect ratio shows a dog
    class (ImageNet 151-268) and a cat class (281-285) in the top 5."""

    pair = tmp_path / "dog_and_cat.png"
    dog_and_cat(pair)
    top5 = {mode: set(np.argsort(-analyze_image(deit, pair, geometry=InputGeometry(mode), gradients=False).probs)[:5])
            for mode in ("crop", "keep")}
    dogs, cats = set(range(151, 269)), set(range(281, 286))
    assert top5["keep"] & dogs and top5["keep"] & cats, top5["keep"]
    assert not top5["crop"] & cats, top5["crop"]  # the centre crop shows only the dog
