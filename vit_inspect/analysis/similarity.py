"""Patch similarity: the cosine similarity of one patch's token to every patch token, as the DINO viewers show
it (Caron et al. 2021, "Emerging Properties in Self-Supervised Vision Transformers"; Oquab et al. 2024, DINOv2,
Fig. 1's patch matching).

    s_p = <t_q, t_p> / (||t_q|| ||t_p||)      in [-1, 1]

for the query patch's token t_q and patch p's token t_p at the same block (of the same image, or of another
image through the same model: only the channels must agree, not the grids). A zero token has no direction; its
similarity is 0.
"""
from __future__ import annotations

import numpy as np


def cosine_similarity(query: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """(D,) query token and (..., D) tokens -> (...) float64 cosine similarities, in [-1, 1] (0 where either
    token is zero)."""
    query = np.asarray(query, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.float64)
    if query.ndim != 1 or tokens.shape[-1] != query.shape[0]:
        raise ValueError(f"a (D,) query and (..., D) tokens, got {query.shape} and {tokens.shape}")
    norms = np.linalg.norm(tokens, axis=-1) * np.linalg.norm(query)  # (...)
    dots = tokens @ query
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0).clip(-1.0, 1.0)
