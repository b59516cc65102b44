"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers")."""
from __future__ import annotations

import math

import numpy as np

from ..tokens import TokenLayout
from .attention_maps import Query, readout

HEAD_FUSIONS = {"mean": np.mean, "max": np.max, "min": np.min}


def _discard_lowest(fused: np.ndarray, discard_ratio: float, keep_column: int | None) -> np.ndarray:
    """Zero the lowest floor(discard_ratio * N) entries of each row of (N, N), never column ``keep_column``."""
    num_tokens = fused.shape[-1]
    num_discard = math.floor(discard_ratio * num_tokens)
    if num_discard == 0:
        return fused
    ranking = fused.copy()
    if keep_column is not None:
        ranking[:, keep_column] = np.inf
    lowest = np.argsort(ranking, axis=-1, kind="stable")[:, :num_discard]  # (N, num_discard)
    kept = fused.copy()
    np.put_along_axis(kept, lowest, 0.0, axis=-1)
    return kept


def rollout_matrix(attention: np.ndarray, head_fusion: str = "mean", discard_ratio: float = 0.0,
                   residual: bool = True, start_layer: int = 0, end_layer: int | None = None,
                   layout: TokenLayout | None = None) -> np.ndarray:
    """Attention rollout matrix (N, N): how much each query token's output draws on each input token.

    Abnar & Zuidema 2020, Sec. 3 ("attention rollout"): with the residual connection folded in,
    A_l = 0.5 W_l + 0.5 I with rows renormalised to 1, and R = A_{end-1} ... A_{start+1} A_start.
    Per selected layer (``start_layer:end_layer``, Python slice semantics over ``depth``):

    1. heads are fused by ``head_fusion`` ("mean" as in the paper; "max"/"min" as in the common
       vit-explain variant);
    2. if ``discard_ratio > 0`` the lowest ``floor(discard_ratio * N)`` entries of every row are set to 0,
       never the class-token column (needs ``layout`` to know it; without a layout no column is kept);
    3. if ``residual``, A = 0.5 A + 0.5 I;
    4. rows are renormalised to sum 1 and R = A @ R, starting from R = I.

    ``attention`` is (depth, heads, N, N), rows = queries. Rows of the result sum to 1 (dimensionless).
    """
    if attention.ndim != 4:
        raise ValueError(f"expected attention (depth, heads, N, N), got shape {attention.shape}")
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"unknown head_fusion {head_fusion!r}; choose one of {sorted(HEAD_FUSIONS)}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    depth, _, num_tokens, _ = attention.shape
    if layout is not None and layout.num_tokens != num_tokens:
        raise ValueError(f"attention has {num_tokens} tokens, layout has {layout.num_tokens}")
    layers = range(depth)[start_layer:end_layer]
    if len(layers) == 0:
        raise ValueError(f"no layers selected by start_layer={start_layer}, end_layer={end_layer} of depth {depth}")
    keep_column = layout.class_token_index if layout is not None else None
    identity = np.eye(num_tokens)
    result = identity
    for layer in layers:
        fused = HEAD_FUSIONS[head_fusion](attention[layer].astype(np.float64), axis=0)  # (N, N)
        if discard_ratio > 0:
            fused = _discard_lowest(fused, discard_ratio, keep_column)
        if residual:
            fused = 0.5 * fused + 0.5 * identity
        row_sums = fused.sum(axis=-1, keepdims=True)  # (N, 1)
        if np.any(row_sums <= 0):
            raise ValueError(f"layer {layer} has a query row with no attention left; cannot renormalise")
        result = (fused / row_sums) @ result
    return result


def rollout(attention: np.ndarray, layout: TokenLayout, head_fusion: str = "mean", discard_ratio: float = 0.0,
            residual: bool = True, start_layer: int = 0, end_layer: int | None = None,
            query: Query = None) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020) read out for one query as a (grid_h, grid_w) map.

    See `rollout_matrix` for the parameters and `attention_maps.readout` for ``query``. Values are the
    raw rollout weights on the patch tokens (prefix-token keys dropped, not renormalised).
    """
    matrix = rollout_matrix(attention, head_fusion, discard_ratio, residual, start_layer, end_layer, layout)
    return readout(matrix, layout, query)
