"""Top-k intersection (Ghorbani et al. 2019): hand-computed sets, ties, symmetry."""
from __future__ import annotations

import numpy as np
import pytest

from vit_inspect.analysis.top_overlap import top_overlap, top_patches


def test_top_overlap_by_hand():
    a = np.zeros((4, 5))
    b = np.zeros((4, 5))
    a.flat[[3, 7]] = [5.0, 4.0]  # k = ceil(0.1 * 20) = 2 top cells: 3 and 7
    b.flat[[3, 12]] = [1.0, 2.0]  # top cells 3 and 12
    assert top_patches(a).sum() == 2
    assert top_overlap(a, b) == 0.5 == top_overlap(b, a)
    b.flat[3] = 0.0
    b.flat[19] = 1.0  # top cells 12 and 19: disjoint from a's
    assert top_overlap(a, b) == 0.0
    assert top_overlap(a, a, fraction=1.0) == 1.0


def test_k_is_the_ceiling_and_ties_go_to_the_earlier_cell():
    grid = np.zeros((14, 14))  # DeiT-Ti's grid: ceil(0.1 * 196) = 20 top patches
    assert top_patches(grid).sum() == 20
    assert np.flatnonzero(top_patches(grid)).tolist() == list(range(20))  # all tied: row-major order
    grid.flat[100] = 1.0
    assert np.flatnonzero(top_patches(grid)).tolist() == list(range(19)) + [100]


def test_only_the_order_matters():
    a = np.random.default_rng(3).normal(size=(6, 7))
    assert top_overlap(a, 10 * a + 4) == 1.0
    assert top_overlap(a, -a, fraction=0.25) == 0.0  # the 11 largest and the 11 smallest of 42 cells
    with pytest.raises(ValueError, match="fraction"):
        top_patches(a, 0.0)
    with pytest.raises(ValueError, match="shapes"):
        top_overlap(a, a.T)
