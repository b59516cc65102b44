"""Model-level analyses that need no image: the ViT paper's Fig. 7 left and centre."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vit_inspect.analysis import FilterPCA, filter_pca, pos_embed_similarity
from vit_inspect.core.handle import ViTHandle


@dataclass(frozen=True)
class ModelReport:
    """Model-level analyses (ViT paper Fig. 7 left and centre); no image needed."""

    filter_pca: FilterPCA
    pos_similarity: np.ndarray | None  # (grid_h, grid_w, grid_h, grid_w) at the native grid; None without pos. embed.
    grid: tuple[int, int]  # the native grid


def model_report(handle: ViTHandle, k: int = 28) -> ModelReport:
    """Patch-embedding filter PCA and position-embedding cosine similarity at the native grid."""
    return ModelReport(filter_pca=filter_pca(handle.patch_embed_weight(), k),
                       pos_similarity=pos_similarity_at(handle, handle.native_grid), grid=handle.native_grid)


def pos_similarity_at(handle: ViTHandle, grid: tuple[int, int]) -> np.ndarray | None:
    """Position-embedding cosine similarity for a (grid_h, grid_w) grid, using the model's own
    interpolation of the embeddings when the grid differs from the native one."""
    pos = handle.patch_pos_embed(grid)
    return None if pos is None else pos_embed_similarity(pos)
