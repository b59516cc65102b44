"""A small top-k SAE with random weights for the real DeiT-Ti (width 192), as the app's tests upload it."""
from __future__ import annotations

import torch

from vit_inspect.core.sae_file import SAEInfo, SparseAutoencoder

LAYER, FEATURES, K = 6, 256, 8


def random_sae(width: int = 192, layer: int = LAYER, model: str = "deit_tiny_patch16_224", seed: int = 0
               ) -> SparseAutoencoder:
    """F = 256 features, k = 8, on block ``layer``'s output, with an input mean and scale to normalise by."""
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape: int, scale: float) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale

    info = SAEInfo(model=model, layer=layer, k=K, features=FEATURES, width=width)
    return SparseAutoencoder(W_enc=draw(width, FEATURES, scale=width ** -0.5), b_enc=draw(FEATURES, scale=0.1),
                             W_dec=draw(FEATURES, width, scale=FEATURES ** -0.5), b_dec=draw(width, scale=0.1),
                             info=info, input_mean=draw(width, scale=0.1), input_scale=torch.tensor(2.0))
