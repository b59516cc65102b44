"""Attention kept as queries and keys: a cached result that grows like depth x N x D, not depth x heads x N^2.

A ViT layer's attention probabilities are A_h = softmax(s * Q_h K_h^T) (Vaswani et al. 2017, Eq. 1, with
s = 1/sqrt(d) or the module's own scale) over the post-normalisation queries and keys of head h. Keeping
Q and K of every layer in float16 costs depth * 2 * N * D * 2 bytes; any row of any map is rebuilt on
demand in heads * N * d operations, a whole layer in heads * N^2 * d (the same work as that layer's
attention in the forward pass).

Where a whole image's float16 maps are small in bytes (`keeps_maps`: at most MAPS_IN_MEMORY_BYTES, e.g.
DeiT-Ti/16 at 224 px, 2.8 MB) they are kept as such instead: nothing to rebuild, check or spill, the same
constant bound for every input that small, and Q/K from there on, so the growth stays depth x N x D.

Whether a model really computes attention that way is checked during the pass: a sample of rows is
rebuilt from the recorded Q and K and compared with the probabilities the model produced. When they
differ by more than the tolerance (rotary embeddings, attention biases, extreme logits that float16 cannot
carry) the store keeps Q and K in float32, and failing that the maps themselves in float16, so results
never silently change.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
from torch import nn

from vit_inspect.analysis.attention_distance import patch_distances
from vit_inspect.analysis.attention_maps import Query
from vit_inspect.analysis.rollout import (HEAD_FUSIONS, check_options, row_discard_mask, row_product,
                                          vector_times_layer, zero_masked)
from vit_inspect.core.errors import CaptureError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.tokens import TokenLayout
from vit_inspect.passes.spill import Spill

ROWS_CHECKED = 16  # rows per layer compared with the model's own probabilities during the pass
TOLERANCE = 2e-3  # max |rebuilt - recorded| probability accepted (float16 maps carry up to 4.9e-4 rounding)
HALF_PASS_TOLERANCE = 3e-2  # under autocast the recorded maps are themselves half precision
CHUNK_BYTES = 8 * 2 ** 20  # transient float32 block per row chunk of a rebuild (larger blocks cost page faults)
# Rows rebuilt per product at least. The BLAS (MKL here) computes 1-3 rows as matrix-vector products, in
# another summation order than a matrix product's: a score's last bit moves and, rarely, a probability's
# float16 rounding with it, which could change what rollout's discard ranks. From 4 rows on, each row's
# values are those of the whole layer (tests/passes/test_store_rollout.py pins it).
ROW_BLOCK = 8
TORCH_ROWS = 16  # stored rows fused at once from which torch's float16 conversion beats numpy's (`_fused_stored_rows`)
CHECK_BYTES = 32 * 2 ** 20  # layers whose Q/K check waits to run batched hold at most about this much
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
    # the model's own float16 maps on local disk (`spill.Spill`), read instead of rebuilt while alive; not
    # counted by nbytes (disk, under the spill folder's budget), not pickled
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

    def _half_rows(self, layer: int, index: np.ndarray, keys_t: torch.Tensor) -> torch.Tensor:
        """(heads, len(index), N) float16 probabilities of query rows ``index``, rebuilt from Q and K."""
        # at least ROW_BLOCK rows per product: a row's values then do not depend on which rows come with it
        padded = np.concatenate([index, np.full(max(0, ROW_BLOCK - len(index)), index[-1] if len(index) else 0)])
        queries = torch.from_numpy(self.queries[layer][:, padded]).float()  # (heads, max(n, ROW_BLOCK), d)
        return _probabilities(queries, keys_t, float(self.scale[layer]))[:, :len(index)]

    def _stored_rows(self, layer: int, index: np.ndarray) -> np.ndarray | None:
        """(heads, len(index), N) float16 rows of one layer kept as such (the maps fallback, or read from a
        live spill), else None."""
        if self.maps is not None:
            return _take_rows(self.maps[layer], index)
        return None if self.spill is None else self.spill.rows(layer, index)

    def rows(self, layer: int, tokens) -> np.ndarray:
        """(heads, len(tokens), N) float32 attention probabilities of query tokens ``tokens`` of one layer,
        rounded to float16 values: the numbers a stack of float16 maps holds, so rankings (rollout's
        ``discard_ratio``) break ties the same way. Read from the stored or spilled maps when there are
        any, else rebuilt from Q and K."""
        self._check_layer(layer)
        index = np.asarray(tokens, dtype=np.int64).reshape(-1)
        stored = self._stored_rows(layer, index)
        if stored is not None:  # exact either way; torch converts many float16 rows faster (`_fused_stored_rows`)
            return stored.astype(np.float32) if len(index) < TORCH_ROWS else torch.from_numpy(stored).float().numpy()
        return self._half_rows(layer, index, self._keys_t(layer)).float().numpy()

    def _chunk_rows(self) -> int:
        """Rows per chunk whose (heads, rows, N) float32 block stays under CHUNK_BYTES."""
        return max(1, CHUNK_BYTES // (4 * self.num_heads * self.num_tokens))

    def _chunk_slices(self) -> Iterator[slice]:
        """Row ranges whose (heads, rows, N) float32 block stays under CHUNK_BYTES."""
        step = self._chunk_rows()
        for start in range(0, self.num_tokens, step):
            yield slice(start, min(start + step, self.num_tokens))

    def row_chunks(self, layer: int) -> Iterator[tuple[slice, np.ndarray]]:
        """(rows, (heads, len(rows), N) float32) blocks of one layer, each under CHUNK_BYTES."""
        for rows in self._chunk_slices():
            yield rows, self.rows(layer, np.arange(rows.start, rows.stop))

    def layer(self, layer: int) -> np.ndarray:
        """(heads, N, N) float32 probabilities of one layer, rows = queries."""
        return self.rows(layer, np.arange(self.num_tokens))

    def fused_row_chunks(self, layer: int, tokens, head_fusion: str = "mean") -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(chunk of ``tokens``, (len(chunk), N) float64) blocks: those query rows of one layer with the heads
        fused by ``head_fusion`` ("mean", "max", "min"), rebuilt a chunk under CHUNK_BYTES at a time.

        The values are those of `rows` (float16-valued probabilities): max and min are exact, the mean
        sums the heads in float32 (|error| < 1e-7 of a probability) from Q and K or a spill, in float64 from
        stored maps."""
        if head_fusion not in HEAD_FUSIONS:
            raise ValueError(f"unknown head_fusion {head_fusion!r}; choose one of {sorted(HEAD_FUSIONS)}")
        self._check_layer(layer)
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        step = self._chunk_rows()
        # a spill is read once per layer, the rows wanted only: a drop while the chunks are fused is harmless
        spilled = self.spill.rows(layer, tokens) if self.maps is None and self.spill is not None else None
        keys_t = self._keys_t(layer) if self.maps is None and spilled is None else None  # converted once per layer
        for start in range(0, len(tokens), step):
            chunk = tokens[start:start + step]
            if self.maps is not None:
                yield chunk, _fused_stored_rows(self.maps[layer], chunk, head_fusion)
                continue
            if spilled is not None:  # the model's own float16 rows, fused exactly as rebuilt ones are
                half = torch.from_numpy(np.ascontiguousarray(spilled[:, start:start + step]))  # (heads, n, N) float16
            else:
                half = self._half_rows(layer, chunk, keys_t)  # (heads, n, N) float16
            if head_fusion == "mean":  # the float32 sum divided in float64, one pass
                yield chunk, np.divide(half.float().sum(0).numpy(), half.shape[0], dtype=np.float64)
            else:
                # exact; float16 -> float32 -> float64 is 3x faster in torch than float16 -> float64
                yield chunk, (half.amax(0) if head_fusion == "max" else half.amin(0)).float().double().numpy()

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


def attention_rows(store: AttentionStore, layout: TokenLayout, layer: int, query: Query = None) -> np.ndarray:
    """(heads, N) float32 attention of every head of one layer from a query (`query_vector`), over all N
    keys, prefix tokens included; the rows of `analysis.attention_map`'s matrix before `readout` drops
    the prefix keys. A single-token query rebuilds one row (heads * N * d operations); "mean" rebuilds the
    layer chunk by chunk."""
    store._check_layer(layer)
    weights = query_vector(layout, query)
    tokens = np.flatnonzero(weights)
    if len(tokens) == 1:
        return store.rows(layer, tokens)[:, 0]
    rows = np.zeros((store.num_heads, store.num_tokens))
    for chunk, block in store.row_chunks(layer):  # (heads, n, N)
        rows += np.einsum("n,hnk->hk", weights[chunk], block)
    return rows.astype(np.float32)


def attention_map(store: AttentionStore, layout: TokenLayout, layer: int, head: int | None = None,
                  query: Query = None) -> np.ndarray:
    """(grid_h, grid_w) raw attention of one layer and head (None: mean of heads) from a query token;
    the same values as `analysis.attention_map` on the full maps (see `attention_rows`)."""
    store._check_layer(layer)
    if head is not None and not 0 <= head < store.num_heads:
        raise ValueError(f"head {head} out of range: layer {layer} has {store.num_heads} heads (0..{store.num_heads - 1})")
    rows = attention_rows(store, layout, layer, query)  # (heads, N)
    row = rows.mean(axis=0) if head is None else rows[head]
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
        for chunk, rows in store.fused_row_chunks(layer, tokens, head_fusion):  # (n,), (n, N)
            if discard_ratio > 0:
                zero_masked(rows, row_discard_mask(rows, discard_ratio, keep))
            product += row_product(vector[chunk], chunk, rows, layer, residual)
        vector = product
    return layout.to_grid(layout.patches(vector))


# ------------------------------------------------------------------------------------------------ the pass

def _qk_modules(attn: nn.Module) -> tuple[nn.Module, nn.Module, str, float] | None:
    """(query module, key module, output layout, scale) of one attention module, or None if unknown.

    timm `Attention`: the outputs of ``q_norm``/``k_norm`` (Identity without qk-norm), (B, heads, N, d),
    scale ``attn.scale``. Hugging Face: ``q_proj``/``k_proj`` (or ``query``/``key``), (B, N, heads * d),
    scale ``scaling``."""
    if hasattr(attn, "q_norm") and hasattr(attn, "k_norm") and hasattr(attn, "scale"):
        return attn.q_norm, attn.k_norm, "bhnd", float(attn.scale)
    inner = getattr(attn, "attention", attn)
    for q_name, k_name in (("q_proj", "k_proj"), ("query", "key")):
        q, k = getattr(inner, q_name, None), getattr(inner, k_name, None)
        if isinstance(q, nn.Module) and isinstance(k, nn.Module):
            heads = getattr(inner, "num_attention_heads", None) or getattr(getattr(inner, "config", None),
                                                                           "num_attention_heads", None)
            head_dim = getattr(inner, "head_dim", None) or getattr(inner, "attention_head_size", None)
            if heads is None or head_dim is None:
                return None
            scale = getattr(inner, "scaling", None) or head_dim ** -0.5
            return q, k, f"bn(hd):{int(heads)}", float(scale)
    return None


@dataclass(eq=False)
class _Pending:
    """One layer waiting for `LayerStream._flush`: its maps (for the fallback), Q and K of image 0 as the model
    made them and the sampled rows of its maps (None when Q/K were not recorded or the maps are not
    (B, heads, N, N)), all on the model's device."""

    layer: int
    maps: torch.Tensor  # (heads, N, N) as the model produced them
    queries: torch.Tensor | None = None  # (heads, N, d) in the model's dtype
    keys: torch.Tensor | None = None
    real: torch.Tensor | None = None  # (heads, n, N) float32 sampled rows

    def nbytes(self, held_by_autograd: bool = False) -> int:
        """Bytes it keeps alive, or with gradients (the backward keeps the maps, Q and K anyway) the bytes
        the check will copy: Q, K and the sampled rows."""
        held = (self.queries, self.keys, self.real) if held_by_autograd else (self.maps, self.queries, self.keys,
                                                                             self.real)
        return sum(t.untyped_storage().nbytes() for t in held if t is not None)


def _rebuild_errors(queries: torch.Tensor, keys: torch.Tensor, scale: torch.Tensor, real: torch.Tensor,
                    sample: torch.Tensor) -> torch.Tensor:
    """(L,) max |softmax(s_l * q kᵀ) - recorded| over the sampled rows of L layers of one shape, computed in
    float32 from (L, heads, N, d) queries and keys already rounded to the stored dtype, (L,) scales s_l
    and (L, heads, n, N) recorded rows."""
    chosen = queries.index_select(2, sample).float()  # (L, heads, n, d)
    scores = torch.matmul(chosen, keys.float().transpose(-1, -2))  # (L, heads, n, N)
    rebuilt = torch.softmax(scores * scale.to(scores.dtype).view(-1, 1, 1, 1), dim=-1)
    return (rebuilt - real).abs().amax(dim=(1, 2, 3))


class LayerStream:
    """Consumes each layer's probabilities as the forward pass produces them, then lets them go.

    Per layer: records Q and K (hooks), checks a sample of rebuilt rows against the real probabilities,
    and reduces the maps to each query's distance sums for the mean attention distance (`distances_per_image`),
    finished for every layer at once by `mean_distance`. Only one layer's float32 maps are alive at a time,
    so the pass never holds depth x heads x N^2 float32 values (with ``keep_maps``, a small model's float16
    maps of every layer, `keeps_maps`).

    Everything stays on the model's device until `store` copies the result to the host once, already compact:
    no layer crosses to the host on its own. The check's verdicts are the only values read back before then,
    a few numbers per `_flush`. ``held_by_autograd`` (a pass with gradients, whose backward keeps every
    layer's maps, Q and K anyway) counts only what the check copies (Q, K, sampled rows) toward CHECK_BYTES,
    so such a pass checks several layers at a time even where one layer's maps pass the bound.
    """

    def __init__(self, handle: ViTHandle, layout: TokenLayout, tolerance: float = TOLERANCE,
                 spill: Spill | None = None, keep_maps: bool = False, held_by_autograd: bool = False):
        self.handle = handle
        self.layout = layout
        self.tolerance = tolerance
        self.spill = spill  # each layer's maps of image 0 are written there too, as float16
        self.depth = handle.depth
        # `keeps_maps`: every layer's maps of image 0 go into one float16 array, no Q/K is recorded or checked
        self.keep_maps = keep_maps
        self.held_by_autograd = held_by_autograd
        self._kept: torch.Tensor | None = None  # (depth, heads, N, N) float16 on the maps' device, made on the first layer
        self._kept_layers: set[int] = set()
        # the query and key modules each layer's Q/K are recorded from (none when the maps themselves are kept)
        self.modules = [None] * self.depth if keep_maps else [_qk_modules(a) for a in handle.attention_modules]
        self._q: dict[int, torch.Tensor] = {}
        self._k: dict[int, torch.Tensor] = {}
        # per layer, on the model's device: Q and K rounded to the dtype that passed the check, or the float16
        # maps of a layer that failed it
        self.queries: list[torch.Tensor | None] = [None] * self.depth
        self.keys: list[torch.Tensor | None] = [None] * self.depth
        self.maps: list[torch.Tensor | None] = [None] * self.depth  # kept only for layers that failed the check
        self.errors = np.zeros(self.depth)
        # per layer, image 0: sum_j a_ij d_ij and sum_j a_ij over patch keys j, (heads, P) float32 each
        self._distance_sums: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.depth
        self._patch_distances: torch.Tensor | None = None  # (P, P) float32 pixels, made on the first layer
        self._pending: list[_Pending] = []  # layers whose check waits for `_flush`
        self._pending_bytes = 0
        self._samples: dict[tuple, torch.Tensor] = {}  # (N, device) -> the rows the check compares

    def _record(self, into: dict, layer: int, tensor: object, shape: str) -> None:
        """Keep a (B, heads, N, d) view of a query/key output; anything else is left out (maps fallback)."""
        if not isinstance(tensor, torch.Tensor):
            return
        tensor = tensor.detach()
        if shape != "bhnd":
            heads = int(shape.split(":")[1])
            if tensor.ndim != 3 or tensor.shape[-1] % heads:
                return
            tensor = tensor.reshape(tensor.shape[0], tensor.shape[1], heads, -1).transpose(1, 2)
        if tensor.ndim == 4:
            into[layer] = tensor

    @contextmanager
    def hooks(self) -> Iterator["LayerStream"]:
        """Forward hooks on every layer's query and key modules, removed on leaving."""
        handles = []
        try:
            for i, found in enumerate(self.modules):
                if found is None or self.keep_maps:
                    continue
                q_module, k_module, shape, _ = found
                handles.append(q_module.register_forward_hook(
                    lambda m, a, out, i=i, s=shape: self._record(self._q, i, out, s)))
                handles.append(k_module.register_forward_hook(
                    lambda m, a, out, i=i, s=shape: self._record(self._k, i, out, s)))
            yield self
        finally:
            for h in handles:
                h.remove()

    def on_attention(self, layer: int, probs: torch.Tensor) -> None:
        """Called with (B, heads, N, N) probabilities of `layer` (image 0 is kept and reduced).

        Its distance sums are taken now. With ``keep_maps`` its maps are copied, rounded to float16, into the
        store's array, and that is all. Otherwise the check of Q and K waits in `_pending` (this layer's float32 Q
        and K, the sampled rows of its maps and a reference to the maps for the fallback) until those hold
        CHECK_BYTES, then runs for every waiting layer at once (`_flush`): a few batched products instead
        of a dozen small ones per layer. A layer whose maps alone pass the bound is checked at once, so
        the pass never holds more than one layer's maps beyond the bound."""
        probs = probs.detach()
        self._distance_sums[layer] = self._distance_sums_of(probs[0].float())
        if self.keep_maps:
            if self._kept is None:  # on the host directly when the model runs there: `store` then copies nothing
                self._kept = torch.empty((self.depth, *probs.shape[1:]), dtype=torch.float16, device=probs.device)
            self._kept[layer].copy_(probs[0])  # rounded to float16 by torch, as numpy rounds
            self._kept_layers.add(layer)
            return
        if self.spill is not None and probs.ndim == 4 and tuple(probs.shape[1:]) == self.spill.shape[1:]:
            self.spill.write(layer, probs[0].to(torch.float16).cpu().numpy())  # torch rounds as numpy does, faster
        q, k = self._q.pop(layer, None), self._k.pop(layer, None)
        found = self.modules[layer]
        maps = probs[0]  # (heads, N, N), what the maps fallback keeps (a view: no copy)
        entry = _Pending(layer, maps)
        if q is not None and k is not None and found is not None and probs.ndim == 4:
            entry.queries, entry.keys = q[0], k[0]  # (heads, N, d), on the device, no copy
            entry.real = maps.index_select(1, self._sample(maps.shape[-1], maps.device)).float()  # (heads, n, N)
        self._pending.append(entry)
        self._pending_bytes += entry.nbytes(self.held_by_autograd)
        if self._pending_bytes >= CHECK_BYTES:
            self._flush()

    def _sample(self, num_tokens: int, device: torch.device) -> torch.Tensor:
        """The (n,) query rows compared: ROWS_CHECKED evenly spaced, first and last included."""
        key = (num_tokens, str(device))
        if key not in self._samples:
            self._samples[key] = torch.from_numpy(
                np.unique(np.linspace(0, num_tokens - 1, min(ROWS_CHECKED, num_tokens)).astype(np.int64))).to(device)
        return self._samples[key]

    def _flush(self) -> None:
        """Check every waiting layer: its Q and K in float16, else float32, rebuild the sampled rows within
        the tolerance (`_rebuild_errors`; layers of one shape are checked together, both dtypes in one batch
        each, on the model's device); a layer neither reproduces keeps its maps in float16. One small copy
        per group of layers brings the verdicts to the host."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        groups: dict[tuple, list[_Pending]] = {}
        for entry in pending:
            if entry.real is not None and entry.queries.shape == entry.keys.shape \
                    and entry.queries.shape[0] == entry.real.shape[0] and entry.queries.shape[1] == entry.real.shape[-1]:
                groups.setdefault((entry.queries.shape, entry.real.shape), []).append(entry)
            # otherwise: no Q/K recorded, or Q/K that do not match the maps' heads and tokens: keep the maps
        passed: set[int] = set()
        for group in groups.values():
            queries, keys = torch.stack([e.queries for e in group]), torch.stack([e.keys for e in group])  # (L, heads, N, d)
            largest = torch.maximum(queries.abs().amax(dim=(1, 2, 3)), keys.abs().amax(dim=(1, 2, 3))).float()  # (L,)
            scale = torch.tensor([self.modules[e.layer][3] for e in group], device=queries.device)  # (L,)
            real = torch.stack([e.real for e in group])  # (L, heads, n, N)
            sample = self._sample(real.shape[-1], real.device)
            rounded = {dtype: (queries.to(dtype), keys.to(dtype)) for dtype in (torch.float16, torch.float32)}
            # each dtype's errors, and whether its range carries the values (float16 overflows past 65504; NaN
            # fails too), computed on the device and read back together: a (4, L) float64 array
            verdicts = torch.stack([torch.stack([_rebuild_errors(*rounded[dtype], scale, real, sample).double(),
                                                 (largest <= torch.finfo(dtype).max).double()])
                                    for dtype in (torch.float16, torch.float32)]).cpu().numpy()  # (2, 2, L)
            for i, entry in enumerate(group):
                for trial, dtype in enumerate((torch.float16, torch.float32)):
                    error, fits = verdicts[trial, 0, i], verdicts[trial, 1, i]
                    if not fits:
                        continue
                    self.errors[entry.layer] = error
                    if error <= self.tolerance:
                        passed.add(entry.layer)
                        self.queries[entry.layer], self.keys[entry.layer] = rounded[dtype][0][i], rounded[dtype][1][i]
                        break
        for entry in pending:
            if entry.layer not in passed:
                self.maps[entry.layer] = entry.maps.to(torch.float16)  # rounded once by torch, on the device

    def _distance_sums_of(self, maps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(heads, N, N) float32 probabilities -> ((heads, P) sum_j a_ij d_ij, (heads, P) sum_j a_ij) over patch
        queries i and patch keys j, d in pixels: float32 products and torch's cascaded float32 sums, on the maps'
        device; `mean_distance` finishes them in float64. No float64 copy of the maps, no sync per layer."""
        patch = self.layout.patch_slice
        patch_to_patch = maps[..., patch, patch]  # (heads, P, P), a view
        if self._patch_distances is None:
            self._patch_distances = torch.tensor(patch_distances(self.layout), dtype=torch.float32, device=maps.device)
        return (patch_to_patch * self._patch_distances).sum(-1), patch_to_patch.sum(-1)

    def mean_distance(self) -> np.ndarray:
        """(depth, heads) mean attention distance in pixels of image 0: `distances_per_image` (renormalised over
        patch keys) from each layer's sums, the division and the mean over queries in float64."""
        missing = [i for i, sums in enumerate(self._distance_sums) if sums is None]
        if missing:
            raise CaptureError(f"No attention was recorded for layer(s) {missing}: cannot give the mean distance.")
        per_query = torch.stack([sums[0] for sums in self._distance_sums]).double()  # (depth, heads, P)
        mass = torch.stack([sums[1] for sums in self._distance_sums]).double()
        if bool((mass <= 0).any()):
            raise ValueError("a patch query puts no attention on patch keys; cannot renormalise over patches")
        return (per_query / mass).mean(-1).cpu().numpy()

    def store(self) -> AttentionStore:
        """The compact store, copied to the host at once: float16 Q/K when every layer passed, float32 Q/K
        when some needed it, the float16 maps when any layer could not be rebuilt at all. A spill the stream
        wrote goes with Q/K stores (`AttentionStore.spill`) and is dropped with the maps fallback. With
        ``keep_maps``, the maps as recorded."""
        if self.keep_maps:
            missing = sorted(set(range(self.depth)) - self._kept_layers)
            if missing:
                raise CaptureError(f"No attention was recorded for layer(s) {missing} of {self.depth}.")
            kept, self._kept = self._kept.cpu().numpy(), None
            return AttentionStore("maps", None, None, None, kept, 0.0)
        self._flush()
        max_error = float(self.errors.max()) if self.depth else 0.0
        if any(m is not None for m in self.maps) or any(q is None for q in self.queries):
            if self.spill is not None:  # the maps are kept in memory: no spill needed
                self.spill.discard()
            maps = [m if m is not None else torch.softmax(
                        float(self.modules[i][3]) * (self.queries[i].float() @ self.keys[i].float().transpose(-1, -2)),
                        dim=-1).to(torch.float16)
                    for i, m in enumerate(self.maps)]
            stacked = torch.stack(maps).cpu().numpy()
            self.queries, self.keys, self.maps = [None] * self.depth, [None] * self.depth, [None] * self.depth
            return AttentionStore("maps", None, None, None, stacked, max_error)
        half = all(q.dtype == torch.float16 for q in self.queries)
        dtype = torch.float16 if half else torch.float32
        scale = np.array([found[3] for found in self.modules], dtype=np.float64)
        spill = self.spill if self.spill is not None and self.spill.finish() else None  # all layers written
        queries, keys = torch.stack(self.queries).to(dtype).cpu().numpy(), torch.stack(self.keys).to(dtype).cpu().numpy()
        self.queries, self.keys = [None] * self.depth, [None] * self.depth  # the device copies go before the backward
        return AttentionStore("qk16" if half else "qk32", queries, keys, scale, None, max_error, spill)
