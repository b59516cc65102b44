"""One image through a model with an SAE on block l's output: the SAE's codes of every patch token and the
model's logits, from one forward pass (`sparse_codes`), and what the app reads from them: a patch's most
active features (`top_at`) and one feature's activation over the image (`SparseCodes.feature_grid`). With
feature edits (`scales`), the pass runs with those features scaled at block l (`passes.sae.edited_block_output`,
the SAE's error kept) and everything it returns, codes and logits, is of that edited pass.

The codes are z = TopK_k(ReLU((x - b_dec) W_enc + b_enc)) of each patch token x of block l's output, in the
SAE's normalised units (`analysis.sae.encode`); they are kept sparse, the k values and feature indices of each
patch, so that an SAE of many features costs k numbers per patch, not F.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vit_inspect.analysis.sae import normalise, pre_activations, top_k
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.sae_file import SparseAutoencoder
from vit_inspect.core.tokens import TokenLayout
from vit_inspect.passes.sae import block_output, edited_block_output


@dataclass(frozen=True, eq=False)
class SparseCodes:
    """An SAE's codes of one image's patch tokens at its block, and the model's logits from the same pass."""

    layout: TokenLayout  # the token layout of the input the pass saw
    layer: int  # the block whose output the SAE read
    values: np.ndarray  # (P, k) float32 code values, >= 0, each patch's k largest in decreasing order
    indices: np.ndarray  # (P, k) int64 the features those values belong to
    logits: np.ndarray  # (C,) float32 the model's output for the image; (D,) features for a model without a head

    def nbytes(self) -> int:
        return self.values.nbytes + self.indices.nbytes + self.logits.nbytes

    def feature_grid(self, feature: int) -> np.ndarray:
        """(grid_h, grid_w) float32 activation of ``feature`` at every patch (0 where it is not among the k)."""
        at = np.where(self.indices == feature, self.values, 0.0).sum(-1, dtype=np.float32)  # (P,)
        return self.layout.to_grid(at)


def sparse_codes(handle: ViTHandle, sae: SparseAutoencoder, pixels: torch.Tensor,
                   scales: dict[int, float] | None = None) -> SparseCodes:
    """The codes of ``sae`` for the patch tokens of one (1, 3, H, W) normalised image at block `sae.info.layer`,
    and the logits, from one forward without gradients. Prefix tokens are not encoded: the app's views are maps
    over the patches. With ``scales`` (feature -> factor, 0 switches it off), block l's output is edited first
    and the codes are those of the edited tokens, re-encoded."""
    layout = handle.layout(tuple(pixels.shape[-2:]))
    seen = []
    sae = sae.to(handle.device)
    with (torch.no_grad(), edited_block_output(handle, sae, layout, scales or {}),  # registered first: runs first
          block_output(handle, sae.info.layer, seen.append)):
        logits = handle.forward(pixels)  # (1, C)
    patches = seen[0][0, layout.patch_slice].float()  # (P, d)
    values, indices = top_k(pre_activations(normalise(patches, sae), sae.W_enc, sae.b_enc, sae.b_dec), sae.info.k)
    return SparseCodes(layout=layout, layer=sae.info.layer, values=values.cpu().numpy(),
                         indices=indices.cpu().numpy(), logits=logits[0].float().cpu().numpy())


def top_at(features: SparseCodes, row: int, col: int, count: int) -> list[tuple[int, float]]:
    """(feature, activation) of the patch at (row, col), the ``count`` most active first, zeros left out."""
    patch = features.layout.token_index(row, col) - features.layout.num_prefix_tokens
    pairs = zip(features.indices[patch].tolist(), features.values[patch].tolist())
    return [(int(f), float(v)) for f, v in pairs if v > 0][:count]

