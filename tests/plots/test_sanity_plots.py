"""Sanity figures and panels: the cascading strip shows each step's map over the crop, the curves plot the
similarities."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from vit_inspect.plots.canvas import COLORBAR_PIXELS, MOSAIC_GAP
from vit_inspect.plots.faithfulness import method_styles
from vit_inspect.plots.maps import overlay
from vit_inspect.plots.sanity import (CELL_PIXELS, LABEL_PIXELS, cascading_figure, cascading_panel, labelled_steps,
                                      short_step_label, similarity_figure, similarity_panel, step_label)
from vit_inspect.studies.sanity import ImageSanity, Similarity, steps_of

GRAY = np.full((32, 32, 3), 128, dtype=np.uint8)


def _result(independent: bool = True) -> ImageSanity:
    steps = steps_of(2)  # None, 1, 0, embedding
    rng = np.random.default_rng(0)
    maps = {m: tuple(rng.normal(size=(4, 4)) for _ in steps) for m in ("gradcam", "rollout")}
    cascading = {m: tuple(Similarity(1.0 - 0.3 * i, 0.9 - 0.2 * i, 1.0 - 0.25 * i) for i in range(len(steps)))
                 for m in maps}
    return ImageSanity(target=1, random_class=2, steps=steps, cascading=cascading,
                       independent={m: (Similarity(0.5, 0.4, 0.3), Similarity(0.7, 0.6, 0.5)) if independent else ()
                                    for m in maps},
                       random_logit={m: Similarity(0.2, 0.1, 0.0) for m in maps}, maps=maps)


def test_step_labels():
    assert [step_label(s) for s in steps_of(2)] == ["trained", "from block 1", "from block 0", "+ embedding"]


def test_cascading_figure_shows_every_steps_map_over_the_crop():
    result = _result()
    fig = cascading_figure(GRAY, result, title="t")
    axes = np.array(fig.axes[:-1]).reshape(2, 5)
    bar = fig.axes[-1]  # the colour bar: each map's own range as 0..1
    assert bar.get_ylabel() == "each map min-max normalised" and bar.get_ylim() == (0.0, 1.0)
    assert [ax.get_title() for ax in axes[0]] == ["input", "trained", "from block 1", "from block 0", "+ embedding"]
    np.testing.assert_array_equal(axes[0, 0].images[0].get_array(), GRAY)
    for row, method in enumerate(result.maps):
        assert axes[row, 0].get_ylabel() == method
        for column, grid_map in enumerate(result.maps[method], start=1):
            np.testing.assert_array_equal(axes[row, column].images[0].get_array(), overlay(GRAY, grid_map, alpha=0.75))
    with pytest.raises(ValueError, match="no maps"):
        cascading_figure(GRAY, ImageSanity(0, None, (None,), {}, {}, {}, {}))


def test_similarity_figure_plots_the_values():
    result = _result()
    fig = similarity_figure(result)
    axes = fig.axes
    assert len(axes) == 6  # cascading and independent rows, three similarities
    spearman = axes[0]
    curves = [line for line in spearman.lines if len(line.get_xdata()) == 4]
    np.testing.assert_allclose(curves[0].get_ydata(), [s.spearman for s in result.cascading["gradcam"]])
    markers = [line for line in spearman.lines if line.get_marker() == "D"]
    assert [float(m.get_ydata()[0]) for m in markers] == [0.2, 0.2]  # the random logit, one per method
    assert any(list(line.get_ydata()) == [0.5, 0.5] for line in spearman.lines)  # the pass threshold
    independent = [line for line in axes[3].lines if len(line.get_xdata()) == 2]
    np.testing.assert_allclose(independent[0].get_ydata(), [0.5, 0.7])
    assert len(similarity_figure(_result(independent=False)).axes) == 3


def test_cascading_panel_draws_every_steps_map_over_the_scaled_crop():
    rgb = np.random.default_rng(1).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    result = _result()
    panel = cascading_panel(rgb, result, "a title")
    assert panel.dtype == np.uint8 and panel.ndim == 3
    title_band = panel.shape[0] - (20 + 2 * (CELL_PIXELS + 4))  # head row of 20 px, two methods, 4 px gaps
    assert title_band > 0 and (panel[:title_band] < 128).any()  # the title's text
    crop = np.asarray(Image.fromarray(rgb).resize((CELL_PIXELS, CELL_PIXELS), Image.BILINEAR))
    for row, method in enumerate(result.maps):
        top = title_band + 20 + row * (CELL_PIXELS + 4)
        np.testing.assert_array_equal(panel[top:top + CELL_PIXELS, LABEL_PIXELS:LABEL_PIXELS + CELL_PIXELS], crop)
        for column, grid_map in enumerate(result.maps[method], start=1):
            left = LABEL_PIXELS + column * (CELL_PIXELS + 4)
            np.testing.assert_array_equal(panel[top:top + CELL_PIXELS, left:left + CELL_PIXELS],
                                          overlay(crop, grid_map, alpha=0.75))
    bar = panel[title_band + 40, LABEL_PIXELS + 5 * (CELL_PIXELS + 4) + 8 + 6]  # inside the colour bar
    assert tuple(bar) != (255, 255, 255)
    with pytest.raises(ValueError, match="no maps"):
        cascading_panel(rgb, ImageSanity(0, None, (None,), {}, {}, {}, {}), "t")


def test_a_deep_models_strip_is_split_into_bands_that_fit_the_width():
    """12 blocks: 14 steps, two bands of 7 under 1000 pixels, each opening with the crop; every step's map drawn
    once, in order, at its own size (so its 12-pixel labels are shown at 12 pixels)."""
    rgb = np.random.default_rng(2).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    steps = steps_of(12)
    rng = np.random.default_rng(3)
    result = ImageSanity(target=1, random_class=2, steps=steps, cascading={}, independent={}, random_logit={},
                         maps={m: tuple(rng.normal(size=(4, 4)) for _ in steps) for m in ("gradcam", "rollout")})
    panel = cascading_panel(rgb, result, "a title", max_width=1000)
    assert panel.shape[1] <= 1000 and cascading_panel(rgb, result, "a title").shape[1] > 1000
    band_h = 20 + 2 * (CELL_PIXELS + 4)
    title_band = panel.shape[0] - (2 * band_h + MOSAIC_GAP)
    crop = np.asarray(Image.fromarray(rgb).resize((CELL_PIXELS, CELL_PIXELS), Image.BILINEAR))
    for band in range(2):
        for row, method in enumerate(result.maps):
            top = title_band + band * (band_h + MOSAIC_GAP) + 20 + row * (CELL_PIXELS + 4)
            np.testing.assert_array_equal(panel[top:top + CELL_PIXELS, LABEL_PIXELS:LABEL_PIXELS + CELL_PIXELS], crop)
            for column in range(1, 8):
                left = LABEL_PIXELS + column * (CELL_PIXELS + 4)
                np.testing.assert_array_equal(panel[top:top + CELL_PIXELS, left:left + CELL_PIXELS],
                                              overlay(crop, result.maps[method][band * 7 + column - 1], alpha=0.75))
    narrow = cascading_panel(rgb, result, "", max_width=LABEL_PIXELS + 2 * (CELL_PIXELS + 4) + COLORBAR_PIXELS)
    assert narrow.shape[0] == 14 * band_h + 13 * MOSAIC_GAP  # one step a band: still every step


def test_similarity_plots_wrap_to_the_width():
    result = _result()
    wide = similarity_panel(result, "a title")
    fitted = similarity_panel(result, "a title", max_width=1000)
    assert wide.shape[1] > 1000 >= fitted.shape[1] > 900  # two plots to a row, the third below
    assert fitted.shape[0] > wide.shape[0]
    one = similarity_panel(result, "a title", max_width=100)  # narrower than a plot: one to a row
    assert one.shape[1] < fitted.shape[1] and one.shape[0] > fitted.shape[0]


def test_similarity_panel_draws_each_method_in_its_colour():
    result = _result()
    styles = method_styles(list(result.cascading))
    panel = similarity_panel(result, "a title")
    colours = {tuple(c) for c in panel.reshape(-1, 3)}
    assert all(styles[m][0] in colours for m in result.cascading)
    nan = replace(result, cascading={m: (Similarity(1.0, 1.0, 1.0), *(Similarity(np.nan, 0.0, 0.0),) * 3)
                                     for m in result.cascading})
    assert similarity_panel(nan, "undefined steps are left out").shape[1] == panel.shape[1]
    assert short_step_label(None) == "trained" and short_step_label(3) == "from 3"
    assert short_step_label("embedding") == "+ emb."


def test_tick_labels_never_touch_and_name_both_ends():
    """14 steps (12 blocks), every 2nd label: 0, 2, ..., 10, then 13 in place of 12 (one slot before it)."""
    assert labelled_steps(14, 2) == [0, 2, 4, 6, 8, 10, 13]
    assert labelled_steps(13, 2) == [0, 2, 4, 6, 8, 10, 12]  # the last already on the grid
    assert labelled_steps(5, 1) == [0, 1, 2, 3, 4]
    assert labelled_steps(2, 2) == [0, 1] and labelled_steps(1, 2) == [0] and labelled_steps(0, 2) == []
