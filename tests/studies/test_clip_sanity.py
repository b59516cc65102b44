"""Sanity checks of a text prompt on a tiny random OpenCLIP model: every step's maps are the one-pass maps of the
prompt's similarity on the randomised vision tower, the random logit is a zero-shot label, the weights come back."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import PHOTOS
from support.clip import clip_handle

from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.images import load_image
from vit_inspect.core.open_clip_models import prompt_view
from vit_inspect.passes.pipeline import analyze_pixels
from vit_inspect.passes.randomise import cascade_order, fresh_weights, randomised
from vit_inspect.studies.faithfulness import standard_maps
from vit_inspect.studies.robustness import RobustnessSettings, infidelity
from vit_inspect.studies.sanity import SanitySettings, random_class, sanity_check, similarity

pytest.importorskip("open_clip")

PROMPT = "a photo of a cat"
METHODS = ("attention", "rollout", "gradcam", "chefer")


def test_a_prompt_is_checked_on_its_similarity_at_every_step():
    handle = clip_handle(seed=8)
    state = {k: v.detach().clone() for k, v in handle.model.state_dict().items()}
    picture = load_image(PHOTOS / "chelsea.png")
    result = sanity_check(handle, picture, METHODS, target=PROMPT, settings=SanitySettings(robustness=None))
    view, column, _, _, _ = prompt_view(handle, PROMPT)
    assert (result.target, result.prompt) == (column, PROMPT) and column == len(handle.labels)
    assert result.record()["prompt"] == PROMPT and result.record()["target"] == column
    # the random logit: a zero-shot label, drawn as `random_class` draws among all of them
    assert 0 <= result.random_class < len(handle.labels)
    pixels, _ = handle.preprocess.apply(picture)
    trained = analyze_pixels(view, pixels, target=column)
    assert trained.score == "cosine"  # the prompt's similarity is what every gradient map explains
    expected = standard_maps(trained, METHODS, np.random.default_rng(0))
    for name in METHODS:
        np.testing.assert_array_equal(result.maps[name][0], expected[name])
    fresh = fresh_weights(view, 0)
    order = cascade_order(view.depth)
    for step in range(1, len(result.steps)):
        with randomised(view, order[:step], fresh):
            expected = standard_maps(analyze_pixels(view, pixels, target=column), METHODS, np.random.default_rng(0))
        for name in METHODS:
            np.testing.assert_array_equal(result.maps[name][step], expected[name])
    other = standard_maps(analyze_pixels(view, pixels, target=result.random_class), METHODS,
                          np.random.default_rng(0))
    assert result.random_logit["gradcam"] == similarity(result.maps["gradcam"][0], other["gradcam"])
    assert all(torch.equal(v, state[k]) for k, v in handle.model.state_dict().items())


def test_a_prompt_s_random_logit_is_any_label_and_a_chosen_one_is_checked():
    drawn = {random_class(4, 3, seed) for seed in range(60)}  # a prompt's column is 3 after labels 0, 1, 2
    assert drawn == {0, 1, 2}
    handle = clip_handle(seed=8)
    picture = load_image(PHOTOS / "chelsea.png")
    settings = SanitySettings(random_class=1, independent=False, robustness=None)
    result = sanity_check(handle, picture, ("gradcam",), target=PROMPT, settings=settings)
    assert result.random_class == 1 and result.independent["gradcam"] == ()
    with pytest.raises(VitInspectError, match="another class"):
        sanity_check(handle, picture, ("gradcam",), target=PROMPT,
                     settings=SanitySettings(random_class=len(handle.labels), robustness=None))


def test_robustness_of_a_prompt_s_maps_scores_its_column():
    handle = clip_handle(seed=8)
    picture = load_image(PHOTOS / "chelsea.png")
    robust = RobustnessSettings(sensitivity_samples=2, infidelity_samples=8)
    result = sanity_check(handle, picture, ("gradcam",), target=PROMPT,
                          settings=SanitySettings(independent=False, random_logit=False, robustness=robust))
    view, column, _, _, _ = prompt_view(handle, PROMPT)
    pixels, _ = handle.preprocess.apply(picture)
    # infidelity perturbs the image and reads the prompt's zero-shot logit (captum's normalize=True fits the
    # map's scale, so the cosine's units do not matter), the same as computed here on the view by hand
    expected = infidelity(view, pixels, column, {"gradcam": result.maps["gradcam"][0]}, view.layout(), robust)
    assert result.infidelity["gradcam"] == pytest.approx(expected["gradcam"], rel=1e-6)
    assert np.isfinite(result.max_sensitivity["gradcam"]) and result.max_sensitivity["gradcam"] >= 0
