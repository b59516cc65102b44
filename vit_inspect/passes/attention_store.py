"""Attention kept as queries and keys: a cached result that grows like depth x N x D, not depth x heads x N^2.

A ViT layer's attention probabilities are A_h = softmax(s * Q_h K_h^T) (Vaswani et al. 2017, Eq. 1, with
s = 1/sqrt(d) or the module's own scale) over the post-normalisation queries and keys of head h. Keeping
Q and K of every layer in float16 costs depth * 2 * N * D * 2 bytes; any row of any map is rebuilt on
demand in heads * N * d operations, a whole layer in heads * N^2 * d (the same work as that layer's
attention in the forward pass).

Where a whole image's float16 maps are small in bytes (`keeps_maps`: at most MAPS_IN_MEMORY_BYTES, e.g.
DeiT-Ti/16 at 224 px, 2.8 MB) they are kept as such instead: nothing to rebuild, check or spill, the same
constant bound for every input that small, and Q/K from there on, so the growth stays depth x N x D.

Whether a model really computes attention that way is checked during the pass (`layer_stream.LayerStream`,
which records Q and K and builds the store): a sample of rows is rebuilt from the recorded Q and K and compared with the probabilities the model produced. When they
differ by more than the tolerance (rotary embeddings, attention biases, extreme logits that float16 cannot
carry) the store keeps Q and K in float32, and failing that the maps themselves in float16, so results
never silently change.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch

from vit_inspect.analysis.attention_maps import Query
from vit_inspect.analysis.rollout import (HEAD_FUSIONS, check_options, row_discard_mask, row_product,
                                          vector_times_layer, zero_masked)
from vit_inspect.core.tokens import TokenLayout
from vit_inspect.passes.spill import Spill

TOLERANCE = 2e-3  # max |rebuilt - recorded| probability accepted (float16 maps carry up to 4.9e-4 rounding)
HALF_PASS_TOLERANCE = 3e-2  # under autocast the recorded maps are themselves half precision
CHUNK_BYTES = 8 * 2 ** 20  # transient float32 block per row chunk of a rebuild (larger blocks cost page faults)
# Rows rebuilt per product at least. The BLAS (MKL here) computes 1-3 rows as matrix-vector products, in
# another summation order than a matrix product's: a score's last bit moves and, rarely, a probability's
# float16 rounding with it, which could change what rollout's discard ranks. From 4 rows on, each row's
# values are those of the whole layer (tests/passes/test_store_rollout.py pins it).
ROW_BLOCK = 8
TORCH_ROWS = 16  # stored rows fused at once from which torch's float16 conversion beats numpy's (`_fused_stored_rows`)
# A whole image's (depth, heads, N, N) float16 maps up to this size are kept as they are (`keeps_maps`). There
# the Q/K record, its check and a spill cost a small model's pass more than they save (DeiT-Ti/16 at 224 px:
# 2.8 MB of maps against 1.8 MB of Q/K; the pass 0.95x without them, BENCHMARKS.md); ViT-S/16 at 224
# (5.6 MB), ViT-B/16 (11.2 MB) and every larger input keep Q/K. A constant bound, so the growth is unchanged.
MAPS_IN_MEMORY_BYTES = 4 * 2 ** 20


def keeps_maps(depth: int, num_heads: int, num_tokens: int) -> bool:
    """Whether a pass keeps the float16 maps themselves: depth * heads * N^2 * 2 <= MAPS_IN_MEMORY_BYTES."""
    return depth * num_heads * num_tokens ** 2 * 2 <= MAPS_IN_MEMORY_BYTES


@dataclass(frozen=True)
class AttentionStore:
    """Every layer's attention of one image, held as queries and keys (or, as a fallback, the maps).

    ``queries``/``keys``: (depth, heads, N, d) post-normalisation, unscaled, float16 (float32 when float16
    could not reproduce the model's maps); ``scale``: (depth,) the softmax temperature s of each layer;
    ``maps``: (depth, heads, N, N) float16 probabilities, only when they are small (`keeps_maps`; then
    ``max_error`` is 0: nothing is rebuilt) or rebuilding was not exact enough.
    ``mode`` names which ("qk16", "qk32" or "maps") and ``max_error`` the largest difference seen in the
    check, as a probability.
    """

    mode: str
    queries: np.ndarray | None = field(repr=False)
    keys: np.ndarray | None = field(repr=False)
    scale: np.ndarray | None
    maps: np.ndarray | None = field(repr=False)
    max_error: float
    # the model's own maps with their heads fused, on local disk (`spill.Spill`), read by the fused rows instead
    # of fusing rebuilt heads while alive; not counted by nbytes (disk, under the spill folder's budget), not pickled
    spill: Spill | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "spill": None}  # a copy rebuilds from queries and keys

    @property
    def depth(self) -> int:
        return (self.maps if self.maps is not None else self.queries).shape[0]

    @property
    def num_heads(self) -> int:
        return (self.maps if self.maps is not None else self.queries).shape[1]

    @property
    def num_tokens(self) -> int:
        return (self.maps if self.maps is not None else self.queries).shape[2]

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.queries, self.keys, self.scale, self.maps) if a is not None)

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.depth:
            raise ValueError(f"layer {layer} out of range: the model has {self.depth} layers (0..{self.depth - 1})")

    def _keys_t(self, layer: int) -> torch.Tensor:
        return torch.from_numpy(self.keys[layer]).float().transpose(-1, -2)  # (heads, d, N)

    def _half_rows(self, layer: int, index: np.ndarray, keys_t: torch.Tensor, heads: slice = slice(None)) -> torch.Tensor:
        """(heads, len(index), N) float16 probabilities of query rows ``index`` of the heads ``heads`` (``keys_t``:
        those heads' transposed keys), rebuilt from Q and K."""
        # at least ROW_BLOCK rows per product: a row's values then do not depend on which rows come with it
        padded = np.concatenate([index, np.full(max(0, ROW_BLOCK - len(index)), index[-1] if len(index) else 0)])
        queries = torch.from_numpy(self.queries[layer][heads][:, padded]).float()  # (heads, max(n, ROW_BLOCK), d)
        return _probabilities(queries, keys_t, float(self.scale[layer]))[:, :len(index)]

    def _stored_rows(self, layer: int, index: np.ndarray, heads: slice = slice(None)) -> np.ndarray | None:
        """(heads, len(index), N) float16 rows of one layer kept as such (small maps, or the maps fallback),
        else None."""
        return None if self.maps is None else _take_rows(self.maps[layer][heads], index)

    def rows(self, layer: int, tokens, head: int | None = None) -> np.ndarray:
        """(heads, len(tokens), N) float32 attention probabilities of query tokens ``tokens`` of one layer,
        rounded to float16 values: the numbers a stack of float16 maps holds, so rankings (rollout's
        ``discard_ratio``) break ties the same way. Read from the stored maps when there are any, else
        rebuilt from Q and K. With ``head``, that head's only: (1, len(tokens), N), heads times less work."""
        self._check_layer(layer)
        if head is not None and not 0 <= head < self.num_heads:
            raise ValueError(f"head {head} out of range: layer {layer} has {self.num_heads} heads (0..{self.num_heads - 1})")
        heads = slice(None) if head is None else slice(head, head + 1)
        index = np.asarray(tokens, dtype=np.int64).reshape(-1)
        stored = self._stored_rows(layer, index, heads)
        if stored is not None:  # exact either way; torch converts many float16 rows faster (`_fused_stored_rows`)
            return stored.astype(np.float32) if len(index) < TORCH_ROWS else torch.from_numpy(stored).float().numpy()
        return self._half_rows(layer, index, self._keys_t(layer)[heads], heads).float().numpy()

    def _chunk_rows(self) -> int:
        """Rows per chunk whose (heads, rows, N) float32 block stays under CHUNK_BYTES."""
        return max(1, CHUNK_BYTES // (4 * self.num_heads * self.num_tokens))

    def _chunk_slices(self) -> Iterator[slice]:
        """Row ranges whose (heads, rows, N) float32 block stays under CHUNK_BYTES."""
        step = self._chunk_rows()
        for start in range(0, self.num_tokens, step):
            yield slice(start, min(start + step, self.num_tokens))

    def row_chunks(self, layer: int, head: int | None = None) -> Iterator[tuple[slice, np.ndarray]]:
        """(rows, (heads, len(rows), N) float32) blocks of one layer (of one ``head``: (1, len(rows), N)), each
        under CHUNK_BYTES."""
        for rows in self._chunk_slices():
            yield rows, self.rows(layer, np.arange(rows.start, rows.stop), head)

    def layer(self, layer: int) -> np.ndarray:
        """(heads, N, N) float32 probabilities of one layer, rows = queries."""
        return self.rows(layer, np.arange(self.num_tokens))

    def fused_row_chunks(self, layer: int, tokens, head_fusion: str = "mean",
                         exact_float32: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(chunk of ``tokens``, (len(chunk), N) float64) blocks: those query rows of one layer with the heads
        fused by ``head_fusion`` ("mean", "max", "min"), rebuilt a chunk under CHUNK_BYTES at a time.
        ``exact_float32``: the max and min come as float32 instead, which holds their float16 values exactly in
        half the bytes (ranking them, as rollout's discard does, takes about half the time); the mean stays float64.

        The values are those of `rows` (float16-valued probabilities): max and min are exact, the mean
        sums the heads in float32 (|error| < 1e-7 of a probability) from Q and K, in float64 from stored
        maps. A live spill (`spill.Spill`) gives the model's own probabilities fused: max and min rounded once
        to float16 (equal to the fusion of the float16-rounded maps, rounding being monotonic), the mean
        from their float32 sum, so it differs from the mean of float16-rounded maps by at most 2^-11 of
        itself."""
        if head_fusion not in HEAD_FUSIONS:
            raise ValueError(f"unknown head_fusion {head_fusion!r}; choose one of {sorted(HEAD_FUSIONS)}")
        self._check_layer(layer)
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        step = self._chunk_rows()
        # a spill's plane is read once per layer, the rows wanted only: a drop meanwhile is harmless
        spilled = (self.spill.rows(layer, tokens, "sum" if head_fusion == "mean" else head_fusion)
                   if self.maps is None and self.spill is not None else None)  # (len(tokens), N)
        if spilled is not None:  # already fused: converted to float64 (the mean's sum divided) a chunk at a time
            step = max(1, step * self.num_heads // 2)  # (n, N) float64 blocks under CHUNK_BYTES
            for start in range(0, len(tokens), step):
                block = spilled[start:start + step]
                yield tokens[start:start + step], (np.divide(block, self.num_heads, dtype=np.float64)
                                                   if head_fusion == "mean" else _widened(block, exact_float32))
            return
        keys_t = self._keys_t(layer) if self.maps is None else None  # converted once per layer
        for start in range(0, len(tokens), step):
            chunk = tokens[start:start + step]
            if self.maps is not None:
                yield chunk, _fused_stored_rows(self.maps[layer], chunk, head_fusion)
                continue
            half = self._half_rows(layer, chunk, keys_t)  # (heads, n, N) float16
            if head_fusion == "mean":  # the float32 sum divided in float64, one pass
                yield chunk, np.divide(half.float().sum(0).numpy(), half.shape[0], dtype=np.float64)
            else:
                yield chunk, _widened(half.amax(0) if head_fusion == "max" else half.amin(0), exact_float32)

    def fused_layer(self, layer: int, head_fusion: str = "mean") -> np.ndarray:
        """(N, N) float64 heads fused by ``head_fusion`` ("mean", "max", "min"), rebuilt in row chunks
        (`fused_row_chunks`): no (heads, N, N) copy."""
        fused = np.empty((self.num_tokens, self.num_tokens))
        for chunk, rows in self.fused_row_chunks(layer, np.arange(self.num_tokens), head_fusion):
            fused[chunk] = rows
        return fused

    def stack(self) -> np.ndarray:
        """(depth, heads, N, N) float16: every map at once (allocates all of it)."""
        if self.maps is not None:
            return self.maps
        return np.stack([self.layer(i).astype(np.float16) for i in range(self.depth)])


def _widened(half: np.ndarray | torch.Tensor, exact_float32: bool) -> np.ndarray:
    """float16 values as float64, or as float32 with ``exact_float32`` (both exact): float16 -> float32 (-> float64)
    in torch, several times faster than numpy's float16 conversions."""
    wide = (torch.from_numpy(half) if isinstance(half, np.ndarray) else half).float()
    return (wide if exact_float32 else wide.double()).numpy()


def _fused_stored_rows(maps: np.ndarray, rows: np.ndarray, head_fusion: str) -> np.ndarray:
    """(len(rows), N) float64 query rows ``rows`` of one layer's (heads, N, N) float16 maps with the heads fused
    (mean, max or min). Exact: float16 values are exact in float64, and so is any sum of up to 2^13 of them (the
    mean's sum), so the order of the sums does not matter. From TORCH_ROWS rows on torch converts them
    (vectorised float16, 2.3-3.4x numpy's conversion for a whole DeiT-Ti layer); fewer go through numpy, whose
    call costs less."""
    if len(rows) < TORCH_ROWS:
        block = maps[:, rows].astype(np.float32)  # (heads, n, N)
        return (block.mean(axis=0, dtype=np.float64) if head_fusion == "mean"
                else HEAD_FUSIONS[head_fusion](block, axis=0).astype(np.float64))
    half = torch.from_numpy(maps).index_select(1, torch.from_numpy(rows))  # (heads, n, N) float16
    if head_fusion == "mean":  # float16 -> float32 -> float64 is 3x faster in torch than float16 -> float64
        return half.float().double().mean(0).numpy()
    return (half.amax(0) if head_fusion == "max" else half.amin(0)).float().double().numpy()


def _take_rows(maps: np.ndarray, index: np.ndarray) -> np.ndarray:
    """(heads, len(index), N) rows ``index`` of (heads, N, N) maps: a slice (no copy) when they are consecutive."""
    if len(index) and index[-1] - index[0] == len(index) - 1 and (np.diff(index) == 1).all():
        return np.asarray(maps[:, index[0]:index[-1] + 1])
    return maps[:, index]


def _probabilities(queries: torch.Tensor, keys_t: torch.Tensor, scale: float) -> torch.Tensor:
    """(heads, n, N) float16 softmax(scale * q k^T) from (heads, n, d) float32 queries and (heads, d, N)
    transposed keys; the scale is applied inside the product (one pass over the scores)."""
    scores = torch.baddbmm(queries.new_empty(()).expand(queries.shape[0], queries.shape[1], keys_t.shape[-1]),
                           queries, keys_t, beta=0.0, alpha=scale)
    return torch.softmax(scores, dim=-1).to(torch.float16)


def query_vector(layout: TokenLayout, query: Query) -> np.ndarray:
    """(N,) float64 weights of the query rows a readout takes (see `attention_maps.readout`): one-hot for
    the class token, the distillation token or a patch, uniform 1/P over the patch tokens for "mean"."""
    if query is None:
        query = "class" if layout.has_class_token else "mean"
    weights = np.zeros(layout.num_tokens)
    if query == "mean":
        weights[layout.patch_slice] = 1.0 / layout.num_patches
    elif query == "distillation":
        if not layout.num_dist_tokens:
            raise ValueError("query='distillation' but this model has no distillation token")
        weights[int(layout.has_class_token)] = 1.0  # right after the class token, as `readout` reads it
    elif isinstance(query, str):
        if query != "class":
            raise ValueError(f"unknown query {query!r}; use None, 'class', 'distillation', 'mean' or a (row, col) patch")
        if not layout.has_class_token:
            raise ValueError("query='class' but this model has no class token; use None or a (row, col) patch")
        weights[layout.class_token_index] = 1.0
    else:
        weights[layout.token_index(*query)] = 1.0
    return weights


def attention_rows(store: AttentionStore, layout: TokenLayout, layer: int, query: Query = None,
                   head: int | None = None) -> np.ndarray:
    """(heads, N) float32 attention of every head of one layer from a query (`query_vector`), over all N
    keys, prefix tokens included; the rows of `analysis.attention_map`'s matrix before `readout` drops
    the prefix keys. With ``head``, that head's row only, (1, N). A single-token query rebuilds one row
    per head (N * d operations each); "mean" rebuilds the layer (or the head) chunk by chunk."""
    store._check_layer(layer)
    weights = query_vector(layout, query)
    tokens = np.flatnonzero(weights)
    if len(tokens) == 1:
        return store.rows(layer, tokens, head)[:, 0]
    rows = np.zeros((store.num_heads if head is None else 1, store.num_tokens))
    for chunk, block in store.row_chunks(layer, head):  # (heads, n, N)
        rows += np.einsum("n,hnk->hk", weights[chunk], block)
    return rows.astype(np.float32)


def attention_map(store: AttentionStore, layout: TokenLayout, layer: int, head: int | None = None,
                  query: Query = None) -> np.ndarray:
    """(grid_h, grid_w) raw attention of one layer and head (None: mean of heads) from a query token;
    the same values as `analysis.attention_map` on the full maps (see `attention_rows`)."""
    store._check_layer(layer)
    if head is not None and not 0 <= head < store.num_heads:
        raise ValueError(f"head {head} out of range: layer {layer} has {store.num_heads} heads (0..{store.num_heads - 1})")
    if head is None and store.maps is None and store.spill is not None and store.spill.alive:
        # the mean of heads from a live spill's fused rows: one plane read, no head rebuilt
        weights = query_vector(layout, query)
        row = np.zeros(store.num_tokens)
        for chunk, block in store.fused_row_chunks(layer, np.flatnonzero(weights), "mean"):  # (n, N) float64
            row += weights[chunk] @ block
        return layout.to_grid(layout.patches(row.astype(np.float32)))
    rows = attention_rows(store, layout, layer, query, head)  # (heads, N), or (1, N) of the head
    row = rows.mean(axis=0) if head is None else rows[0]
    return layout.to_grid(layout.patches(row))


def rollout(store: AttentionStore, layout: TokenLayout, head_fusion: str = "mean", discard_ratio: float = 0.0,
            residual: bool = True, start_layer: int = 0, end_layer: int | None = None,
            query: Query = None, discard: str = "row") -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020; see `analysis.rollout.rollout_matrix`, both discard rules)
    read out for one query, as (grid_h, grid_w).

    The readout is the query's row of R = A_{end-1} ... A_start, so it is computed as the row vector
    v^T A_{end-1} ... A_start from the last layer back: N^2 operations per layer instead of N^3. Only the
    rows i of A_l with v_i != 0 enter v^T A_l, and everything but the whole-matrix discard is local to a
    row (the per-row discard, the residual, the renormalisation), so only those rows are rebuilt from the
    store: one row of the last layer for a class or patch query, a growing set under a large per-row
    ``discard_ratio``, at most the whole layer (the attention part of one forward pass in all). The
    whole-matrix discard ranks all N^2 entries of a layer, so that rule rebuilds every layer in full.

    Rows the query never reaches are not built, so a row left with no attention there (possible only
    without the residual) is no error; on a row that is reached it is, as in `rollout_matrix`.
    """
    check_options(discard_ratio, discard)
    if store.num_tokens != layout.num_tokens:
        raise ValueError(f"attention has {store.num_tokens} tokens, layout has {layout.num_tokens}")
    layers = range(store.depth)[start_layer:end_layer]
    if len(layers) == 0:
        raise ValueError(f"no layers selected by start_layer={start_layer}, end_layer={end_layer} of depth {store.depth}")
    keep = layout.class_token_index
    vector = query_vector(layout, query)  # (N,)
    for layer in reversed(layers):
        if discard_ratio > 0 and discard == "matrix":  # ranks all N^2 entries: the whole layer, (N, N)
            vector = vector_times_layer(vector, store.fused_layer(layer, head_fusion), layer, discard_ratio,
                                        discard, residual, keep)
            continue
        tokens = np.flatnonzero(vector)  # the rows of A_layer that v^T A_layer reads
        product = np.zeros(store.num_tokens)  # (N,) v^T A_layer
        # max and min as float32 (their float16 values, exact): the discard ranks half the bytes, the same mask
        for chunk, rows in store.fused_row_chunks(layer, tokens, head_fusion, exact_float32=True):  # (n,), (n, N)
            mask = row_discard_mask(rows, discard_ratio, keep) if discard_ratio > 0 else None
            rows = rows.astype(np.float64, copy=False)  # the products in float64, as before
            zero_masked(rows, mask)
            product += row_product(vector[chunk], chunk, rows, layer, residual)
        vector = product
    return layout.to_grid(layout.patches(vector))
