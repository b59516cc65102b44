"""Similarity of learned position embeddings (Dosovitskiy et al. 2021, Fig. 7 centre)."""
from __future__ import annotations

import numpy as np


def pos_embed_similarity(patch_pos_embed: np.ndarray) -> np.ndarray:
    """Cosine similarity between the position embeddings of every pair of patches.

    Dosovitskiy et al. 2021 ("An Image is Worth 16x16 Words"), Fig. 7 centre: tile (r, c) of the figure
    is ``out[r, c]``, the cosine ``<p_rc, p_ij> / (|p_rc| |p_ij|)`` against every patch (i, j).

    ``patch_pos_embed`` is (grid_h, grid_w, embed_dim), prefix-token positions already removed.
    Returns (grid_h, grid_w, grid_h, grid_w), dimensionless, in [-1, 1] up to rounding.
    Raises ValueError if any embedding is the zero vector (its cosine is undefined).
    """
    if patch_pos_embed.ndim != 3:
        raise ValueError(f"expected (grid_h, grid_w, embed_dim), got shape {patch_pos_embed.shape}")
    grid_h, grid_w, embed_dim = patch_pos_embed.shape
    flat = patch_pos_embed.reshape(grid_h * grid_w, embed_dim).astype(np.float64)  # (P, D)
    norms = np.linalg.norm(flat, axis=1)  # (P,)
    zero = np.flatnonzero(norms == 0)
    if zero.size:
        rows, cols = np.unravel_index(zero, (grid_h, grid_w))
        raise ValueError(f"zero position embedding at patches {list(zip(rows.tolist(), cols.tolist()))}; cosine undefined")
    unit = flat / norms[:, None]  # (P, D)
    return (unit @ unit.T).reshape(grid_h, grid_w, grid_h, grid_w)
