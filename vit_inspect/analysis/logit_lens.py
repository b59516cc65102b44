"""Logit lens (nostalgebraist 2020): what the head would predict from the readout token after each block."""
from __future__ import annotations

import numpy as np


def lens_probs(logits: np.ndarray) -> np.ndarray:
    """(depth, C) lens logits -> (depth, C) softmax probabilities per depth."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted, dtype=np.float64)
    return (exp / exp.sum(axis=-1, keepdims=True)).astype(np.float32)


def lens_ranks(logits: np.ndarray, target: int) -> np.ndarray:
    """(depth, C) lens logits -> (depth,) rank of class `target` after each block: 1 is the top class,
    ``1 + #{c : logit_c > logit_target}`` (ties count in the target's favour)."""
    logits = np.asarray(logits)
    return 1 + (logits > logits[:, target:target + 1]).sum(axis=-1)


def lens_topk(logits: np.ndarray, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """(depth, C) lens logits -> ((depth, k) class indices, (depth, k) probabilities), most probable first."""
    probs = lens_probs(logits)
    order = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    return order, np.take_along_axis(probs, order, axis=-1)


def settled_block(ranks: np.ndarray) -> int | None:
    """The 0-based block b from whose output on the class has rank 1 through the last block (ranks[b:] all 1);
    None if it is not rank 1 after the last block. 0 <= b <= depth - 1."""
    ranks = np.asarray(ranks)
    if ranks.size == 0 or ranks[-1] != 1:
        return None
    not_top = np.flatnonzero(ranks != 1)
    return int(not_top[-1]) + 1 if not_top.size else 0
