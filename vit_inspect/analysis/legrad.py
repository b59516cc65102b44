"""LeGrad (Bousselham et al. 2025) and the patch readout of pixel relevance (AttnLRP)."""
from __future__ import annotations

import numpy as np

from vit_inspect.core.tokens import TokenLayout


def legrad_map(layer_grads: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """LeGrad explanation map (Bousselham et al., "LeGrad: An Explainability Method for Vision Transformers
    via Feature Formation Sensitivity", ICCV 2025, Eq. 4-6) as (grid_h, grid_w).

    ``layer_grads`` is (L, heads, N, N): for each selected layer l, ∂s^l/∂A^l, the gradient of that layer's
    class score (its tokens read through the model's final norm and head) with respect to its attention
    probabilities, rows = queries. Per layer: ReLU, mean over heads and over all query rows, prefix-token
    keys dropped; then the mean over layers. Units: score per unit attention. The paper's final min-max
    scaling is left to plotting (it does not change the ranking).
    """
    if layer_grads.ndim != 4 or layer_grads.shape[-1] != layout.num_tokens:
        raise ValueError(f"expected (layers, heads, N, N) with N = {layout.num_tokens}, got {layer_grads.shape}")
    per_key = np.maximum(layer_grads.astype(np.float64), 0.0).mean(axis=(1, 2))  # (L, N)
    return layout.to_grid(layout.patches(per_key.mean(axis=0)))


def patch_relevance(pixel_relevance: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """(C, H, W) relevance at the input pixels -> (grid_h, grid_w) sums over channels and each patch
    (the AttnLRP heatmap at patch resolution; relevance units are those of the explained logit)."""
    height, width = layout.input_size
    per_pixel = pixel_relevance[:, :height, :width].astype(np.float64).sum(axis=0)  # (H, W)
    return per_pixel.reshape(layout.grid_h, layout.patch_h, layout.grid_w, layout.patch_w).sum(axis=(1, 3))
