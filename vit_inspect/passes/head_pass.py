"""Per-head numbers recorded in the analysis pass itself: the logit lens, token output norms,
attention entropy, attention on prefix tokens and the first-order head importance.

`analyze_image` builds a `HeadPass` from what its one forward (and one backward) already recorded:
the residual stream after every block is read through the model's head (see `lens.lens_readouts`)
under `torch.no_grad()`; no extra pass through the blocks. The attention statistics are reduced layer
by layer as the pass produces each layer's maps (`HeadStatsStream`), so no (depth, heads, N, N) stack of
the maps or of their gradients is ever built for them. The attention entropy is computed from the result's
attention store when it is first read instead: only the `vit-inspect heads` record reads it, and its
per-element logarithm would be 2 % of DeiT-Ti's pass and 13 % of DINOv2-L/14's at 518 px.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vit_inspect.core.errors import CaptureError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.tokens import TokenLayout
from vit_inspect.passes.attention_store import AttentionStore
from vit_inspect.passes.capture import AttentionRecorder
from vit_inspect.passes.lens import NO_HEAD, lens_readouts, lens_tokens


@dataclass(frozen=True, eq=False)
class HeadPass:
    """Head-level numbers of one image's pass."""

    logits: np.ndarray  # (num_classes,) float32 model logits; empty without a head
    lens: dict[str, np.ndarray]  # readout name -> (depth, num_classes) float32 lens logits after each block
    lens_note: str  # why `lens` is empty ("" when it is not)
    token_norms: np.ndarray  # (depth, N) float32 L2 norm of every token after each block
    prefix_share: np.ndarray  # (depth, heads) mean fraction of attention on prefix tokens
    first_order: np.ndarray | None  # (depth, heads) sum_ij A dy/dA per head, logits; None without gradients
    # (depth, heads) float32 mean attention entropy given to the pass; None: from `store` on first read
    computed_entropy: np.ndarray | None = field(default=None, repr=False)
    # the result's attention store (the same object, not a copy), for `entropy`
    store: AttentionStore | None = field(default=None, repr=False)

    @property
    def entropy(self) -> np.ndarray:
        """(depth, heads) float32 mean attention entropy, nats (max ln N): `analysis.heads.head_entropy`.
        Computed on first read from the result's attention store, layer by layer (`AttentionStore.layer`:
        the kept float16 maps, or rows rebuilt from the stored queries and keys and rounded to float16), then
        kept. float16 holds each probability to 2^-11 of itself, which moves H_i by at most 2^-11 (H_i + 1)
        nats to first order (near-uniform rows, whose roundings do not cancel, come closest); rebuilt rows
        also differ from the model's by at most the store's ``max_error`` each. On DeiT-Ti's real weights
        the entropy differs from the float32 maps' by at most 1.5e-5 nats from kept maps, and by at most
        1.8e-4 nats at 448 px, where it is rebuilt (tests/passes/test_real_heads.py)."""
        if self.computed_entropy is None:
            if self.store is None:
                raise CaptureError("This pass recorded no attention entropy and keeps no attention to compute it from.")
            sums = [entropy_sums(torch.from_numpy(self.store.layer(i))) for i in range(self.store.depth)]
            object.__setattr__(self, "computed_entropy", mean_over_queries(sums, sign=-1.0))
        return self.computed_entropy

    def nbytes(self) -> int:
        """Bytes of its own arrays (`store` belongs to the result, which counts it)."""
        arrays = [self.logits, self.token_norms, self.computed_entropy, self.prefix_share, self.first_order,
                  *self.lens.values()]
        return sum(a.nbytes for a in arrays if a is not None)


def entropy_sums(maps: torch.Tensor) -> torch.Tensor:
    """(heads, N) float32 sum_j a_ij ln a_ij of (heads, N, N) float32 maps (0 ln 0 = 0), on their device: one
    buffer worked in place, with a clamped to the smallest normal first (a finite log, so that 0 * log = 0
    exactly)."""
    return maps.clamp_min(torch.finfo(maps.dtype).tiny).log_().mul_(maps).sum(-1)


def mean_over_queries(sums: list[torch.Tensor], sign: float = 1.0) -> np.ndarray:
    """(depth, heads) float32 ``sign`` x the means over queries, in float64, of every layer's (heads, N) sums."""
    means = torch.stack(sums).double().mean(-1)
    return (means * sign).cpu().numpy().astype(np.float32)


class HeadStatsStream:
    """Per-layer form of the attention statistics of image 0: `head_entropy` and `prefix_attention_share`
    of each layer's (heads, N, N) float32 maps as the pass produces them (in torch, on the maps' device) (`on_attention`, a
    `capture_attention` callback); `passes.pipeline.gradient_reductions` gives `first_order_importance` layer
    by layer after the backward. Each equals the stacked function's row for that layer (the reductions
    run over the last two axes only). With ``entropy=False`` the entropy is left to `HeadPass.entropy`."""

    def __init__(self, depth: int, layout: TokenLayout, entropy: bool = True) -> None:
        self.depth = depth
        self.layout = layout
        self.with_entropy = entropy
        # per layer, (heads, N) float32 sums over keys on the maps' device, finished for every layer at once
        self._entropy: list[torch.Tensor | None] = [None] * depth  # -sum_j a_ij ln a_ij, nats
        self._prefix: list[torch.Tensor | None] = [None] * depth  # sum over prefix keys j of a_ij
        self._row_parts: dict[int, tuple[list, list]] = {}  # layer -> per-block (entropy, prefix) sums (`on_rows`)

    def on_attention(self, layer: int, probs: torch.Tensor) -> None:
        """Reduce (B, heads, N, N) probabilities of `layer` (image 0) to per-query sums over keys: float32 sums,
        the means over queries in float64 when read (`entropy`, `prefix_share`), so nothing syncs per layer."""
        maps = probs[0].detach().float()  # (heads, N, N)
        if self.with_entropy:  # head_entropy: mean_i -sum_j a_ij ln a_ij, negated once for every layer in `entropy`
            self._entropy[layer] = entropy_sums(maps)
        # (heads, N) prefix_attention_share: the first num_prefix_tokens keys (`TokenLayout.split`'s prefix part)
        self._prefix[layer] = maps.narrow(-1, 0, self.layout.num_prefix_tokens).sum(-1)

    def on_rows(self, layer: int, start: int, block: torch.Tensor) -> None:
        """`on_attention` a block of query rows at a time (`capture.blocked_attention`): the (heads, b, N)
        probabilities of rows start .. start + b - 1 of image 0, their per-query sums kept until
        `on_layer_done` joins them in row order."""
        maps = block.detach().float()
        parts = self._row_parts.setdefault(layer, ([], []))
        if self.with_entropy:
            parts[0].append(entropy_sums(maps))
        parts[1].append(maps.narrow(-1, 0, self.layout.num_prefix_tokens).sum(-1))

    def on_layer_done(self, layer: int) -> None:
        """Every row of ``layer`` was given to `on_rows`: its (heads, N) sums, as `on_attention` makes them."""
        entropy, prefix = self._row_parts.pop(layer)
        if self.with_entropy:
            self._entropy[layer] = torch.cat(entropy, dim=-1)
        self._prefix[layer] = torch.cat(prefix, dim=-1)

    def _stacked(self, values: list[torch.Tensor | None], name: str, sign: float = 1.0) -> np.ndarray:
        """(depth, heads) float32 ``sign`` x the means over queries, in float64, of every layer's (heads, N) sums."""
        missing = [i for i, v in enumerate(values) if v is None]
        if missing:
            raise CaptureError(f"No attention was recorded for layer(s) {missing}: cannot give the per-head {name}.")
        return mean_over_queries(values, sign)  # type: ignore[arg-type]

    def entropy(self) -> np.ndarray:
        """(depth, heads) float32 mean attention entropy, nats (see `head_entropy`)."""
        return self._stacked(self._entropy, "entropy", sign=-1.0)

    def prefix_share(self) -> np.ndarray:
        """(depth, heads) float32 mean attention share on prefix tokens (see `prefix_attention_share`)."""
        return self._stacked(self._prefix, "prefix share")


LENS_BYTES = 16 * 2 ** 20  # float32 residual streams read through the head in one batch, at most


def _layer_blocks(residual: list[torch.Tensor]) -> list[torch.Tensor]:
    """Consecutive layers' (1, N, D) residual streams joined into (layers, N, D) batches of at most
    LENS_BYTES (at least one layer each): a dozen head calls become one for small models, and a large-token
    model never holds a second copy of its whole residual stream (DINOv2-L/14 at 518: 135 MB)."""
    step = max(1, LENS_BYTES // max(1, residual[0].nbytes)) if residual else 1
    return [torch.cat(residual[start:start + step]) for start in range(0, len(residual), step)]


def build_head_pass(handle: ViTHandle, rec: AttentionRecorder, logits: torch.Tensor, entropy: np.ndarray | None,
                    prefix_share: np.ndarray, first_order: np.ndarray | None, tolerance: float = 1e-3,
                    store: AttentionStore | None = None) -> HeadPass:
    """The `HeadPass` of image 0 of a pass recorded with ``capture_attention(..., residual=True)``.

    ``entropy``, ``prefix_share`` and ``first_order`` (None without gradients) are that image's
    (depth, heads) attention statistics, reduced per layer by a `HeadStatsStream`; ``entropy`` may be None
    when ``store`` (the result's attention store) is given to compute it from on first read. The lens is kept only
    if its reading after the last block reproduces the model's logits within `tolerance` times their
    largest magnitude.
    """
    residual = [rec.residual(i)[:1] for i in range(handle.depth)]  # (1, N, D) after each block
    tokens_read = lens_tokens(handle)  # the leading tokens the readouts read (0: all): only those are joined
    blocks = [torch.cat([r[:, :tokens_read].float() for r in residual])] if tokens_read \
        else _layer_blocks([r.float() for r in residual])  # (layers, tokens read, D) each
    model_logits = logits.detach()[0].float() if handle.has_head else torch.zeros(0)
    lens: dict[str, np.ndarray] = {}
    note = "" if handle.has_head else NO_HEAD
    readouts = lens_readouts(handle)
    if handle.has_head and not readouts:
        note = f"vit_inspect does not know how {handle.name!r} reads its tokens into its head, so it shows no logit lens."
    with torch.no_grad(), torch.autocast(handle.device.type, enabled=False):
        for name, read in readouts.items():
            lens[name] = torch.cat([read(block) for block in blocks]).cpu().numpy().astype(np.float32)  # (depth, C)
    if "readout" in lens:
        error = np.abs(lens["readout"][-1] - model_logits.cpu().numpy()).max()
        if error > tolerance * max(1.0, float(model_logits.abs().max())):
            lens, note = {}, (f"The lens after the last block differs from {handle.name!r}'s logits by {error:.3g}: "
                              "its head is not one vit_inspect can replay, so it shows no logit lens.")
    # kept in float32, so reduced in float32: `token_norms`' float64 accumulation would cost DeiT-Ti's pass 0.2-1.4 ms
    # (erratic) where this takes 0.1; the two differ by a few float32 units in the last place
    norms = torch.stack([torch.linalg.vector_norm(r[0].float(), dim=-1) for r in residual]).cpu().numpy()  # (depth, N)
    return HeadPass(
        logits=model_logits.cpu().numpy().astype(np.float32), lens=lens, lens_note=note, token_norms=norms,
        prefix_share=np.asarray(prefix_share, dtype=np.float32),
        first_order=None if first_order is None else np.asarray(first_order, dtype=np.float32),
        computed_entropy=None if entropy is None else np.asarray(entropy, dtype=np.float32),
        store=None if entropy is not None else store)
