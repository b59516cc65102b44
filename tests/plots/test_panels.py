"""Maps with colour bars and captions, fixed colour ranges, threshold masks and the seen-region outline."""
from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from matplotlib import font_manager
from PIL import ImageFont

from vit_inspect.plots import canvas
from vit_inspect.plots import maps as map_plots

RGB = np.full((32, 48, 3), 128, np.uint8)
GRID = np.array([[0.0, 0.5, 1.0], [0.25, 0.75, 0.5]])  # (2, 3) map over a 32x48 crop: 16-pixel patches


def test_map_panel_keeps_the_crop_pixels_and_adds_a_bar_and_caption():
    panel = map_plots.map_panel(RGB, GRID, "model · attention\nclass 83%", "attention weight", marker=(1, 2))
    assert panel.shape == (32 + 2 * map_plots.CAPTION_LINE_PIXELS + 8, 48 + map_plots.COLORBAR_PIXELS, 3)
    np.testing.assert_array_equal(panel[:32, :48], map_plots.overlay(RGB, GRID, marker=(1, 2)))  # clicks map 1:1
    bar = panel[7:25, 48 + 8 + 5]  # the middle column of the colour bar inside its outline, top to bottom
    top, bottom = bar[0].astype(int), bar[-1].astype(int)
    assert top.sum() > bottom.sum()  # inferno: bright at the top (high values), dark at the bottom


def test_fixed_range_clips_and_shared_range_keeps_maps_comparable():
    own = map_plots.overlay(RGB, GRID * 0.1)
    shared = map_plots.overlay(RGB, GRID * 0.1, vmin=0.0, vmax=1.0)
    assert not np.array_equal(own, shared)  # 0..0.1 on a 0..1 scale stays dark
    np.testing.assert_array_equal(map_plots.overlay(RGB, GRID, vmin=0.0, vmax=1.0), map_plots.overlay(RGB, GRID))
    assert canvas.map_range(np.array([[-1.0, 2.0]]), relu=True) == (0.0, 2.0)


def test_mask_darkens_outside_patches_only():
    mask = np.array([[False, False, True], [False, False, False]])
    masked = map_plots.overlay(RGB, GRID, mask=mask).astype(int)
    plain = map_plots.overlay(RGB, GRID).astype(int)
    np.testing.assert_array_equal(masked[:16, 32:], plain[:16, 32:])  # patch (0, 2) kept
    assert (masked[16:, :] <= plain[16:, :]).all() and masked[16:, :].sum() < 0.5 * plain[16:, :].sum()


def test_outline_region_marks_the_seen_box():
    preview = np.full((50, 100, 3), 200, np.uint8)
    out = map_plots.outline_region(preview, (50.0, 0.0, 150.0, 100.0), (200, 100))  # right half of a 200x100 upload
    assert out[25, 10].max() < 100  # outside: dimmed
    np.testing.assert_array_equal(out[25, 50], [200, 200, 200])  # inside: as uploaded
    assert tuple(out[25, 25]) == map_plots.OUTLINE_COLOR  # the box's left edge, at x = 50 / 2


def _blend_per_pixel(rgb, grid_map, cmap, alpha, relu=False, vmin=None, vmax=None, mask=None):
    """`overlay` written out pixel by pixel with matplotlib's colormap call (the first release's code):
    what the lookup tables must reproduce byte for byte."""
    height, width = rgb.shape[:2]
    upsampled = canvas.upsample(canvas.normalized(grid_map, relu, vmin, vmax), height, width)
    blended = (1.0 - alpha) * (rgb / 255.0) + alpha * matplotlib.colormaps[cmap](upsampled)[..., :3]
    if mask is not None:
        rows = np.minimum(np.arange(height) * mask.shape[0] // height, mask.shape[0] - 1)
        cols = np.minimum(np.arange(width) * mask.shape[1] // width, mask.shape[1] - 1)
        blended = np.where(mask[rows][:, cols][..., None], blended, canvas.MASK_DIM * blended)
    return np.clip(np.rint(blended * 255.0), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("cmap", ["inferno", "viridis", "RdBu_r"])
@pytest.mark.parametrize("alpha", [0.55, 0.0, 1.0, 0.3])
def test_overlay_reads_the_per_pixel_blend_from_its_tables(cmap, alpha):
    rng = np.random.default_rng(7)
    rgb = rng.integers(0, 256, (45, 61, 3)).astype(np.uint8)  # every level, an odd size
    grid = rng.normal(size=(5, 7))
    grid[2, 3] = np.nan  # matplotlib's "bad" colour
    mask = rng.random((5, 7)) > 0.5
    for kwargs in ({}, {"relu": True}, {"vmin": -0.5, "vmax": 0.7}, {"mask": mask}):
        np.testing.assert_array_equal(map_plots.overlay(rgb, grid, cmap, alpha, **kwargs),
                                      _blend_per_pixel(rgb, grid, cmap, alpha, **kwargs))
    # matplotlib's index rule at the edges: exactly 1 is the last colour, not "over"
    index = canvas.color_index(np.array([0.0, 0.5, 1.0, np.nan, -0.1, 1.5], np.float32), 256)
    assert index.tolist() == [0, 128, 255, 258, 256, 257]


def test_panel_text_masks_are_kept_and_draw_the_same_pixels(monkeypatch):
    caption = "model · attention, layer 3, head 1\nclass 83%, discard 0.90 per row"
    font = canvas.font_of(canvas.TEXT)
    font._masks.clear()
    first = map_plots.map_panel(RGB, GRID, caption, "attention weight")
    kept = len(font._masks)
    assert kept == 4  # the caption's two lines, each wrapped in two to the panel's width (ticks and unit: SMALL_TEXT)
    again = map_plots.map_panel(RGB, GRID, caption, "attention weight")
    assert len(font._masks) == kept  # drawn from the kept masks
    np.testing.assert_array_equal(again, first)
    plain = {size: ImageFont.truetype(font_manager.findfont("DejaVu Sans"), size) for size in (canvas.SMALL_TEXT, canvas.TEXT)}
    for module in (canvas, map_plots):  # the caption's font, and the colour bar's
        monkeypatch.setattr(module, "font_of", plain.__getitem__)
    np.testing.assert_array_equal(map_plots.map_panel(RGB, GRID, caption, "attention weight"), first)


def test_kept_text_masks_are_bounded(monkeypatch):
    monkeypatch.setattr(canvas, "TEXT_MASKS", 3)
    font = canvas._RememberingFont(font_manager.findfont("DejaVu Sans"), 12)
    for word in ("a", "b", "c", "d", "b"):
        font.getmask2(word, "L")
    assert [key[0] for key in font._masks] == ["c", "d", "b"]  # "a" dropped first, "b" used last


def test_plot_axes_reach_below_zero_for_a_signed_score():
    """A prompt's similarity may be negative: the faithfulness curves' axis then starts below 0."""
    signed = canvas.plot_axes(0.3, [], "x", "cosine similarity", lowest=-0.1)
    assert signed.row(-0.1) == signed.bottom and signed.row(0.3) == signed.top
    assert signed.row(0.0) == pytest.approx(signed.bottom - 0.25 * (signed.height - 1))
    plain = canvas.plot_axes(0.5, [], "x", "probability")
    assert (plain.lowest, plain.row(0.0)) == (0.0, plain.bottom)
    from vit_inspect.analysis.faithfulness import Curves
    from vit_inspect.plots.faithfulness import curves_panel

    curve = np.linspace(-0.2, 0.1, 11)
    picture = curves_panel({"random": Curves(pos=curve[:10], neg=curve[:10], deletion=curve, insertion=curve)},
                           "prompt 'a cat'", "cosine similarity")
    assert picture.ndim == 3 and picture.dtype == np.uint8
