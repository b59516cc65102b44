"""Class-specific gradient rollout kept within the result's depth x N x D bound.

vit-explain's gradient rollout (Gildenblat 2020; `analysis.rollout.gradient_rollout`) rolls out, per
layer, G_l = max(0, mean_h(A_lh * dy/dA_lh)) (`analysis.gradient_fused_attention`). Kept as a stack, G is
depth x N^2 float16 values: it grows with N^2, which the attention store avoids. So a result keeps one of
two things, chosen in the pass:

- the stack G (float16) while its bytes are at most KEEP_FRACTION times
  the attention store's bytes (for a float16 query/key store: N <= 2 D, e.g. ViT-B/16 up to 1536 tokens,
  every model and input of BENCHMARKS.md's table). Any option is then rolled out on demand;
- otherwise the rollout readout for every option value the app offers, computed in the pass:
  discard ratios DISCARD_RATIOS, both discard rules, every (first layer, last layer) range, residual on,
  the model's readout query. That is 39 x depth (depth + 1) / 2 maps of P patches (float32): it grows
  like depth^2 x N, not N^2. An option outside that grid is refused with a sentence.

Both give the values of `analysis.gradient_rollout` on the float16 stack: the same float16 G, the same
discard (ties included) and the same arithmetic, read out as the query's row (v^T G'_{end-1} ... G'_start,
N^2 operations per layer instead of N^3).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from vit_inspect.analysis.attention_maps import Query
from vit_inspect.analysis.rollout import DISCARDS, check_options, prepare_layer, vector_times_layer
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.tokens import TokenLayout
from vit_inspect.passes.attention_store import query_vector

KEEP_FRACTION = 1.0  # G is kept while depth * N^2 * 2 bytes <= KEEP_FRACTION * the attention store's bytes
DISCARD_RATIOS = tuple(round(0.05 * i, 2) for i in range(20))  # the app's discard slider: 0 to 0.95 by 0.05


@dataclass(frozen=True)
class GradientRollouts:
    """Everything a result needs for class-specific gradient rollout: ``fused`` (depth, N, N) float16
    G_l, or ``maps`` {(discard_ratio, discard, start_layer, end_layer): (grid_h, grid_w) float32} for
    ``query`` (end_layer exclusive), see the module docstring."""

    depth: int
    query: Query  # the readout the maps were computed for
    fused: np.ndarray | None = field(default=None, repr=False)
    maps: dict | None = field(default=None, repr=False)

    def nbytes(self) -> int:
        if self.fused is not None:
            return self.fused.nbytes
        return sum(m.nbytes for m in self.maps.values())

    def rollout(self, layout: TokenLayout, discard_ratio: float = 0.9, start_layer: int = 0,
                end_layer: int | None = None, query: Query = None, discard: str = "matrix") -> np.ndarray:
        """(grid_h, grid_w) gradient rollout with residual (vit-explain) for layers start_layer..end_layer-1."""
        check_options(discard_ratio, discard)
        layers = range(self.depth)[start_layer:end_layer]
        if len(layers) == 0:
            raise ValueError(f"no layers selected by start_layer={start_layer}, end_layer={end_layer} "
                             f"of depth {self.depth}")
        query = self.query if query is None else query
        if self.fused is not None:
            vector = query_vector(layout, query)  # (N,)
            for layer in reversed(layers):  # v^T prepare_layer(G_l) without forming the prepared matrix
                vector = vector_times_layer(vector, _as_float64(self.fused[layer]), layer, discard_ratio,
                                            discard, True, layout.class_token_index)
            return layout.to_grid(layout.patches(vector))
        ratio = min(DISCARD_RATIOS, key=lambda r: abs(r - discard_ratio))
        key = (ratio, discard if ratio > 0 else DISCARDS[0], layers.start, layers.stop)
        if abs(ratio - discard_ratio) > 1e-9 or query != self.query or key not in self.maps:
            raise VitInspectError(
                "For this large input the gradient rollout was kept only for discard ratios 0 to 0.95 in steps "
                f"of 0.05 and the model's own readout ({self.query}); choose one of those.")
        return self.maps[key].copy()


def _as_float64(half: np.ndarray) -> np.ndarray:
    """A float16 array as float64, exactly: through float32 in torch, several times faster than numpy's
    float16 conversion (0.04 against 0.17 ms for one of DeiT-Ti's (197, 197) layers)."""
    return torch.from_numpy(np.require(half, requirements=["W"])).float().double().numpy()


def gradient_rollouts(fused_layer: Callable[[int], np.ndarray], depth: int, layout: TokenLayout, query: Query,
                      keep_stack: bool) -> GradientRollouts:
    """Build a result's `GradientRollouts` from ``fused_layer(l)``: (N, N) float64 G_l of layer l.

    ``keep_stack``: keep the float16 stack; otherwise compute every option of the app's grid in one
    sweep from the last layer down, holding one layer's G at a time and, per option, one row vector per
    last layer."""
    if keep_stack:
        return GradientRollouts(depth, query, fused=np.stack([fused_layer(l).astype(np.float16)
                                                              for l in range(depth)]))
    options = [(0.0, DISCARDS[0])] + [(r, d) for r in DISCARD_RATIOS if r > 0 for d in DISCARDS]
    start = query_vector(layout, query)  # (N,)
    vectors = {option: np.empty((0, layout.num_tokens)) for option in options}  # rows: last layers above
    maps = {}
    for layer in reversed(range(depth)):
        fused = fused_layer(layer).astype(np.float16).astype(np.float64)  # the values the stack would keep
        for ratio, discard in options:
            prepared = prepare_layer(fused, layer, ratio, discard, True, layout.class_token_index)
            rows = np.vstack([start, vectors[(ratio, discard)]]) @ prepared  # row i: end layer layer + 1 + i
            vectors[(ratio, discard)] = rows
            for i, row in enumerate(rows):
                maps[(ratio, discard, layer, layer + 1 + i)] = layout.to_grid(layout.patches(row)).astype(np.float32)
    return GradientRollouts(depth, query, maps=maps)
