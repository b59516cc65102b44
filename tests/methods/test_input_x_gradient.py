"""The example plugin (examples/plugin_input_x_gradient, installed with pip): Input × Gradient by hand on a
linear model, against captum's `InputXGradient`, and present in every consumer the registry feeds."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from support import PHOTOS, run_cli, tiny_handle

import vit_inspect as vi
from vit_inspect.methods import MethodContext, compute_map, get, methods
from vit_inspect.passes.pipeline import analyze_pixels
from vit_inspect.studies.faithfulness import evaluate_image
from vit_inspect.studies.sanity import SanitySettings, sanity_check

NAME = "input_x_gradient"


@pytest.fixture(scope="module")
def plugin():
    if NAME not in methods() and os.environ.get("VIT_INSPECT_REQUIRE_PLUGIN") != "1":
        pytest.skip("the example plugin is not installed: pip install --no-deps --no-build-isolation "
                    "-e examples/plugin_input_x_gradient")
    return get(NAME)


def test_stated_cost_and_defaults(plugin):
    assert (plugin.reads, plugin.forwards, plugin.backwards) == ("own passes", 1, 1)
    assert plugin.cost() == "1 forward + 1 backward of its own per map"
    assert plugin.signed and not plugin.relu and plugin.faithfulness and plugin.sanity and plugin.record


def test_hand_computed_on_a_linear_model(plugin):
    """logit_c = sum(w_c ⊙ x): ∂logit_3/∂x = w_3, so the map is x ⊙ w_3 summed over channels and each patch.
    x = 2 everywhere, w_3[c, i, j] = 4 i + j on a 4 x 4 input in 2 x 2 patches: a pixel gives 3 · 2 · (4i + j),
    the patches (0,0): 6 · (0+1+4+5) = 60, (0,1): 6 · (2+3+6+7) = 108, (1,0): 6 · 42 = 252, (1,1): 6 · 50 = 300;
    with contrast class 1 (w_1 = 1 everywhere) each patch loses 2 · 3 · 4 = 24."""
    weights = torch.ones(10, 3, 4, 4)
    weights[3] = (4 * torch.arange(4.0)[:, None] + torch.arange(4.0)[None, :]).expand(3, 4, 4)
    handle = SimpleNamespace(device=torch.device("cpu"),
                             forward=lambda x: torch.einsum("bchw,kchw->bk", x, weights))
    layout = SimpleNamespace(grid_h=2, grid_w=2, patch_h=2, patch_w=2)
    pixels = torch.full((1, 3, 4, 4), 2.0)
    result = SimpleNamespace(layout=layout, target=3, contrast=None)
    np.testing.assert_array_equal(plugin.compute(MethodContext(result, handle, pixels)), [[60, 108], [252, 300]])
    contrasted = SimpleNamespace(layout=layout, target=3, contrast=1)
    np.testing.assert_array_equal(plugin.compute(MethodContext(contrasted, handle, pixels)),
                                  [[36, 84], [228, 276]])
    assert plugin.compute(MethodContext(SimpleNamespace(layout=layout, target=None, contrast=None), handle,
                                        pixels)) is None


def test_equals_captum_input_x_gradient(plugin):
    from captum.attr import InputXGradient

    handle = tiny_handle("nonsquare")  # 32 x 48 pixels, 8 x 8 patches: a 4 x 6 grid
    pixels = handle.preprocess.normalize(np.random.default_rng(1).integers(0, 256, (32, 48, 3), dtype=np.uint8))
    result = analyze_pixels(handle, pixels, target=7, relevance=False)
    ours = compute_map(plugin, MethodContext(result, handle))  # the input rebuilt from the crop the pass saw
    theirs = InputXGradient(handle.forward).attribute(pixels.clone().requires_grad_(True), target=7)  # (1, 3, H, W)
    pooled = theirs.detach()[0].sum(0).reshape(4, 8, 6, 8).sum(dim=(1, 3)).double().numpy()  # (4, 6)
    assert ours.shape == (4, 6)
    np.testing.assert_allclose(ours, pooled, rtol=1e-5, atol=1e-7)


def test_in_the_record_the_figure_and_the_studies(plugin, tmp_path):
    handle = tiny_handle("cls")
    picture = tmp_path / "noise.png"
    from PIL import Image

    Image.fromarray(np.random.default_rng(2).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(picture)
    analysis = vi.analyze(picture, model=handle, target=3)
    expected = compute_map(plugin, MethodContext(analysis.result, handle))
    record = analysis.record()
    np.testing.assert_allclose(record[NAME], np.round(expected, 6), atol=1e-6)
    assert "left_out" not in record
    figure = analysis.show(NAME)
    assert [ax.get_title() for ax in figure.axes if ax.images][0] == NAME
    faithfulness = evaluate_image(handle, picture, label=3, methods=("random", NAME), target=3)
    assert list(faithfulness.curves) == ["random", NAME] and faithfulness.failures == {}
    sanity = sanity_check(handle, picture, (NAME,), target=3, settings=SanitySettings(independent=False,
                                                                                      robustness=None))
    assert sanity.cascading[NAME][0].spearman == pytest.approx(1.0) and sanity.failures == {}
    np.testing.assert_allclose(sanity.maps[NAME][0], expected)


def test_in_the_commands(plugin, capsys, tmp_path, deit_weights_args):
    code, out, _ = run_cli(capsys, "methods", "--json")
    assert code == 0 and json.loads(out)["methods"][NAME]["cost"] == "1 forward + 1 backward of its own per map"
    code, out, _ = run_cli(capsys, "analyze", str(PHOTOS / "chelsea.png"), "--no-relevance", *deit_weights_args)
    record = json.loads(out)
    assert code == 0 and np.asarray(record[NAME]).shape == (14, 14) and "left_out" not in record
    code, out, _ = run_cli(capsys, "sanity", str(PHOTOS / "chelsea.png"), "--methods", f"gradcam,{NAME}", "--json",
                           "--no-independent", "--no-robustness", *deit_weights_args)
    record = json.loads(out)
    assert code == 0 and list(record["methods"]) == ["gradcam", NAME] and record["left_out"] == {}
    assert record["methods"][NAME]["cascading"][0]["spearman"] == 1.0
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "chelsea.png").write_bytes((PHOTOS / "chelsea.png").read_bytes())
    (tmp_path / "labels.csv").write_text("filename,class_index\nchelsea.png,285\n")
    code, out, _ = run_cli(capsys, "evaluate", str(tmp_path / "photos"), "--labels", str(tmp_path / "labels.csv"),
                           "--methods", f"random,{NAME}", *deit_weights_args)
    rows = [line.split(" | ")[0].strip("| ") for line in out.splitlines() if line.startswith("| ")][2:]
    assert code == 0 and sorted(rows) == [NAME, "random"]


def test_in_the_app(plugin, monkeypatch):
    """The All maps view (after its toggle: the plugin runs passes of its own), the Faithfulness tab's table and
    the app's sanity checks, on a tiny random ViT."""
    pytest.importorskip("gradio")
    from support.all_maps import CONTROLS, drawn, session_of

    from vit_inspect.ui import sanity as app_sanity
    from vit_inspect.ui.tabs.faithfulness import FaithfulnessTab

    inspector, handle, session = session_of()
    before = drawn(session, monkeypatch)
    assert NAME not in before["names"] and "1 forward + 1 backward of its own per map" in before["notes"][NAME]
    ticked, _ = inspector.set_relevance(session, True, progress=lambda *a, **k: None, **CONTROLS)
    after = drawn(ticked, monkeypatch)
    expected = compute_map(plugin, MethodContext(ticked.result, handle))
    np.testing.assert_array_equal(after["maps"][NAME], expected)
    assert after["units"][NAME] == plugin.unit and NAME not in after["notes"]
    scored, _, rows, note = FaithfulnessTab._score(lambda key: handle, ticked, None, lambda *a, **k: None, {})
    assert NAME in scored.curves and plugin.title in [row[0] for row in rows] and "Left out" not in note
    checks = app_sanity.checks_of_crop(handle, ticked.result.rgb, ticked.result.target)
    assert NAME in checks.cascading and checks.failures == {}
    assert plugin.title in [row[0] for row in app_sanity.table_rows(checks)]  # named by its title
