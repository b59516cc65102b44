"""Raw attention maps and the shared readout of a token-to-token matrix onto the patch grid."""
from __future__ import annotations

import numpy as np

from vit_inspect.core.tokens import TokenLayout

Query = str | tuple[int, int] | None  # None: default; "class"/"distillation" token; "mean" of patch rows; (row, col)


def readout(matrix: np.ndarray, layout: TokenLayout, query: Query = None) -> np.ndarray:
    """One query's row of a token-to-token matrix, restricted to patch keys, as a (grid_h, grid_w) map.

    ``matrix`` is (N, N), rows = queries, columns = keys (attention, rollout or relevance). ``query``:
    ``None`` is the class token if the layout has one, otherwise the mean over all patch query rows;
    ``"class"`` is the class token (ValueError without one); ``"distillation"`` the distillation token of a
    distilled DeiT (Touvron et al. 2021; ValueError without one); ``"mean"`` is the mean over patch query rows
    (the readout of average-pooled models); ``(row, col)`` is that patch's token.
    Values keep the matrix's units; prefix-token keys are dropped, nothing is renormalised.
    """
    if matrix.shape != (layout.num_tokens, layout.num_tokens):
        raise ValueError(f"expected a ({layout.num_tokens}, {layout.num_tokens}) token matrix, got shape {matrix.shape}")
    if query is None:
        query = "class" if layout.has_class_token else "mean"
    if query == "mean":
        row = layout.patches(matrix, axis=0).mean(axis=0)  # (N,)
    elif isinstance(query, str):
        if query == "distillation":
            if not layout.num_dist_tokens:
                raise ValueError("query='distillation' but this model has no distillation token")
            return layout.to_grid(layout.patches(matrix[int(layout.has_class_token)]))  # right after the class token
        if query != "class":
            raise ValueError(f"unknown query {query!r}; use None, 'class', 'distillation', 'mean' or a (row, col) patch")
        if not layout.has_class_token:
            raise ValueError("query='class' but this model has no class token; use None or a (row, col) patch")
        row = matrix[layout.class_token_index]
    else:
        row = matrix[layout.token_index(*query)]
    return layout.to_grid(layout.patches(row))


def attention_map(attention: np.ndarray, layout: TokenLayout, layer: int, head: int | None = None,
                  query: Query = None) -> np.ndarray:
    """Raw attention of one layer (and one head, or the mean over heads) read out as (grid_h, grid_w).

    ``attention`` is (depth, heads, N, N) softmax attention, rows = queries summing to 1; the map is the
    query's attention weights on the patch keys (see `readout`), not renormalised after the prefix keys
    are dropped.
    """
    if attention.ndim != 4:
        raise ValueError(f"expected attention (depth, heads, N, N), got shape {attention.shape}")
    depth, heads = attention.shape[:2]
    if not 0 <= layer < depth:
        raise ValueError(f"layer {layer} out of range: the model has {depth} layers (0..{depth - 1})")
    if head is None:
        matrix = attention[layer].mean(axis=0)  # (N, N)
    elif 0 <= head < heads:
        matrix = attention[layer, head]  # (N, N)
    else:
        raise ValueError(f"head {head} out of range: layer {layer} has {heads} heads (0..{heads - 1})")
    return readout(matrix, layout, query)


def prefix_shares(matrix: np.ndarray, layout: TokenLayout, query: Query = None) -> np.ndarray:
    """(num_prefix_tokens,) the share of the query's attention that goes to each prefix token
    (class, distillation, registers, in `layout.prefix_names()` order), from an (N, N) attention matrix.

    These are the entries `readout` drops: with attention rows summing to 1, they and the patch map add
    up to 1 (for ``query="mean"``, averaged over patch queries). Dimensionless, in [0, 1].
    """
    if matrix.shape != (layout.num_tokens, layout.num_tokens):
        raise ValueError(f"expected a ({layout.num_tokens}, {layout.num_tokens}) token matrix, got shape {matrix.shape}")
    if query is None:
        query = "class" if layout.has_class_token else "mean"
    if query == "mean":
        row = layout.patches(matrix, axis=0).mean(axis=0)  # (N,)
    elif query == "class":
        if not layout.has_class_token:
            raise ValueError("query='class' but this model has no class token; use None or a (row, col) patch")
        row = matrix[layout.class_token_index]
    elif isinstance(query, str):
        raise ValueError(f"unknown query {query!r}; use None, 'class', 'mean' or a (row, col) patch")
    else:
        row = matrix[layout.token_index(*query)]
    return np.asarray(layout.split(row)[0], dtype=np.float64)
