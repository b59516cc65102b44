"""Entropy of attention rows: how far a distribution over tokens is from uniform."""
from __future__ import annotations

import numpy as np


def attention_entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy, in nats, of each distribution along the last axis: H(p) = -sum_j p_j ln p_j.

    ``probs`` holds probabilities along its last axis (an attention row over N keys, rows summing to 1;
    renormalise first when a subset of keys is kept). Terms with p_j = 0 contribute 0 (the limit of
    p ln p). The result has the shape of ``probs`` without its last axis. The maximum, reached by uniform
    attention over N keys, is ln N; 0 means all attention on one key. Per-head attention entropy as a
    measure of how broad a head is follows Clark et al. 2019 ("What Does BERT Look At?", Sec. 3).
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim < 1 or p.shape[-1] < 1:
        raise ValueError(f"expected probabilities along a non-empty last axis, got shape {p.shape}")
    if np.any(p < 0):
        raise ValueError("probabilities must be non-negative")
    terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return -terms.sum(axis=-1)
