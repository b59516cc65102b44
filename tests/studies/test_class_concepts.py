"""Concepts of a class (CRAFT) on tiny random ViTs: the rebuilt tokens and the logit drop against a forward of the
whole model with block l's output replaced, the importance against craft-xai's `Craft` on the same activations,
galleries and heatmaps, and sentences for out-of-range inputs."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.stats import spearmanr
from support import tiny_handle
from support.craft import import_craft

from vit_inspect.analysis.craft import concept_coefficients
from vit_inspect.core.errors import Cancelled, InputError
from vit_inspect.studies.class_concepts import (
    GALLERY,
    GALLERY_SIDE,
    class_concept_heatmaps,
    class_concepts,
    random_crops,
)

Craft = import_craft("craft.craft_torch").Craft

TARGET = 3


def noise_images(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(count)]


@pytest.fixture(scope="module", params=[True, False], ids=["residual kept", "rebuilt from the concepts alone"])
def found(request):
    handle = tiny_handle("cls", seed=1)
    images = noise_images(6)
    return handle, images, class_concepts(handle, images, TARGET, k=4, crops=5, seed=3, residual=request.param)


def whole_model_logit(handle, image, layer: int, patch_tokens: np.ndarray) -> float:
    """The class logit of the whole model's forward with block ``layer``'s patch tokens replaced (a hook)."""
    pixels, _ = handle.preprocess.apply(image)
    layout = handle.layout()

    def replace(module, args, output):
        prefix, _ = layout.split(output, axis=1)
        return layout.join(prefix, torch.as_tensor(patch_tokens, dtype=output.dtype)[None], axis=1)

    hook = handle.blocks[layer].register_forward_hook(replace)
    try:
        with torch.no_grad():
            return float(handle.forward(pixels)[0, TARGET])
    finally:
        hook.remove()


def image_tokens(handle, image, layer: int) -> np.ndarray:
    seen = {}
    hook = handle.blocks[layer].register_forward_hook(lambda m, a, o: seen.update(x=o))
    try:
        with torch.no_grad():
            handle.forward(handle.preprocess.apply(image)[0])
    finally:
        hook.remove()
    return handle.layout().patches(seen["x"][0], axis=0).numpy()  # (P, D)


def test_shapes_order_and_galleries(found):
    handle, images, concepts = found
    assert concepts.layer == 0 and concepts.k == 4 and concepts.target == TARGET  # a class-token head: block 0 of 2
    assert concepts.bank.shape == (4, handle.embed_dim) and (concepts.bank >= 0).all()
    assert (np.diff(concepts.importance) <= 0).all() and (concepts.importance >= 0).all()
    assert concepts.crop_coefficients.shape == (30, 4) and concepts.crop_boxes.shape == (30, 4)
    assert concepts.galleries.shape == (4, GALLERY, GALLERY_SIDE, GALLERY_SIDE, 3)
    assert concepts.explained == tuple(range(6)) and 0 < concepts.error < 1
    # each gallery's first crop is the crop of highest coefficient, cut from the image as the model saw it
    first = int(np.argmax(concepts.crop_coefficients[:, 0]))
    i, top, left, side = concepts.crop_boxes[first]
    rgb = handle.preprocess.apply(images[i])[1][top:top + side, left:left + side]
    expected = np.asarray(Image.fromarray(rgb).resize((GALLERY_SIDE, GALLERY_SIDE), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(concepts.galleries[0, 0], expected)


def test_the_logit_drop_is_a_forward_of_the_whole_model_without_the_concept(found):
    handle, images, concepts = found
    drops, rebuilt = [], []
    for image in images:
        tokens = image_tokens(handle, image, 0)
        u = concept_coefficients(np.maximum(tokens - concepts.offset, 0), concepts.bank)  # (P, k)
        rest = tokens - (u @ concepts.bank + concepts.offset) if concepts.residual else 0.0
        full = whole_model_logit(handle, image, 0, u @ concepts.bank + concepts.offset + rest)
        rebuilt.append(full)
        drops.append([full - whole_model_logit(handle, image, 0, np.delete(u, j, 1) @ np.delete(concepts.bank, j, 0)
                                               + concepts.offset + rest) for j in range(concepts.k)])
    np.testing.assert_allclose(concepts.logit_drop, np.mean(drops, axis=0), atol=1e-4)
    assert concepts.logit_rebuilt == pytest.approx(np.mean(rebuilt), abs=1e-4)
    if concepts.residual:  # every patch rebuilt with what the concepts leave out is the block's own output
        assert concepts.logit_rebuilt == pytest.approx(concepts.logit_model, abs=1e-4)
    else:
        assert abs(concepts.logit_rebuilt - concepts.logit_model) > 1e-3


def test_importance_ranks_equal_craft_xais_on_the_same_activations(found):
    """craft-xai's `Craft` fitted on our crops (its patch size the model's input, so each crop is one patch of
    itself), its g the block's shifted patch tokens on the grid and its h the rest of the model on them; with the
    residual kept, h adds each patch's residual (what the concepts leave out of the image's own tokens) to what
    the reference rebuilds."""
    handle, images, concepts = found
    layout, model = handle.layout(), handle.model
    offset = torch.as_tensor(concepts.offset)
    pixels = torch.cat([handle.preprocess.apply(image)[0] for image in images])

    def tokens_of(x):
        seen = {}
        hook = handle.blocks[0].register_forward_hook(lambda m, a, o: seen.update(x=o))
        try:
            handle.forward(x)
        finally:
            hook.remove()
        return seen["x"]

    def g(x):  # (B, 3, H, W) -> (B, D, grid_h, grid_w) non-negative
        shifted = (layout.patches(tokens_of(x), axis=1) - offset).clamp_min(0)
        return layout.to_grid(shifted.transpose(1, 2))

    importances = []
    for i in range(len(images)):
        with torch.no_grad():
            prefix, own = layout.split(tokens_of(pixels[i:i + 1]), axis=1)
        rest = 0.0
        if concepts.residual:
            u = torch.as_tensor(concept_coefficients((own[0] - offset).clamp_min(0).numpy(), concepts.bank),
                                dtype=torch.float32)
            rest = own - (u @ torch.as_tensor(concepts.bank) + offset)

        def h(a, prefix=prefix, rest=rest):  # (M, D, grid_h, grid_w) -> logits through block 1, norm and head
            patches = a.flatten(2).transpose(1, 2) + offset + rest
            x = model.blocks[1](layout.join(prefix.expand(len(a), -1, -1), patches, axis=1))
            return model.forward_head(model.norm(x))

        craft = Craft(g, h, number_of_concepts=4, patch_size=layout.input_size[0], device="cpu")
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the reference's copies of tensors, and its NMF's iteration limit
            craft.fit(random_crops(pixels, 5, seed=3)[0])
            importances.append(craft.estimate_importance(pixels[i:i + 1], class_id=TARGET))
    theirs = np.mean(importances, axis=0)
    # the same bank up to the order of its concepts
    order = [int(np.argmin(np.abs(craft.W - row).sum(1))) for row in concepts.bank]
    np.testing.assert_allclose(craft.W[order], concepts.bank, rtol=1e-3, atol=1e-4)
    assert spearmanr(theirs[order], concepts.importance)[0] >= 0.8
    # and close values: the reference's coefficients stop at scikit-learn's tolerance, ours run to convergence
    np.testing.assert_allclose(theirs[order], concepts.importance, rtol=0.1, atol=1e-3)


def test_heatmaps_on_an_image(found):
    handle, images, concepts = found
    maps = class_concept_heatmaps(handle, concepts, images[0])
    shifted = np.maximum(image_tokens(handle, images[0], 0) - concepts.offset, 0)
    expected = concept_coefficients(shifted, concepts.bank).T.reshape(4, 4, 4)
    assert maps.shape == (4, 4, 4) and (maps >= 0).all()
    np.testing.assert_allclose(maps, expected, rtol=1e-4, atol=1e-5)


def test_importance_over_some_of_the_images():
    handle = tiny_handle("gap", seed=1)  # a pooled head reads the patches: the last block is the default
    concepts = class_concepts(handle, noise_images(5), TARGET, k=2, crops=2, importance_images=2)
    assert concepts.layer == 1 and concepts.explained == (0, 4)


@pytest.mark.parametrize("options, message", [
    ({"images": []}, "number of images must be a whole number from 1 to 200"),
    ({"k": 0}, "number of concepts must be a whole number from 1 to 12"),  # 6 images x 2 crops
    ({"k": 21, "crops": 10}, "from 1 to 20"),
    ({"crops": 65}, "crops per image must be a whole number from 1 to 64"),
    ({"layer": 1}, "the head reads the class token alone"),
    ({"layer": 2}, "blocks 0 to 1"),
    ({"target": 10}, "classes 0 to 9"),
    ({"seed": -1}, "seed"),
    ({"importance_images": 0}, "images for the importance"),
])
def test_out_of_range_inputs_are_sentences(options, message):
    arguments = {"images": noise_images(6), "target": TARGET, "k": 2, "crops": 2} | options
    with pytest.raises(InputError, match=message):
        class_concepts(tiny_handle("cls", seed=1), **arguments)


def test_progress_counts_the_steps_and_a_cancel_stops_before_the_next():
    handle, images = tiny_handle("cls", seed=1), noise_images(4)
    seen = []
    class_concepts(handle, images, TARGET, k=2, crops=2, design=4, importance_images=3,
                   progress=lambda done, total: seen.append((done, total)))
    assert seen == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]  # the crops, then each of 3 images
    asked = []

    def cancelled() -> bool:
        asked.append(len(asked))
        return len(asked) == 2  # pressed while the crops' forwards ran

    with pytest.raises(Cancelled, match="after 1 of 4 steps"):
        class_concepts(handle, images, TARGET, k=2, crops=2, design=4, importance_images=3, cancelled=cancelled)
    assert len(asked) == 2
