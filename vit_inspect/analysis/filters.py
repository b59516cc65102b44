"""Principal components of the patch-embedding filters (Dosovitskiy et al. 2021, Fig. 7 left)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FilterPCA:
    """Principal directions of the patch-embedding filters, laid out as image patches."""

    components: np.ndarray  # (k, patch_h, patch_w, C) unit-norm principal directions, largest variance first
    explained_variance_ratio: np.ndarray  # (k,) fraction of the filters' total variance along each component


def filter_pca(weight: np.ndarray, k: int = 28) -> FilterPCA:
    """PCA of the patch-embedding filters, as in Dosovitskiy et al. 2021 ("An Image is Worth 16x16 Words"), Fig. 7 left.

    ``weight`` is the patch-embedding convolution weight, (embed_dim, C, patch_h, patch_w). Each of the
    ``embed_dim`` filters is one sample of dimension ``C * patch_h * patch_w``; the samples are centred and
    decomposed by scikit-learn's PCA (exact SVD). The paper shows the first 28 components, hence the default ``k``;
    ``k`` is clipped to ``min(k, embed_dim, C * patch_h * patch_w)``. Components are unit-norm directions
    in filter space (sign arbitrary), channels-last so that an RGB filter reads as an RGB tile.
    """
    if weight.ndim != 4:
        raise ValueError(f"expected a conv weight (embed_dim, C, patch_h, patch_w), got shape {weight.shape}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    from sklearn.decomposition import PCA  # imported on use: it takes seconds and only this analysis needs it

    embed_dim, channels, patch_h, patch_w = weight.shape
    samples = weight.reshape(embed_dim, channels * patch_h * patch_w).astype(np.float64)  # (embed_dim, C*ph*pw)
    k = min(k, embed_dim, samples.shape[1])
    pca = PCA(n_components=k, svd_solver="full").fit(samples)
    components = pca.components_.reshape(k, channels, patch_h, patch_w).transpose(0, 2, 3, 1)  # (k, ph, pw, C)
    return FilterPCA(components=components, explained_variance_ratio=pca.explained_variance_ratio_)
