"""Spearman's rank correlation: hand-computed values, ties, and scipy's `spearmanr`."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from vit_inspect.analysis.rank_correlation import average_ranks, spearman


def test_average_ranks_by_hand():
    # sorted: 1 (rank 1), 2, 2 (ranks 2, 3 -> 2.5), 5 (rank 4), 7, 7, 7 (ranks 5, 6, 7 -> 6)
    assert average_ranks(np.array([7, 2, 5, 1, 7, 2, 7])).tolist() == [6, 2.5, 4, 1, 6, 2.5, 6]
    np.testing.assert_array_equal(average_ranks(np.arange(12.0).reshape(3, 4)), np.arange(1, 13))


def test_spearman_by_hand():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # d = rank differences (0, 0, 1, -1): rho = 1 - 6 * 2 / (4 * 15) = 0.8
    assert spearman([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(0.8)
    # any increasing transform keeps the ranks: a map and its exponential agree exactly
    grid = np.random.default_rng(1).normal(size=(5, 6))
    assert spearman(grid, np.exp(3 * grid)) == pytest.approx(1.0, abs=1e-15)
    # ties: ranks (1.5, 1.5, 3) against (1, 2, 3): centred (-.75, -.75, 1.5) . (-1, 0, 1) = 2.25,
    # norms sqrt(3.375) and sqrt(2): rho = 2.25 / sqrt(6.75) = 0.8660...
    assert spearman([0, 0, 1], [1, 2, 3]) == pytest.approx(2.25 / np.sqrt(6.75), abs=1e-15)


def test_spearman_matches_scipy_with_and_without_ties():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=36), rng.normal(size=36)
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
    b[:6] = 0.5  # ties
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
    c = rng.integers(0, 5, size=(7, 9)).astype(float)  # many ties, as in a ReLU'd map
    d = c + rng.normal(size=c.shape)
    assert spearman(c, d) == pytest.approx(stats.spearmanr(c.ravel(), d.ravel()).statistic, abs=1e-12)


def test_constant_maps_and_bad_shapes():
    assert np.isnan(spearman(np.ones((3, 3)), np.arange(9.0).reshape(3, 3)))
    with pytest.raises(ValueError, match="equally shaped"):
        spearman(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="at least 2"):
        spearman([1.0], [2.0])
