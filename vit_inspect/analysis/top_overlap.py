"""Top-k intersection of two maps (Ghorbani, Abid & Zou 2019, "Interpretation of Neural Networks Is
Fragile", AAAI, Sec. 3 "Metrics for interpretation similarity").

    T(m)        = the k = ceil(f * P) cells of largest value of map m (P cells, f the fraction kept)
    overlap(a, b) = |T(a) ∩ T(b)| / k

Both sets have k cells, so the overlap is symmetric, in [0, 1]: 1 for the same top cells, 0 for disjoint
ones. Ties at the k-th value go to the earlier cell in row-major order, so two maps with the same tied
values pick the same cells. Only the order of each map matters: no normalisation is needed.
"""
from __future__ import annotations

import math

import numpy as np

TOP_FRACTION = 0.1  # share of cells counted as a map's "top" cells (10 %: 20 of DeiT-Ti's 196 patches)


def top_patches(grid_map: np.ndarray, fraction: float = TOP_FRACTION) -> np.ndarray:
    """Boolean mask of the k = ceil(fraction * cells) largest cells (ties: the earlier cell in row-major order)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    flat = np.asarray(grid_map).ravel()
    k = math.ceil(fraction * flat.size)
    order = np.argsort(-flat, kind="stable")[:k]
    mask = np.zeros(flat.size, dtype=bool)
    mask[order] = True
    return mask.reshape(np.shape(grid_map))


def top_overlap(a: np.ndarray, b: np.ndarray, fraction: float = TOP_FRACTION) -> float:
    """Share of map `a`'s top-`fraction` cells that are also among `b`'s: |T_a ∩ T_b| / k, in [0, 1]."""
    if np.shape(a) != np.shape(b):
        raise ValueError(f"maps of different shapes {np.shape(a)} and {np.shape(b)}")
    top_a, top_b = top_patches(a, fraction), top_patches(b, fraction)
    return float((top_a & top_b).sum() / top_a.sum())
