"""Per-head numbers recorded in the analysis pass itself: the logit lens, token output norms,
attention entropy, attention on prefix tokens and the first-order head importance.

`analyze_image` builds a `HeadPass` from what its one forward (and one backward) already recorded:
the residual stream after every block is read through the model's head (see `lens.lens_readouts`)
under `torch.no_grad()`; no extra pass through the blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .analysis.heads import first_order_importance, head_entropy, prefix_attention_share, token_norms
from .capture import AttentionRecorder
from .lens import NO_HEAD, lens_readouts
from .models import ViTHandle
from .tokens import TokenLayout


@dataclass(frozen=True, eq=False)
class HeadPass:
    """Head-level numbers of one image's pass."""

    logits: np.ndarray  # (num_classes,) float32 model logits; empty without a head
    lens: dict[str, np.ndarray]  # readout name -> (depth, num_classes) float32 lens logits after each block
    lens_note: str  # why `lens` is empty ("" when it is not)
    token_norms: np.ndarray  # (depth, N) float32 L2 norm of every token after each block
    entropy: np.ndarray  # (depth, heads) mean attention entropy, nats (max ln N)
    prefix_share: np.ndarray  # (depth, heads) mean fraction of attention on prefix tokens
    first_order: np.ndarray | None  # (depth, heads) sum_ij A dy/dA per head, logits; None without gradients

    def nbytes(self) -> int:
        arrays = [self.logits, self.token_norms, self.entropy, self.prefix_share, self.first_order, *self.lens.values()]
        return sum(a.nbytes for a in arrays if a is not None)


def build_head_pass(handle: ViTHandle, rec: AttentionRecorder, logits: torch.Tensor, attention: np.ndarray,
                    attention_grad: np.ndarray | None, layout: TokenLayout, tolerance: float = 1e-3) -> HeadPass:
    """The `HeadPass` of image 0 of a pass recorded with ``capture_attention(..., residual=True)``.

    ``attention`` is that image's (depth, heads, N, N) float32 attention, ``attention_grad`` its gradient
    (or None). The lens is kept only if its reading after the last block reproduces the model's logits
    within `tolerance` times their largest magnitude.
    """
    residual = [rec.residual(i)[:1].float() for i in range(handle.depth)]  # depth x (1, N, D)
    model_logits = logits.detach()[0].float() if handle.has_head else torch.zeros(0)
    lens: dict[str, np.ndarray] = {}
    note = "" if handle.has_head else NO_HEAD
    readouts = lens_readouts(handle)
    if handle.has_head and not readouts:
        note = f"vit_inspect does not know how {handle.name!r} reads its tokens into its head, so it shows no logit lens."
    with torch.no_grad(), torch.autocast(handle.device.type, enabled=False):
        for name, read in readouts.items():
            lens[name] = torch.cat([read(x) for x in residual]).cpu().numpy().astype(np.float32)  # (depth, C)
    if "readout" in lens:
        error = np.abs(lens["readout"][-1] - model_logits.cpu().numpy()).max()
        if error > tolerance * max(1.0, float(model_logits.abs().max())):
            lens, note = {}, (f"The lens after the last block differs from {handle.name!r}'s logits by {error:.3g}: "
                              "its head is not one vit_inspect can replay, so it shows no logit lens.")
    norms = np.stack([token_norms(x[0].cpu().numpy()) for x in residual]).astype(np.float32)  # (depth, N)
    return HeadPass(
        logits=model_logits.cpu().numpy().astype(np.float32), lens=lens, lens_note=note, token_norms=norms,
        entropy=head_entropy(attention).astype(np.float32),
        prefix_share=prefix_attention_share(attention, layout).astype(np.float32),
        first_order=None if attention_grad is None else first_order_importance(attention, attention_grad).astype(np.float32))
