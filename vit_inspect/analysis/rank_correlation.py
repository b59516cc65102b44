"""Spearman's rank correlation (Spearman 1904, "The proof and measurement of association between two things").

The one definition every comparison in the package uses (two maps of one image, a map before and after the
model is randomised, head importances against measured drops):

    rho(a, b) = Pearson(R(a), R(b)) = sum_i (R_i(a) - mean R(a)) (R_i(b) - mean R(b))
                / sqrt( sum_i (R_i(a) - mean R(a))^2  sum_i (R_i(b) - mean R(b))^2 )

with R the ranks 1..n and tied values given the mean of the ranks they span (the "average" rule of
`scipy.stats.rankdata`). Without ties this equals Spearman's 1 - 6 sum_i d_i^2 / (n (n^2 - 1)), d_i the rank
differences. Ranks do not change under any increasing transform of a map, so no normalisation is needed.
"""
from __future__ import annotations

import numpy as np


def average_ranks(values: np.ndarray) -> np.ndarray:
    """(n,) float64 ranks 1..n of the flattened `values`, ties given the mean of the ranks they span."""
    x = np.asarray(values, dtype=np.float64).ravel()
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    starts_group = np.r_[True, ordered[1:] != ordered[:-1]]  # (n,) first value of each run of ties
    group = np.cumsum(starts_group) - 1  # (n,) run index of each sorted value
    starts = np.flatnonzero(starts_group)
    ends = np.r_[starts[1:], x.size]  # one past each run
    ranks = np.empty(x.size)
    ranks[order] = ((starts + ends - 1) / 2.0 + 1.0)[group]  # mean of the 1-based ranks start+1 .. end
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two equally shaped arrays of finite values (flattened), in [-1, 1].

    1 for identically ordered values, -1 for reversed ones; NaN when either array is constant (its ranks
    have no variance, so the correlation is undefined). Raises ValueError for different shapes or fewer
    than two values.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"spearman needs two equally shaped arrays of at least 2 values, got shapes "
                         f"{a.shape} and {b.shape}")
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = np.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb) / denominator if denominator > 0 else float("nan")
