"""Gradient-weighted attention relevance (Chefer, Gur & Wolf 2021)."""
from __future__ import annotations

import numpy as np

from vit_inspect.analysis.attention_maps import Query, readout
from vit_inspect.core.tokens import TokenLayout


def chefer_matrix(attention: np.ndarray, attention_grad: np.ndarray) -> np.ndarray:
    """Self-attention relevance matrix R (N, N) of Chefer, Gur & Wolf 2021, Eq. (5)-(6).

    "Generic Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers":
    starting from R = I, for each layer l from first to last

        Ā_l = E_h[(∇A_l ⊙ A_l)^+]      (Eq. 5: mean over heads of the positive part)
        R   = R + Ā_l · R              (Eq. 6)

    ``attention`` and ``attention_grad`` are (depth, heads, N, N), rows = queries; the gradient is
    d(target logit)/dA. R is in units of logit relevance (the diagonal starts at 1 from the identity).
    """
    if attention.ndim != 4 or attention.shape != attention_grad.shape:
        raise ValueError(
            f"expected attention and its gradient both (depth, heads, N, N), got {attention.shape} and {attention_grad.shape}")
    depth, _, num_tokens, _ = attention.shape
    relevance = np.eye(num_tokens)
    for layer in range(depth):
        weighted = attention_grad[layer].astype(np.float64) * attention[layer]  # (heads, N, N)
        fused = np.maximum(weighted, 0.0).mean(axis=0)  # (N, N)
        relevance = relevance + fused @ relevance
    return relevance


def chefer_relevance(attention: np.ndarray, attention_grad: np.ndarray, layout: TokenLayout,
                     query: Query = None) -> np.ndarray:
    """Chefer et al. 2021 relevance (`chefer_matrix`) read out for one query as a (grid_h, grid_w) map.

    See `attention_maps.readout` for ``query``; values are the raw relevance on the patch tokens.
    """
    return readout(chefer_matrix(attention, attention_grad), layout, query)
