"""Per-head statistics of one pass: attention entropy, attention on prefix tokens, token output norms,
and the first-order (attention x gradient) estimate of each head's importance."""
from __future__ import annotations

import numpy as np
import torch

from vit_inspect.analysis.entropy import attention_entropy
from vit_inspect.core.tokens import TokenLayout


def head_entropy(attention: np.ndarray) -> np.ndarray:
    """Mean entropy of each head's attention rows, in nats (see `entropy.attention_entropy`).

    ``H(head) = mean_i ( -sum_j a_ij ln a_ij )`` over all N query tokens (0 ln 0 = 0). It lies in
    [0, ln N]: 0 when every query attends to one key, ln N for uniform attention.
    ``attention`` is (..., depth, heads, N, N) with rows summing to 1; returns (..., depth, heads).
    """
    return attention_entropy(attention).mean(axis=-1)


def prefix_attention_share(attention: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """Mean fraction of each head's attention that lands on prefix tokens (class, distillation, registers).

    ``share(head) = mean_i sum_{j in prefix} a_ij`` over all N query tokens; a fraction in [0, 1]
    (0 for a model without prefix tokens). (..., depth, heads, N, N) -> (..., depth, heads).
    """
    prefix, _ = layout.split(np.asarray(attention), axis=-1)  # (..., N, P)
    return prefix.sum(axis=-1, dtype=np.float64).mean(axis=-1)


def first_order_importance(attention: np.ndarray, attention_grad: np.ndarray) -> np.ndarray:
    """First-order estimate of the drop in the target logit y when a head is zero-ablated.

    ``I(head) = sum_ij A_ij dy/dA_ij``, the attention times its gradient summed over the head.
    A head's output is o = A V, so I = sum o * dy/do = dy/d xi at xi = 1 for the head's output
    scaled by xi; zero ablation sets xi = 0, and I is the first-order Taylor estimate of
    y(xi=1) - y(xi=0) (Michel et al. 2019, "Are Sixteen Heads Really Better than One?", Eq. 2, for one
    image, signed, with y the target logit instead of the loss). Units: logits.
    (..., depth, heads, N, N) twice -> (..., depth, heads).
    """
    a, g = np.asarray(attention, dtype=np.float32), np.asarray(attention_grad, dtype=np.float32)
    return (a * g).sum(axis=(-2, -1), dtype=np.float64)


def token_norms(residual: np.ndarray | torch.Tensor) -> np.ndarray:
    """L2 norm of each token's output vector, sqrt(sum_d x_d^2): (..., N, D) -> (..., N) float64, in the
    model's activation units. A torch tensor is reduced in torch, accumulating in float64 without a float64
    copy of the input (numpy's float64 copy of DeiT-Ti's 12 residual streams alone cost ≈ 3 ms of a pass)."""
    if isinstance(residual, torch.Tensor):
        return torch.linalg.vector_norm(residual.detach(), dim=-1, dtype=torch.float64).cpu().numpy()
    return np.linalg.norm(np.asarray(residual, dtype=np.float64), axis=-1)


def high_norm_patches(norms: np.ndarray, layout: TokenLayout, factor: float = 2.0) -> np.ndarray:
    """(N,) token norms of one layer -> (grid_h, grid_w) bool map of high-norm "artefact" patches.

    Darcet et al. 2024 ("Vision Transformers Need Registers", Fig. 3) find a few patch tokens with
    norms far above the rest in large ViTs. Here a patch is high-norm when its norm exceeds `factor`
    times the median patch norm of the layer (a heuristic threshold, not the paper's absolute one).
    """
    patch_norms = layout.patches(np.asarray(norms), axis=-1)
    return layout.to_grid(patch_norms > factor * np.median(patch_norms))
