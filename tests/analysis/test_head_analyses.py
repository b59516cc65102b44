"""Per-head statistics, first-order importance, logit-lens ranks and Spearman's rho on hand-made arrays."""
from __future__ import annotations

import math

import numpy as np
import torch
from support import make_layout

from vit_inspect.analysis.heads import (
    first_order_importance,
    head_entropy,
    high_norm_patches,
    prefix_attention_share,
    token_norms,
)
from vit_inspect.analysis.logit_lens import (
    lens_probs,
    lens_ranks,
    lens_topk,
    settled_block,
)


def _rows(*rows):
    return np.array(rows, dtype=np.float32)


def test_entropy_in_nats_by_hand():
    uniform = np.full((5, 5), 0.2, np.float32)
    one_hot = np.eye(5, dtype=np.float32)
    half = np.zeros((5, 5), np.float32)
    half[:, :2] = 0.5
    attention = np.stack([uniform, one_hot, half])[None]  # (depth=1, heads=3, 5, 5)
    np.testing.assert_allclose(head_entropy(attention), [[math.log(5), 0.0, math.log(2)]], rtol=1e-6, atol=1e-7)
    mixed = np.tile(_rows([0.5, 0.25, 0.25, 0, 0]), (5, 1))[None, None]
    np.testing.assert_allclose(head_entropy(mixed), [[1.5 * math.log(2)]], rtol=1e-6)


def test_prefix_share_by_hand():
    layout = make_layout(cls=True, dist=1, reg=0)  # 2 prefix + 4 patches
    attention = np.zeros((1, 2, 6, 6), np.float32)
    attention[0, 0, :, 0] = 0.3
    attention[0, 0, :, 1] = 0.1
    attention[0, 0, :, 2] = 0.6
    attention[0, 1, :3, 5] = 1.0  # half the queries on a patch, half on the class token
    attention[0, 1, 3:, 0] = 1.0
    np.testing.assert_allclose(prefix_attention_share(attention, layout), [[0.4, 0.5]], rtol=1e-6)
    no_prefix = make_layout(cls=False, dist=0, reg=0)
    assert prefix_attention_share(np.full((1, 1, 4, 4), 0.25), no_prefix).tolist() == [[0.0]]


def test_first_order_is_the_sum_of_attention_times_gradient():
    a = np.zeros((1, 2, 2, 2))
    g = np.zeros((1, 2, 2, 2))
    a[0, 0] = [[0.5, 0.5], [1.0, 0.0]]
    g[0, 0] = [[2.0, -1.0], [3.0, 100.0]]  # the 100 sits on zero attention: no contribution
    a[0, 1] = 0.5
    g[0, 1] = -1.0
    np.testing.assert_allclose(first_order_importance(a, g), [[0.5 * 2 - 0.5 + 3.0, -2.0]])


def test_token_norms_and_high_norm_patches():
    residual = np.zeros((5, 2))
    residual[:, 0] = [10, 1, 1, 3, 1]  # token 0 is the class token
    residual[3, 1] = 4
    np.testing.assert_allclose(token_norms(residual), [10, 1, 1, 5, 1])
    layout = make_layout(cls=True, dist=0, reg=0)
    # median patch norm 1: patch (1, 0) with norm 5 is high-norm, the class token is not a patch
    assert high_norm_patches(token_norms(residual), layout).tolist() == [[False, False], [True, False]]
    assert not high_norm_patches(token_norms(residual), layout, factor=6).any()
    # a torch tensor is reduced in torch, to the same float64 values
    for tensor in (torch.from_numpy(residual).float(), torch.from_numpy(residual)):
        norms = token_norms(tensor)
        assert norms.dtype == np.float64
        np.testing.assert_allclose(norms, [10, 1, 1, 5, 1], rtol=1e-15)
    wide = np.random.default_rng(0).normal(size=(3, 7, 384)).astype(np.float32)
    np.testing.assert_allclose(token_norms(torch.from_numpy(wide)), token_norms(wide), rtol=1e-13)


def test_lens_ranks_topk_and_settled_block():
    logits = np.array([[3.0, 1.0, 2.0], [1.0, 3.0, 2.0], [0.0, 5.0, 1.0]])  # depth 3, 3 classes
    assert lens_ranks(logits, 1).tolist() == [3, 1, 1]
    assert lens_ranks(logits, 0).tolist() == [1, 3, 3]
    assert settled_block(lens_ranks(logits, 1)) == 1  # rank 1 from block 1 on
    assert settled_block(np.array([1, 2, 1])) == 2  # lost it at block 1: settles at block 2, the last
    assert settled_block(np.array([1, 1, 1])) == 0
    assert settled_block(np.array([1, 1, 2])) is None
    indices, probs = lens_topk(logits, 2)
    assert indices.tolist() == [[0, 2], [1, 2], [1, 2]]
    e = np.exp([3.0, 1.0, 2.0])
    np.testing.assert_allclose(probs[0], [e[0] / e.sum(), e[2] / e.sum()], rtol=1e-6)
    np.testing.assert_allclose(lens_probs(logits).sum(-1), 1.0, rtol=1e-6)
