"""Every block's tokens in the pass, concepts of one image (deep feature factorisation) and patch similarity, on
tiny random ViTs of every token layout, against pytorch-grad-cam's DeepFeatureFactorization, and on the real
DeiT-Ti."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image
from pytorch_grad_cam.feature_factorization.deep_feature_factorization import DeepFeatureFactorization
from pytorch_grad_cam.utils.image import scale_cam_image
from scipy.optimize import linear_sum_assignment
from support import PHOTOS, TINY_TIMM, tiny_handle, tiny_hf

from vit_inspect.analysis.similarity import cosine_similarity
from vit_inspect.core.errors import InputError
from vit_inspect.passes.block_tokens import block_tokens, keeps_block_tokens, recording_blocks
from vit_inspect.passes.concepts import image_concepts, patch_similarity
from vit_inspect.passes.pipeline import analyze_image


def noise(size: tuple[int, int], seed: int = 0) -> Image.Image:
    """A (height, width) picture of uniform noise."""
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8))


def tiny_result(kind: str, seed: int = 0):
    handle = tiny_handle(kind, seed=1)
    height, width = TINY_TIMM[kind][1]  # the model's input; the picture twice as large, so not a blur to it
    return handle, analyze_image(handle, noise((2 * height, 2 * width), seed), relevance=False)


def forward_tokens(handle, rgb: np.ndarray) -> list[np.ndarray]:
    """Every block's (P, D) float32 output patch tokens from a plain forward with hooks."""
    layout = handle.layout(rgb.shape[:2])
    with torch.no_grad(), recording_blocks(handle, range(handle.depth)) as seen:
        handle.forward(handle.preprocess.normalize(rgb))
    return [layout.patches(seen[i][0], axis=0).numpy() for i in range(handle.depth)]


def hook_count(model) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


@pytest.mark.parametrize("kind", sorted(TINY_TIMM))
def test_the_pass_keeps_every_blocks_patch_tokens(kind):
    handle, result = tiny_result(kind)
    layout = result.layout
    assert result.block_tokens.shape == (handle.depth, layout.num_patches, handle.embed_dim)
    assert result.block_tokens.dtype == np.float16
    for kept, plain in zip(result.block_tokens, forward_tokens(handle, result.rgb)):
        np.testing.assert_allclose(kept, plain, rtol=2e-3, atol=2e-3)  # float16 rounding
    np.testing.assert_array_equal(result.block_tokens[-1].reshape(result.patch_features.shape), result.patch_features)
    assert result.nbytes() >= result.block_tokens.nbytes + result.attention_store.nbytes()


def test_a_result_without_kept_tokens_reads_them_from_one_forward():
    handle, result = tiny_result("reg4")
    bare = dataclasses.replace(result, block_tokens=None)
    for layer in (0, -1):
        np.testing.assert_allclose(block_tokens(handle, bare, layer), result.block_tokens[layer], rtol=2e-3, atol=2e-3)
    assert hook_count(handle.model) == 0


def test_block_hooks_are_removed_after_an_exception():
    handle = tiny_handle("cls")
    before = hook_count(handle.model)
    with pytest.raises(RuntimeError, match="inside"), recording_blocks(handle, [0, 1]):
        assert hook_count(handle.model) == before + 2
        raise RuntimeError("inside")
    assert hook_count(handle.model) == before


def test_which_results_keep_every_blocks_tokens():
    assert keeps_block_tokens(12, 196, 192)  # DeiT-Ti at 224 px: 0.9 MB
    assert keeps_block_tokens(12, 196, 768)  # ViT-B/16 at 224 px: 3.6 MB
    assert not keeps_block_tokens(24, 37 * 37, 1024)  # DINOv2-L/14 at 518 px: 67 MB


@pytest.mark.parametrize("kind", sorted(TINY_TIMM))
def test_concepts_of_every_layout(kind):
    handle, result = tiny_result(kind)
    layout = result.layout
    concepts = image_concepts(handle, result, k=3, layer=0)
    assert concepts.heatmaps.shape == (3, layout.grid_h, layout.grid_w) and (concepts.heatmaps >= 0).all()
    assert concepts.embeddings.shape == (3, handle.embed_dim) and concepts.layer == 0
    assert concepts.areas.sum() == pytest.approx(1.0)
    assert concepts.target == result.target
    class_logits = concepts.class_logits()
    assert (np.diff(class_logits) <= 0).all()  # ordered by their logit for the class, highest first
    # the head reads each embedding as if it were every token it reads: a sequence of copies through norm + head
    model = handle.model
    copies = torch.as_tensor(concepts.embeddings)[:, None].expand(-1, layout.num_tokens, -1)
    with torch.no_grad():
        expected = model.forward_head(model.norm(copies)).numpy()
    np.testing.assert_allclose(concepts.logits, expected, rtol=1e-5, atol=1e-5)
    probs = concepts.class_probabilities()
    np.testing.assert_allclose(probs, torch.softmax(torch.as_tensor(expected), -1).numpy()[:, result.target]
                               [np.argsort(-class_logits)], rtol=1e-5)


@pytest.mark.parametrize("distilled", [False, True])
def test_concepts_of_a_hugging_face_vit(distilled):
    from vit_inspect.core.hf_models import handle_from_hf

    handle = handle_from_hf(tiny_hf(distilled, seed=2), device="cpu")
    result = analyze_image(handle, noise(tuple(2 * s for s in handle.input_size)), relevance=False)
    for kept, plain in zip(result.block_tokens, forward_tokens(handle, result.rgb)):  # blocks return tuples
        np.testing.assert_allclose(kept, plain, rtol=2e-3, atol=2e-3)
    concepts = image_concepts(handle, result, k=2)
    assert concepts.logits.shape == (2, len(handle.labels)) and np.isfinite(concepts.logits).all()
    assert concepts.heatmaps.shape == (2, result.layout.grid_h, result.layout.grid_w)


def test_a_model_without_a_head_orders_its_concepts_by_area():
    from timm.models.vision_transformer import VisionTransformer

    from vit_inspect.core.timm_models import handle_from_timm

    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=0,
                              dynamic_img_size=True).eval()
    handle = handle_from_timm(model, device="cpu")
    result = analyze_image(handle, noise((64, 64)))
    concepts = image_concepts(handle, result, k=3)
    assert concepts.logits is None and concepts.target is None
    assert concepts.class_logits() is None and concepts.class_probabilities() is None
    assert (np.diff(concepts.areas) <= 0).all() and concepts.areas.sum() == pytest.approx(1.0)


def test_the_class_head_reads_a_class_token_concept_alone():
    handle, result = tiny_result("cls")
    concepts = image_concepts(handle, result, k=2, target=7)
    model = handle.model
    with torch.no_grad():
        expected = model.head(model.norm(torch.as_tensor(concepts.embeddings))).numpy()  # (k, C)
    np.testing.assert_allclose(concepts.logits, expected, rtol=1e-5, atol=1e-5)
    assert concepts.target == 7 and concepts.class_logits().tolist() == pytest.approx(sorted(expected[:, 7])[::-1])


def test_equals_pytorch_grad_cams_deep_feature_factorization():
    """The reference class on the same model and block, its activations the patch tokens on the grid and its
    `computation_on_concepts` the model's norm and head: matched heatmaps correlate at 0.95 or more, and the
    matched concepts' logits agree."""
    handle, result = tiny_result("reg4", seed=2)
    model, layout, k = handle.model, result.layout, 3

    def on_grid(tokens: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, D, grid_h, grid_w)
        return layout.to_grid(layout.patches(tokens, axis=1).transpose(1, 2))

    reference = DeepFeatureFactorization(model, model.blocks[-1], on_grid,
                                         computation_on_concepts=lambda c: model.head(model.norm(c)))
    pixels = handle.preprocess.normalize(result.rgb)
    try:
        _, explanations, outputs = reference(pixels, k)
    finally:
        reference.activations_and_grads.release()
    ours = image_concepts(handle, result, k=k)
    height, width = result.rgb.shape[:2]
    theirs = explanations[0].reshape(k, -1)  # (k, H * W) scaled to [0, 1] and resized, as the reference shows them
    mine = scale_cam_image(ours.heatmaps, (width, height)).reshape(k, -1)
    corr = np.corrcoef(mine, theirs)[:k, k:]
    rows, cols = linear_sum_assignment(-corr)
    assert corr[rows, cols].min() >= 0.95
    np.testing.assert_allclose(ours.logits[rows], outputs[cols], rtol=0.05, atol=0.05)


def test_a_target_that_is_no_class_of_the_head_reads_the_top_class():
    """A pass that explained a text prompt has its column of the zero-shot head as target, after the classes."""
    handle, result = tiny_result("cls")
    prompt_column = dataclasses.replace(result, target=10)  # the tiny head has classes 0 to 9
    assert image_concepts(handle, prompt_column, k=2).target == int(np.argmax(result.probs))
    assert image_concepts(handle, prompt_column, k=2, target=4).target == 4


@pytest.mark.parametrize("call, message", [
    (lambda h, r: image_concepts(h, r, k=0), "from 1 to 16"),  # at most the 16 patches of the 4x4 grid
    (lambda h, r: image_concepts(h, r, k=17), "from 1 to 16"),
    (lambda h, r: image_concepts(h, r, k=True), "from 1 to 16"),
    (lambda h, r: image_concepts(h, r, k=2, layer=2), "blocks 0 to 1"),
    (lambda h, r: image_concepts(h, r, k=2, layer="1"), "blocks 0 to 1"),
    (lambda h, r: image_concepts(h, r, k=2, target=10), "classes 0 to 9"),
    (lambda h, r: image_concepts(h, r, k=2, seed=-1), "seed"),
    (lambda h, r: patch_similarity(h, r, (4, 0)), "4x4 patch grid"),
    (lambda h, r: patch_similarity(h, r, "ab"), "4x4 patch grid"),
    (lambda h, r: patch_similarity(h, r, (0, 0), layer=-3), "blocks 0 to 1"),
])
def test_out_of_range_inputs_are_sentences(call, message):
    handle, result = tiny_result("cls")
    with pytest.raises(InputError, match=message):
        call(handle, result)


def test_a_result_of_another_model_is_refused():
    _, result = tiny_result("cls")
    with pytest.raises(InputError, match="not of"):
        image_concepts(tiny_handle("gap"), result)


def test_patch_similarity_in_its_own_image_and_another():
    handle, result = tiny_result("cls")
    other = analyze_image(handle, noise((48, 32), seed=5), input_size=(48, 32), relevance=False)  # a 6x4 grid
    own, theirs = patch_similarity(handle, result, (1, 2), layer=0, other=other)
    assert own.shape == (4, 4) and theirs.shape == (6, 4)
    assert own[1, 2] == pytest.approx(1.0)
    query = result.block_tokens[0][1 * 4 + 2].astype(np.float64)
    np.testing.assert_allclose(theirs.ravel(), cosine_similarity(query, other.block_tokens[0]))
    alone, none = patch_similarity(handle, result, (1, 2), layer=0)
    np.testing.assert_array_equal(alone, own)
    assert none is None


@pytest.mark.slow
def test_real_deit_has_a_concept_of_the_cats_eyes(deit):
    """chelsea.png is a close-up of a cat's face: the whole crop is the cat, and in the middle blocks one of four
    concepts holds the two eyes (its 8 strongest patches all lie on them)."""
    result = analyze_image(deit, PHOTOS / "chelsea.png", gradients=False, relevance=False)
    eyes = np.zeros((result.layout.grid_h, result.layout.grid_w), bool)  # 14 x 14
    eyes[3:8, 2:7] = True  # the left eye, rows 3-7 and columns 2-6 of the crop's patch grid
    eyes[4:8, 10:14] = True  # the right eye
    for layer in (2, 5, 8):
        concepts = image_concepts(deit, result, k=4, layer=layer)
        on_eyes = [eyes.ravel()[np.argsort(-h.ravel())[:8]].sum() for h in concepts.heatmaps]
        assert max(on_eyes) == 8, (layer, on_eyes)
    assert deit.label(concepts.target).split(",")[0] in {"Egyptian cat", "tabby", "tiger cat"}


@pytest.mark.slow
def test_real_deit_equals_pytorch_grad_cams_dff_at_the_last_block(deit):
    result = analyze_image(deit, PHOTOS / "chelsea.png", gradients=False, relevance=False)
    layout, model, k = result.layout, deit.model, 5
    reference = DeepFeatureFactorization(
        model, model.blocks[-1], lambda x: layout.to_grid(layout.patches(x, axis=1).transpose(1, 2)))
    try:
        _, explanations = reference(deit.preprocess.normalize(result.rgb), k)
    finally:
        reference.activations_and_grads.release()
    ours = scale_cam_image(image_concepts(deit, result, k=k).heatmaps, (224, 224)).reshape(k, -1)
    corr = np.corrcoef(ours, explanations[0].reshape(k, -1))[:k, k:]
    rows, cols = linear_sum_assignment(-corr)
    assert corr[rows, cols].min() >= 0.95
