"""SSIM of normalised maps (Wang et al. 2004): hand-computed windows and scikit-image's
`structural_similarity` with the same window, constants and data range."""
from __future__ import annotations

import numpy as np
import pytest

from vit_inspect.analysis.ssim import K1, K2, normalise, ssim, window_side


def test_normalise_is_min_max_and_constant_maps_are_zero():
    np.testing.assert_allclose(normalise(np.array([[2.0, 4.0], [6.0, 10.0]])), [[0, 0.25], [0.5, 1.0]])
    np.testing.assert_array_equal(normalise(np.full((3, 3), 7.0)), np.zeros((3, 3)))


def test_window_side_fits_the_grid():
    assert window_side((14, 14)) == 7
    assert window_side((4, 6)) == 3 and window_side((6, 5)) == 5
    assert window_side((2, 9)) == 0


def test_one_window_by_hand():
    """A 3 x 3 map has one 3 x 3 window: SSIM is Eq. 13 of its nine normalised values."""
    a = np.array([[0.0, 1, 2], [3, 4, 5], [6, 7, 8]])  # normalised: v / 8
    b = np.array([[0.0, 0, 0], [0, 0, 0], [0, 0, 1]])  # normalised: itself
    x, y = a.ravel() / 8, b.ravel()
    mx, my = x.mean(), y.mean()  # 0.5 and 1/9
    vx = ((x - mx) ** 2).sum() / 8  # sample variances: 60 / 64 / 8
    vy = ((y - my) ** 2).sum() / 8
    cxy = ((x - mx) * (y - my)).sum() / 8
    c1, c2 = K1 ** 2, K2 ** 2
    expected = (2 * mx * my + c1) * (2 * cxy + c2) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2))
    assert ssim(a, b) == pytest.approx(expected, abs=1e-15)
    assert ssim(a, 5 * a + 3) == pytest.approx(1.0, abs=1e-15)  # equal after normalisation


def test_matches_scikit_image():
    metrics = pytest.importorskip("skimage.metrics")
    rng = np.random.default_rng(0)
    for shape in [(14, 14), (4, 4), (7, 9), (24, 24)]:
        a = rng.normal(size=shape)
        b = a + rng.normal(scale=0.7, size=shape)
        side = window_side(shape)
        expected = metrics.structural_similarity(normalise(a), normalise(b), win_size=side, data_range=1.0)
        assert ssim(a, b) == pytest.approx(expected, abs=1e-12), shape


def test_small_grids_and_bad_shapes():
    assert np.isnan(ssim(np.ones((2, 2)), np.eye(2)))
    with pytest.raises(ValueError, match="equally shaped"):
        ssim(np.ones((4, 4)), np.ones((4, 5)))
