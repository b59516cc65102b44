"""The Faithfulness tab: its handler on a tiny model (scoring, session cache, extra choices, marks),
the ranked table by hand, and the tab through the app's API on the real weights."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from support import REPO, tiny_handle

from vit_inspect.analysis.faithfulness import Curves
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.plots.faithfulness import SORTED_BY, paper_name, ranked_rows, verdict
from vit_inspect.studies.faithfulness import METHODS, faithfulness_methods

gr = pytest.importorskip("gradio")
from vit_inspect.ui.tabs.faithfulness import FaithfulnessTab, chosen_maps  # noqa: E402


def constant(pos: float, neg: float, deletion: float, insertion: float) -> Curves:
    return Curves(pos=np.full(10, pos), neg=np.full(10, neg), deletion=np.full(11, deletion),
                  insertion=np.full(11, insertion))


def test_ranked_rows_best_first_by_mean_rank_with_paper_names_and_marks():
    rows = ranked_rows({"random": constant(0.6, 0.6, 0.4, 0.45), "chefer": constant(0.2, 0.8, 0.1, 0.6),
                        "bad": constant(0.7, 0.4, 0.5, 0.5)})
    assert [r[0] for r in rows] == ["gradient-weighted attention (Chefer et al. 2021)", "random map (the floor)", "bad"]
    assert rows[0][1:] == ["1.00", "18.0", "72.0", "0.100", "0.600", "better on 4 of 4"]  # pos/neg AUC 90·c
    assert rows[1][1] == "2.25" and rows[1][-1] == "the floor"  # 2nd, 2nd, 2nd, 3rd
    assert rows[2][1:] == ["2.75", "63.0 ⚠", "36.0 ⚠", "0.500 ⚠", "0.500", "⚠ better on 1 of 4"]  # ins .5 > .45
    assert "mean rank" in SORTED_BY
    tied = ranked_rows({"random": constant(0.6, 0.6, 0.4, 0.45), "even": constant(0.6, 0.6, 0.3, 0.45)})
    assert dict((row[0], row[-1]) for row in tied)["even"] == "better on 1 of 4"  # a tie is no win
    assert ranked_rows({"chefer": constant(0.2, 0.8, 0.1, 0.6)})[0][-1] == "random map not scored"


def test_one_line_verdicts_name_the_place_and_the_random_floor():
    curves = {"random": constant(0.6, 0.6, 0.4, 0.45), "chefer": constant(0.2, 0.8, 0.1, 0.6),
              "bad": constant(0.7, 0.4, 0.5, 0.5)}
    assert verdict(curves, "chefer") == ("Faithfulness: 1st of 3 maps scored (mean rank 1.00); better than the "
                                         "random map on 4 of 4 scores.")
    assert verdict(curves, "bad").endswith("on 1 of 4 scores ⚠.")
    assert verdict(curves, "random") == "Faithfulness: 2nd of 3 maps scored (mean rank 2.25)."


def test_line_styles_tell_methods_apart_without_colour():
    from vit_inspect.plots.faithfulness import OKABE_ITO, method_styles

    methods = ["random", "attention", "rollout", "gradcam", "gradcam_relu", "chefer", "legrad", "attnlrp"]
    styles = method_styles(methods)
    assert styles["random"] == ((0, 0, 0), (6, 4))
    assert all(colour in OKABE_ITO for m, (colour, _) in styles.items() if m != "random")
    assert len(set(styles.values())) == len(methods)  # no two alike
    patterns = [pattern for m, (_, pattern) in styles.items() if m != "random"]
    assert len(set(patterns)) == 4  # solid, dashed, dotted, dash-dot


def test_curves_panel_draws_each_curve_through_its_points_in_its_colour():
    """Each curve a line through (left + f x (plot_w - 1), bottom - p / highest x (plot_h - 1)) of its panel,
    highest = 1.05 x the panel's largest point; the random map dashed black; a legend sample per method."""
    from vit_inspect.plots.canvas import CAPTION_LINE_PIXELS, MOSAIC_GAP
    from vit_inspect.plots.faithfulness import (
        CURVE_PLOT_PIXELS,
        LEGEND_LINE_PIXELS,
        OKABE_ITO,
        curves_panel,
        method_colours,
    )

    fractions = np.linspace(0.0, 1.0, 11)
    falling = Curves(pos=np.ones(10), neg=np.ones(10), deletion=0.8 * (1 - fractions), insertion=0.8 * fractions)
    picture = curves_panel({"a": falling, "random": constant(1, 1, 0.4, 0.2)}, "title")
    band = CAPTION_LINE_PIXELS + 8  # one line: the whole title, then each plot's own
    plot_w, plot_h = CURVE_PLOT_PIXELS
    colours = method_colours(["a", "random"])
    assert colours == {"a": OKABE_ITO[0], "random": (0, 0, 0)}  # Okabe-Ito's orange, solid; black
    highest = 1.05 * 0.8
    panel_w = (picture.shape[1] - MOSAIC_GAP) // 2
    left = 62  # the axes' left edge in each panel
    for offset, values in ((0, falling.deletion), (panel_w + MOSAIC_GAP, falling.insertion)):
        top = 2 * band + 8
        for f, value in zip(fractions, values):
            x = int(round(offset + left + f * (plot_w - 1)))
            y = int(round(top + plot_h - 1 - value / highest * (plot_h - 1)))
            near = picture[y - 1:y + 2, x - 1:x + 2].reshape(-1, 3)
            assert (near == colours["a"]).all(axis=1).any(), (offset, f)
        legend = top + plot_h - 1 + 46 + LEGEND_LINE_PIXELS  # the first method's sample line
        np.testing.assert_array_equal(picture[legend, offset + left + 12], colours["a"])
    y = int(round(2 * band + 8 + plot_h - 1 - 0.4 / highest * (plot_h - 1)))  # random's deletion, dashed
    drawn = (picture[y - 1:y + 2, left + 30:left + plot_w - 30] == 0).all(axis=-1).any(axis=0)
    assert 0.5 < drawn.mean() < 0.75  # 6 pixels drawn, 4 skipped, widened by the line's width
    with pytest.raises(ValueError, match="no curves"):
        curves_panel({}, "t")
    with pytest.raises(ValueError, match="11 finite"):
        curves_panel({"a": constant(1, 1, np.nan, 0.2)}, "t")


@dataclass(frozen=True)
class FakeSession:
    model: str
    result: object


class Progress:
    def __call__(self, *args, **kwargs) -> None:
        self.calls = getattr(self, "calls", 0) + 1


def test_handler_scores_caches_and_adds_choices():
    handle = tiny_handle("cls")
    rng = np.random.default_rng(0)
    from PIL import Image

    picture = Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
    session = FakeSession(model="tiny", result=analyze_image(handle, picture))
    forwards = []
    hook = handle.model.register_forward_pre_hook(lambda m, a: forwards.append(a[0].shape[0]))
    try:
        scored, image, rows, note = FaithfulnessTab._score(lambda key: handle, session, None, Progress(), {})
        first = sum(forwards)
        standard = list(faithfulness_methods())  # the built-ins, and the plugins installed
        assert set(standard) >= {"random", "attention", "rollout", "gradcam", "gradcam_relu", "chefer", "legrad",
                                 "attnlrp"}
        assert set(scored.curves) == set(standard)
        n = len(standard)
        assert image.ndim == 3 and len(rows) == n and f"Scored {n} maps" in note and "Left out" not in note
        # same image and class, Grad-CAM block 0 chosen: only that map is new
        forwards.clear()
        scored2, _, rows2, _ = FaithfulnessTab._score(lambda key: handle, session, scored, Progress(),
                                                      {"gradcam_layer": 0})
        assert "Grad-CAM, block 0 (signed)" in scored2.curves and len(rows2) == n + 1
        assert 0 < sum(forwards) < first  # only the new map's inputs (no clean/blur images again)
        assert scored2.curves["attnlrp"] is scored.curves["attnlrp"]
    finally:
        hook.remove()
    with pytest.raises(ValueError, match="Analyse an image first"):
        FaithfulnessTab._score(lambda key: handle, None, None, Progress(), {})


def test_chosen_maps_only_add_what_differs_from_the_defaults():
    handle = tiny_handle("cls")
    from PIL import Image

    result = analyze_image(handle, Image.new("RGB", (32, 32), (120, 30, 200)))
    defaults, failures = chosen_maps(result, np.random.default_rng(0), handle, layer=1, mean_heads=True,
                                     gradcam_layer=1, last_layer=1)
    assert list(defaults) == list(faithfulness_methods()) and failures == {}  # every scored method, plugins too
    extra, _ = chosen_maps(result, np.random.default_rng(0), layer=0, head=1, mean_heads=False, gradcam_layer=0,
                        head_fusion="max", discard_ratio=0.5, first_layer=0, last_layer=1)
    assert set(extra) - set(defaults) == {"Grad-CAM, block 0 (signed)",
                                          "attention rollout (max of heads), layers 0-1, discard 0.50",
                                          "raw attention, layer 0, head 1"}
    np.testing.assert_array_equal(extra["Grad-CAM, block 0 (signed)"], result.gradcam[0])
    # a backward range is swapped, as the Rollout tab swaps it, and named so
    backward, _ = chosen_maps(result, np.random.default_rng(0), layer=1, mean_heads=True, gradcam_layer=1,
                           first_layer=1, last_layer=0, head_fusion="max")
    assert "attention rollout (max of heads), layers 0-1 (From and To swapped), discard 0.00" in backward


@pytest.mark.slow
def test_tab_through_the_api_on_the_real_weights():
    from gradio_client import Client
    from support.app import Server, analyze

    server = Server()
    try:
        client = Client(server.url, verbose=False)
        analyze(client)
        figure, table, note, *verdicts = client.predict(api_name="/faithfulness")
        methods = [row[0] for row in table["data"]]
        # the 8 standard maps by their papers' names, plus the attention tab's own choice (head 0, not the mean)
        assert set(methods) == {paper_name(m) for m in METHODS} | {"raw attention, layer 11, head 0"}
        assert f"Scored {len(methods)} maps" in note
        assert methods.index(paper_name("attnlrp")) < methods.index(paper_name("random"))
        ranks = [float(row[1]) for row in table["data"]]
        assert ranks == sorted(ranks)  # sorted by the mean rank it shows
        # the first view's verdicts: its three maps' places among these
        for verdict_line, method in zip(verdicts, ("attention", "rollout", "chefer")):
            place = methods.index(paper_name(method)) + 1
            assert verdict_line.startswith(f"Faithfulness: {place}") and f"of {len(methods)} maps" in verdict_line
        assert (REPO / "app.py").is_file() and figure
    finally:
        server.demo.close()
