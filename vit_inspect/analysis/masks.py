"""Thresholded attention masks (Caron et al. 2021, DINO, `visualize_attention.py`)."""
from __future__ import annotations

import numpy as np


def mass_mask(values: np.ndarray, fraction: float) -> np.ndarray:
    """The smallest set of entries holding at least ``fraction`` of the total mass, as a boolean mask.

    DINO (Caron et al. 2021, Fig. 3 and its `visualize_attention.py`) keeps the patches whose attention,
    taken from the largest down, first adds up to ``fraction`` (e.g. 0.6) of the map's sum. ``values``
    is any non-negative array (e.g. (grid_h, grid_w) or (heads, grid_h, grid_w) with one mask per
    leading index when ``values.ndim == 3``); ``fraction`` in (0, 1]. Ties are broken by position
    (earlier entries first). An all-zero map keeps nothing. This equals DINO's formulation (sort
    ascending, normalise to sum 1, keep where the cumulative sum exceeds 1 - fraction), tested in
    tests/studies/test_compare.py. Used by the all-heads grid and the Compare tab's DINO view.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if np.any(values < 0):
        raise ValueError("mass_mask needs non-negative values (attention weights, probabilities)")
    if values.ndim == 3:
        return np.stack([mass_mask(v, fraction) for v in values])
    flat = values.astype(np.float64).ravel()
    total = flat.sum()
    keep = np.zeros(flat.shape, dtype=bool)
    if total <= 0:
        return keep.reshape(values.shape)
    order = np.argsort(-flat, kind="stable")  # largest first
    cumulative = np.cumsum(flat[order]) / total
    count = int(np.searchsorted(cumulative, fraction - 1e-12) + 1)  # first position reaching the fraction
    keep[order[:min(count, flat.size)]] = True
    return keep.reshape(values.shape)
