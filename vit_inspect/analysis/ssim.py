"""Structural similarity of two maps (Wang, Bovik, Sheikh & Simoncelli 2004, "Image Quality Assessment:
From Error Visibility to Structural Similarity", IEEE TIP 13(4)), as Adebayo et al. 2018 ("Sanity Checks for
Saliency Maps", Sec. 3) compare a map with its counterpart on a randomised model.

Both maps are first normalised to [0, 1] (`normalise`: min-max of the raw map; a constant map becomes all
zeros), so the dynamic range is L = 1. In every w x w window lying fully inside the map (Eq. 13):

    SSIM(x, y) = (2 mu_x mu_y + C1) (2 sigma_xy + C2) / ((mu_x^2 + mu_y^2 + C1) (sigma_x^2 + sigma_y^2 + C2))

with C1 = (K1 L)^2, C2 = (K2 L)^2, K1 = 0.01, K2 = 0.03 (Eq. 7, 9), mu the window means and sigma the window
(co)variances with the sample normalisation 1 / (w^2 - 1); the map's SSIM is the mean over the windows
(MSSIM, Eq. 17). The window is uniform, 7 x 7, or the largest odd size that fits a smaller grid: the
defaults of `skimage.metrics.structural_similarity`, which gives the same number (tests/analysis/test_ssim.py).
A grid smaller than 3 x 3 fits no window and gets NaN. 1 for equal normalised maps; it can be negative.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

K1, K2 = 0.01, 0.03  # Wang et al. 2004, Eq. 7 and 9
WINDOW = 7  # side of the uniform window (skimage's default)


def normalise(grid_map: np.ndarray) -> np.ndarray:
    """(m - min m) / (max m - min m) in float64; all zeros for a constant map."""
    m = np.asarray(grid_map, dtype=np.float64)
    span = float(m.max() - m.min())
    return (m - m.min()) / span if span > 0 else np.zeros_like(m)


def window_side(shape: tuple[int, int], window: int = WINDOW) -> int:
    """`window`, or the largest odd side that fits the shorter side of `shape`; 0 when below 3."""
    side = min(window, *shape)
    side -= 1 - side % 2  # odd
    return side if side >= 3 else 0


def ssim(a: np.ndarray, b: np.ndarray, window: int = WINDOW) -> float:
    """Mean SSIM of the normalised (`normalise`) 2-D maps `a` and `b` (see the module docstring); NaN for a
    grid too small for a 3 x 3 window."""
    if np.shape(a) != np.shape(b) or np.ndim(a) != 2:
        raise ValueError(f"ssim needs two equally shaped 2-D maps, got shapes {np.shape(a)} and {np.shape(b)}")
    side = window_side(np.shape(a), window)
    if not side:
        return float("nan")
    x, y = normalise(a), normalise(b)

    def local_mean(values: np.ndarray) -> np.ndarray:  # (H - side + 1, W - side + 1) window means
        return sliding_window_view(values, (side, side)).mean(axis=(-2, -1))

    mu_x, mu_y = local_mean(x), local_mean(y)
    sample = side * side / (side * side - 1.0)  # unbiased (co)variances
    var_x = sample * (local_mean(x * x) - mu_x * mu_x)
    var_y = sample * (local_mean(y * y) - mu_y * mu_y)
    cov = sample * (local_mean(x * y) - mu_x * mu_y)
    c1, c2 = K1 ** 2, K2 ** 2  # L = 1 after normalisation
    index = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x ** 2 + mu_y ** 2 + c1) * (var_x + var_y + c2))
    return float(index.mean())
