"""Maps with colour bars and captions, fixed colour ranges, threshold masks and the seen-region outline."""
from __future__ import annotations

import numpy as np

from vit_inspect import plotting


RGB = np.full((32, 48, 3), 128, np.uint8)
GRID = np.array([[0.0, 0.5, 1.0], [0.25, 0.75, 0.5]])  # (2, 3) map over a 32x48 crop: 16-pixel patches


def test_map_panel_keeps_the_crop_pixels_and_adds_a_bar_and_caption():
    panel = plotting.map_panel(RGB, GRID, "model · attention\nclass 83%", "attention weight", marker=(1, 2))
    assert panel.shape == (32 + 2 * plotting.CAPTION_LINE_PIXELS + 8, 48 + plotting.COLORBAR_PIXELS, 3)
    np.testing.assert_array_equal(panel[:32, :48], plotting.overlay(RGB, GRID, marker=(1, 2)))  # clicks map 1:1
    bar = panel[7:25, 48 + 8 + 5]  # the middle column of the colour bar inside its outline, top to bottom
    top, bottom = bar[0].astype(int), bar[-1].astype(int)
    assert top.sum() > bottom.sum()  # inferno: bright at the top (high values), dark at the bottom


def test_fixed_range_clips_and_shared_range_keeps_maps_comparable():
    own = plotting.overlay(RGB, GRID * 0.1)
    shared = plotting.overlay(RGB, GRID * 0.1, vmin=0.0, vmax=1.0)
    assert not np.array_equal(own, shared)  # 0..0.1 on a 0..1 scale stays dark
    np.testing.assert_array_equal(plotting.overlay(RGB, GRID, vmin=0.0, vmax=1.0), plotting.overlay(RGB, GRID))
    assert plotting.map_range(np.array([[-1.0, 2.0]]), relu=True) == (0.0, 2.0)


def test_mask_darkens_outside_patches_only():
    mask = np.array([[False, False, True], [False, False, False]])
    masked = plotting.overlay(RGB, GRID, mask=mask).astype(int)
    plain = plotting.overlay(RGB, GRID).astype(int)
    np.testing.assert_array_equal(masked[:16, 32:], plain[:16, 32:])  # patch (0, 2) kept
    assert (masked[16:, :] <= plain[16:, :]).all() and masked[16:, :].sum() < 0.5 * plain[16:, :].sum()


def test_outline_region_marks_the_seen_box():
    preview = np.full((50, 100, 3), 200, np.uint8)
    out = plotting.outline_region(preview, (50.0, 0.0, 150.0, 100.0), (200, 100))  # right half of a 200x100 upload
    assert out[25, 10].max() < 100  # outside: dimmed
    np.testing.assert_array_equal(out[25, 50], [200, 200, 200])  # inside: as uploaded
    assert tuple(out[25, 25]) == plotting.OUTLINE_COLOR  # the box's left edge, at x = 50 / 2
