"""Sanity checks on tiny random models: a map of the input alone is flagged, a gradient map is not; every
step's maps are the one-pass maps of the randomised model; the weights come back; the random class;
max-sensitivity and infidelity equal their definitions computed by hand from the same draws."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from PIL import Image
from support import tiny_handle

from vit_inspect.core.errors import Cancelled, VitInspectError
from vit_inspect.passes.pipeline import analyze_pixels
from vit_inspect.passes.randomise import EMBEDDING, cascade_order, fresh_weights, randomised
from vit_inspect.studies.faithfulness import standard_maps
from vit_inspect.studies.robustness import (
    RobustnessSettings,
    captum_metric,
    infidelity,
    max_sensitivity,
    removal_draws,
)
from vit_inspect.studies.sanity import (
    SanitySettings,
    method_maps,
    random_class,
    sanity_check,
    similarity,
)

FAST = SanitySettings(robustness=None)


def _image(seed=0, size=(32, 32)):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8))


def edges(analysis):
    """A map of the input alone: the mean absolute vertical grey-level step inside each patch."""
    layout = analysis.layout
    grey = analysis.rgb.astype(np.float64).mean(-1)
    step = np.abs(np.diff(grey, axis=0, append=grey[-1:]))
    return step.reshape(layout.grid_h, layout.patch_h, layout.grid_w, layout.patch_w).mean(axis=(1, 3))


def _state(handle):
    return {k: v.detach().clone() for k, v in handle.model.state_dict().items()}


def test_similarity_of_a_map_with_itself_and_its_reverse():
    grid = np.arange(16.0).reshape(4, 4)
    same = similarity(grid, 3 * grid + 1)
    assert same.values() == (pytest.approx(1.0), pytest.approx(1.0), 1.0)
    reverse = similarity(grid, -grid)
    assert reverse.spearman == pytest.approx(-1.0) and reverse.top10_overlap == 0.0 and reverse.ssim < 0
    assert similarity(grid, np.zeros((4, 4))).as_dict()["spearman"] is None  # constant: undefined, JSON null


def test_an_input_map_is_flagged_and_a_gradient_map_is_not():
    handle = tiny_handle("cls")
    state = _state(handle)
    result = sanity_check(handle, _image(), methods=("gradcam", "chefer"), extra={"edges": edges}, settings=FAST)
    assert result.steps == (None, 1, 0, EMBEDDING)
    for name in ("edges",):
        assert all(s.values() == (1.0, 1.0, 1.0) for s in result.cascading[name])
        assert all(s.values() == (1.0, 1.0, 1.0) for s in result.independent[name])
        assert result.random_logit[name].values() == (1.0, 1.0, 1.0)
    assert result.cascading["gradcam"][0].values() == (1.0, 1.0, 1.0)  # step 0: the trained model itself
    assert result.cascading["gradcam"][-1].spearman < 0.5
    assert abs(result.random_logit["gradcam"].spearman) < 0.9
    verdict = result.passes_randomisation()
    assert verdict["edges"] is False and verdict["gradcam"] is True and verdict["chefer"] is True
    assert len(result.independent["gradcam"]) == handle.depth
    assert all(torch.equal(v, state[k]) for k, v in handle.model.state_dict().items())


def test_every_step_is_the_one_pass_maps_of_the_randomised_model():
    handle = tiny_handle("distilled")
    image = _image(1)
    methods = ("attention", "rollout", "gradcam", "chefer")  # legrad and attnlrp: the slow test below
    result = sanity_check(handle, image, methods=methods, settings=FAST)
    pixels, _ = handle.preprocess.apply(image)
    fresh = fresh_weights(handle, 0)
    order = cascade_order(handle.depth)
    for step in range(1, len(result.steps)):
        with randomised(handle, order[:step], fresh):
            expected = standard_maps(analyze_pixels(handle, pixels, target=result.target), methods,
                                     np.random.default_rng(0))
        for name in methods:
            np.testing.assert_array_equal(result.maps[name][step], expected[name])
            assert result.cascading[name][step] == similarity(result.maps[name][0], expected[name])
    with randomised(handle, [0], fresh):
        expected = standard_maps(analyze_pixels(handle, pixels, target=result.target), methods,
                                 np.random.default_rng(0))
    assert result.independent["chefer"][0] == similarity(result.maps["chefer"][0], expected["chefer"])
    other = standard_maps(analyze_pixels(handle, pixels, target=result.random_class), methods,
                          np.random.default_rng(0))
    assert result.random_logit["gradcam"] == similarity(result.maps["gradcam"][0], other["gradcam"])


def test_the_random_class_is_seeded_or_chosen():
    drawn = [random_class(10, 3, seed) for seed in range(40)]
    assert 3 not in drawn and set(drawn) == set(range(10)) - {3}  # uniform over the other nine
    assert random_class(10, 3, 5) == random_class(10, 3, 5)
    handle = tiny_handle("cls")
    result = sanity_check(handle, _image(), methods=("gradcam",), target=2,
                          settings=SanitySettings(random_class=7, independent=False, robustness=None))
    assert (result.target, result.random_class) == (2, 7) and result.independent["gradcam"] == ()
    with pytest.raises(VitInspectError, match="another class"):
        sanity_check(handle, _image(), methods=("gradcam",), target=2,
                     settings=SanitySettings(random_class=2, robustness=None))


def test_cancel_and_errors_leave_the_trained_weights():
    handle = tiny_handle("reg4")
    state = _state(handle)
    seen = []
    with pytest.raises(Cancelled, match="after 3 of"):
        sanity_check(handle, _image(), methods=("gradcam",), settings=FAST,
                     progress=lambda done, total: seen.append((done, total)), cancelled=lambda: len(seen) >= 3)
    assert seen == [(1, 7), (2, 7), (3, 7)]  # 1 trained + 3 cascading + 2 independent + 1 random logit
    assert all(torch.equal(v, state[k]) for k, v in handle.model.state_dict().items())

    def broken(analysis):
        if len(seen) > 4:
            raise RuntimeError("a map function failed")
        return edges(analysis)

    with pytest.raises(RuntimeError, match="failed"):
        sanity_check(handle, _image(), methods=("gradcam",), extra={"edges": broken}, settings=FAST,
                     progress=lambda done, total: seen.append(done))
    assert all(torch.equal(v, state[k]) for k, v in handle.model.state_dict().items())


def test_max_sensitivity_is_its_definition_and_shares_the_passes():
    handle = tiny_handle("cls")
    pixels, _ = handle.preprocess.apply(_image(2))
    methods = ("gradcam", "chefer")
    settings = RobustnessSettings(sensitivity_samples=5, batch_size=2, seed=4)
    passes = []

    def maps_of(row):
        passes.append(1)
        return method_maps(analyze_pixels(handle, row, target=1, relevance=False), methods)[0]

    clean = method_maps(analyze_pixels(handle, pixels, target=1, relevance=False), methods)[0]
    result = max_sensitivity(handle, pixels, clean, maps_of, settings)
    assert len(passes) == 5  # one pass per noisy input, for both methods
    generator = torch.Generator().manual_seed(4)
    std = torch.tensor(handle.preprocess.std).view(1, 3, 1, 1)
    noisy = [pixels + (torch.rand(pixels.shape, generator=generator) * 2 - 1) * (0.02 / std) for _ in range(5)]
    assert all((n - pixels).abs().mul(std).max() <= 0.02 + 1e-7 for n in noisy)  # inside the L∞ ball
    for name in methods:
        norms = [np.linalg.norm(maps_of(n)[name].astype(np.float32) - clean[name].astype(np.float32)) for n in noisy]
        assert result[name] == pytest.approx(max(norms) / np.linalg.norm(clean[name].astype(np.float32)), rel=1e-5)


def test_without_captum_the_robustness_metrics_name_an_install_that_works_from_a_clone(monkeypatch):
    monkeypatch.setitem(sys.modules, "captum", None)  # `import captum.metrics` raises ImportError
    monkeypatch.setitem(sys.modules, "captum.metrics", None)
    with pytest.raises(VitInspectError) as info:
        captum_metric("infidelity")
    assert str(info.value) == ("Max-sensitivity and infidelity need captum, which is not installed: "
                               "pip install -r requirements.txt (or leave the robustness metrics out).")


def test_infidelity_is_its_definition_with_the_optimal_scale():
    handle = tiny_handle("patch14")
    pixels, _ = handle.preprocess.apply(_image(3, (28, 28)))
    layout = handle.layout()
    settings = RobustnessSettings(infidelity_samples=12, batch_size=5, removal_probability=0.3)
    maps = {"a": np.array([[1.0, -2.0], [0.5, 3.0]]), "flat": np.ones((2, 2))}
    result = infidelity(handle, pixels, 4, maps, layout, settings)
    removed = removal_draws(layout.num_patches, settings)  # (12, 4)
    with torch.no_grad():
        clean = float(handle.forward(pixels)[0, 4])
        drops = []
        for mask in removed:
            x = pixels.clone()
            for p in np.flatnonzero(mask):
                r, c = divmod(int(p), layout.grid_w)
                x[..., r * 14:(r + 1) * 14, c * 14:(c + 1) * 14] = 0  # the mean colour
            drops.append(clean - float(handle.forward(x)[0, 4]))
    b = np.array(drops)
    for name, grid in maps.items():
        a = removed.astype(np.float64) @ grid.ravel()  # I^T Φ: the map summed over the removed patches
        expected = np.mean(b ** 2) - np.mean(a * b) ** 2 / np.mean(a ** 2)  # E[(βa - b)^2] at the best β
        assert result[name] == pytest.approx(expected, rel=1e-4, abs=1e-9)


@pytest.mark.slow
def test_robustness_inside_the_study_on_every_layout(tiny_kind):
    handle = tiny_handle(tiny_kind)
    size = handle.input_size
    result = sanity_check(handle, _image(5, size), methods=("gradcam", "rollout", "attnlrp"), extra={"edges": edges},
                          settings=SanitySettings(robustness=RobustnessSettings(sensitivity_samples=3,
                                                                                infidelity_samples=8)))
    assert {"gradcam", "rollout", "edges"} <= set(result.max_sensitivity) == set(result.infidelity)
    assert all(v >= 0 for v in result.max_sensitivity.values())
    assert result.max_sensitivity["edges"] < result.max_sensitivity["gradcam"]


def test_a_model_input_given_as_it_is_gives_the_same_checks():
    handle = tiny_handle("cls")
    image = _image(3)
    pixels, _ = handle.preprocess.apply(image)
    settings = SanitySettings(independent=False, robustness=RobustnessSettings(sensitivity_samples=2,
                                                                               infidelity_samples=4))
    from_image = sanity_check(handle, image, ("gradcam", "rollout"), settings=settings)
    from_pixels = sanity_check(handle, pixels, ("gradcam", "rollout"), settings=settings)
    assert from_pixels.record() == from_image.record()
