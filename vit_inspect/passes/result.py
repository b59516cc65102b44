"""`ImageAnalysis`: the cached result of one pass over one image, plain arrays only."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from vit_inspect.core.geometry import enlarged_blur
from vit_inspect.core.prompts import Prompt
from vit_inspect.core.tokens import TokenLayout
from vit_inspect.passes.attention_store import AttentionStore, attention_rows
from vit_inspect.passes.attention_store import attention_map as store_attention_map
from vit_inspect.passes.attention_store import rollout as store_rollout
from vit_inspect.passes.gradient_rollouts import GradientRollouts
from vit_inspect.passes.head_pass import HeadPass


@dataclass(frozen=True)
class ImageAnalysis:
    """The cached result of one pass over one image: everything the maps need, no tensors.

    Attention is held by an `AttentionStore` (per layer the queries and keys in float16, depth x N x D)
    and every map is rebuilt from it on demand; what needs all maps at once (mean distance, Chefer
    relevance) was computed during the pass. Rollouts are cached per option (`ROLLOUT_CACHE` entries).
    """

    model_name: str
    layout: TokenLayout  # token geometry of this input size
    rgb: np.ndarray  # (H, W, 3) uint8, the exact crop the model saw
    probs: np.ndarray  # (num_classes,) float32 softmax; empty for a model without a head
    attention_store: AttentionStore  # every layer's attention, rebuilt on demand
    mean_distance: np.ndarray  # (depth, heads) mean attention distance in input pixels
    target: int | None  # class the gradients were taken for; None without a head
    gradcam: np.ndarray | None  # (depth, grid_h, grid_w) raw Grad-CAM at each block's first LayerNorm
    chefer: np.ndarray | None  # (grid_h, grid_w) gradient-weighted attention relevance (Chefer et al. 2021)
    readout: str  # "class" (class-token readout) or "mean" (mean over patch tokens)
    heads: HeadPass | None = None  # logit lens, token norms and per-head statistics of this pass
    legrad: np.ndarray | None = None  # (grid_h, grid_w) LeGrad (Bousselham et al. 2025), last LEGRAD_LAYERS layers
    attnlrp: np.ndarray | None = None  # (grid_h, grid_w) AttnLRP relevance per patch (Achtibat et al. 2024)
    patch_features: np.ndarray | None = None  # (grid_h, grid_w, D) float16 last block's output patch tokens
    contrast: int | None = None  # gradients are of logit[target] - logit[contrast]; None: of logit[target]
    gradient: GradientRollouts | None = None  # class-specific gradient rollout (vit-explain), within the N x D bound
    geometry: str = "crop"  # `InputGeometry.mode` the input was made with
    seen_box: tuple[float, float, float, float] | None = None  # (left, top, right, bottom) of the upload seen, pixels
    preview: np.ndarray | None = None  # (h, w, 3) uint8 the whole upload, longer side at most PREVIEW_SIDE
    source_size: tuple[int, int] | None = None  # (width, height) of the upload, pixels
    prompt: Prompt | None = None  # the text target: `target` is its column of the zero-shot head
    versus: Prompt | None = None  # the text contrast: `contrast` is its column
    score: str = "logit"  # what the gradient maps explain: "logit", or "cosine" (image-text cosine similarity)
    # (depth, P, D) float16 every block's output patch tokens, where small (`block_tokens.keeps_block_tokens`)
    block_tokens: np.ndarray | None = None
    _rollouts: OrderedDict = field(default_factory=OrderedDict, compare=False, repr=False)  # options -> map
    # registered method -> its map at its default options for this pass (an array), None where the pass cannot
    # have it, or why it failed (`methods.MethodFailure`): filled once per method by `methods.compute_maps`.
    # Not an argument: a result made from another (`dataclasses.replace`, say with LeGrad added) starts empty.
    method_maps: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def enlarged_blur(self) -> str | None:
        """The sentence saying that the upload was too small for the model to see more than a blur of it
        (`geometry.enlarged_blur`); None for an image large enough, or an input given as pixels."""
        if self.source_size is None or self.preview is None:
            return None
        return enlarged_blur(self.source_size, (self.layout.patch_h, self.layout.patch_w))

    @property
    def depth(self) -> int:
        return self.attention_store.depth

    @property
    def num_heads(self) -> int:
        return self.attention_store.num_heads

    def attention_rows(self, layer: int, tokens) -> np.ndarray:
        """(heads, len(tokens), N) float32 attention probabilities of the query tokens (sequence indices)."""
        return self.attention_store.rows(layer, tokens)

    def attention_layer(self, layer: int) -> np.ndarray:
        """(heads, N, N) float32 attention probabilities of one layer, rows = queries (rebuilt)."""
        return self.attention_store.layer(layer)

    def attention_stack(self) -> np.ndarray:
        """(depth, heads, N, N) float16 every map at once: allocates all of it."""
        return self.attention_store.stack()

    def attention_map(self, layer: int, head: int | None = None, query=None) -> np.ndarray:
        """(grid_h, grid_w) raw attention of one layer/head (None: mean of heads) from a query token."""
        return store_attention_map(self.attention_store, self.layout, layer, head,
                                   self.readout if query is None else query)

    def rollout(self, head_fusion: str = "mean", discard_ratio: float = 0.0, residual: bool = True,
                start_layer: int = 0, end_layer: int | None = None, query=None, discard: str = "row") -> np.ndarray:
        """(grid_h, grid_w) attention rollout (Abnar & Zuidema 2020) with the given options (cached;
        ``discard``: "row" ours, "matrix" vit-explain's; see `analysis.rollout_matrix`)."""
        query = self.readout if query is None else query
        selected = range(self.depth)[start_layer:end_layer]
        key = (head_fusion, float(discard_ratio), bool(residual), selected.start, selected.stop, repr(query), discard)
        if key not in self._rollouts:
            self._rollouts[key] = store_rollout(self.attention_store, self.layout, head_fusion=head_fusion,
                                                discard_ratio=discard_ratio, residual=residual,
                                                start_layer=start_layer, end_layer=end_layer, query=query,
                                                discard=discard)
            while len(self._rollouts) > ROLLOUT_CACHE:
                self._rollouts.popitem(last=False)
        self._rollouts.move_to_end(key)
        return self._rollouts[key].copy()

    def gradient_rollout(self, discard_ratio: float = 0.9, start_layer: int = 0, end_layer: int | None = None,
                         query=None, discard: str = "matrix") -> np.ndarray | None:
        """(grid_h, grid_w) class-specific gradient rollout (vit-explain) for this result's target
        (and contrast); None for a model without a head. See `gradient_rollouts` for what is kept."""
        if self.gradient is None:
            return None
        return self.gradient.rollout(self.layout, discard_ratio, start_layer=start_layer, end_layer=end_layer,
                                     query=self.readout if query is None else query, discard=discard)

    def head_maps(self, layer: int, query=None) -> np.ndarray:
        """(heads, grid_h, grid_w) raw attention of every head of one layer from a query token."""
        rows = attention_rows(self.attention_store, self.layout, layer, self.readout if query is None else query)
        return np.stack([self.layout.to_grid(self.layout.patches(row)) for row in rows])

    def prefix_share(self, layer: int, head: int | None = None, query=None) -> dict[str, float]:
        """{prefix token name: share of the query's attention on it} for one layer and head (None: mean):
        the entries `analysis.prefix_shares` takes from the query's row, rebuilt from the store."""
        if head is not None and not 0 <= head < self.num_heads:
            raise ValueError(f"head {head} out of range: layer {layer} has {self.num_heads} heads (0..{self.num_heads - 1})")
        rows = attention_rows(self.attention_store, self.layout, layer, self.readout if query is None else query, head)
        row = rows.mean(axis=0) if head is None else rows[0]  # (N,)
        shares = self.layout.split(row.astype(np.float64))[0]
        return dict(zip(self.layout.prefix_names(), (float(v) for v in shares)))

    def attention_arrays(self, max_bytes: int = 64 * 2 ** 20) -> dict[str, np.ndarray]:
        """Arrays for a download: the (depth, heads, N, N) float16 maps when they fit in ``max_bytes``,
        otherwise what rebuilds them (queries, keys, scale: softmax(scale * q k^T) per layer and head)."""
        store = self.attention_store
        if store.maps is not None or store.depth * store.num_heads * store.num_tokens ** 2 * 2 <= max_bytes:
            return {"attention": store.stack()}
        return {"attention_queries": store.queries, "attention_keys": store.keys, "attention_scale": store.scale}

    def nbytes(self) -> int:
        """Memory held by the arrays of this result: its attention store, gradient rollout, LeGrad, AttnLRP,
        the patch features, every block's tokens, the preview, the head statistics and the cached rollouts included."""
        arrays = (self.rgb, self.probs, self.mean_distance, self.gradcam, self.chefer, self.legrad, self.attnlrp,
                  self.patch_features, self.block_tokens, self.preview, *self._rollouts.values(),
                  *(v for v in self.method_maps.values() if isinstance(v, np.ndarray)))
        return (self.attention_store.nbytes() + sum(a.nbytes for a in arrays if a is not None)
                + (self.gradient.nbytes() if self.gradient is not None else 0)
                + (self.heads.nbytes() if self.heads is not None else 0))

ROLLOUT_CACHE = 8  # rollout maps kept per result, least recently used dropped
