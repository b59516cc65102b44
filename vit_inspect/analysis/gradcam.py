"""Grad-CAM on the patch tokens of a transformer layer (Selvaraju et al. 2017)."""
from __future__ import annotations

import numpy as np

from vit_inspect.core.tokens import TokenLayout


def gradcam_from_tokens(activations: np.ndarray, gradients: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """Grad-CAM (Selvaraju et al. 2017, "Grad-CAM: Visual Explanations from Deep Networks", Eq. 1-2) on tokens.

    The patch tokens play the role of the CNN's spatial positions and the embedding dimensions the role
    of its channels:

        alpha_d = mean over patch tokens p of dy/dA_pd     (Eq. 1)
        cam_p   = sum_d alpha_d A_pd                       (Eq. 2 without the ReLU)

    ``activations`` and ``gradients`` are (N, D) for one image at one token layer (e.g. the output of the
    last block's first LayerNorm); prefix tokens are ignored. Returns (grid_h, grid_w) in units of
    activation x gradient, signed: the ReLU of Eq. 2 is left to plotting.
    """
    if activations.ndim != 2 or activations.shape != gradients.shape:
        raise ValueError(f"expected activations and gradients both (N, D), got {activations.shape} and {gradients.shape}")
    patch_activations = layout.patches(activations, axis=0).astype(np.float64)  # (P, D)
    channel_weights = layout.patches(gradients, axis=0).astype(np.float64).mean(axis=0)  # (D,)
    return layout.to_grid(patch_activations @ channel_weights)
