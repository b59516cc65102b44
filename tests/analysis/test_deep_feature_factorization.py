"""Deep feature factorisation on hand-made tokens, and its parity with pytorch-grad-cam's ``dff``."""
from __future__ import annotations

import numpy as np
import pytest
from pytorch_grad_cam.feature_factorization.deep_feature_factorization import dff
from scipy.optimize import linear_sum_assignment

from vit_inspect.analysis.concepts import deep_feature_factorization, shifted_channels


def matched_pearson(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """(k,) Pearson correlation of each of our (k, P) heatmaps with the reference's heatmap it is matched to by
    the Hungarian assignment that maximises the summed correlation."""
    corr = np.corrcoef(ours, theirs)[:len(ours), len(ours):]  # (k, k)
    rows, cols = linear_sum_assignment(-corr)
    return corr[rows, cols]


def test_rank_one_nonnegative_tokens_are_recovered():
    heat = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 0.5])  # (P,) a concept's weight at each patch
    direction = np.array([1.0, 2.0, 0.5])  # (D,)
    tokens = np.outer(heat, direction)  # (P, D), every channel's minimum is 0: no shift
    parts = deep_feature_factorization(tokens, 1, max_iter=2000)
    np.testing.assert_allclose(parts.offset, 0.0)
    # H is heat up to a positive scale, and W H the tokens
    np.testing.assert_allclose(parts.heatmaps[0] / parts.heatmaps[0].max(), heat / heat.max(), atol=1e-4)
    np.testing.assert_allclose(np.outer(parts.heatmaps[0], parts.concepts[0]), tokens, atol=1e-3)
    assert parts.error < 1e-3 and parts.areas.tolist() == [1.0]


def test_tokens_are_shifted_by_each_channels_minimum():
    tokens = np.array([[1.0, -2.0], [3.0, -5.0], [np.nan, 4.0]])  # (P=3, D=2)
    shifted, offset = shifted_channels(tokens)
    np.testing.assert_array_equal(offset, [0.0, -5.0])  # NaN read as 0, as the reference does
    np.testing.assert_array_equal(shifted, [[1.0, 3.0, 0.0], [3.0, 0.0, 9.0]])  # (D, P), least value 0 per row


def test_two_disjoint_parts_split_into_two_concepts_with_their_areas():
    # patches 0-3 hold direction a, patches 4-9 direction b (disjoint channels): k = 2 recovers the two
    a, b = np.array([2.0, 0.0, 0.0, 1.0]), np.array([0.0, 1.0, 3.0, 0.0])
    tokens = np.stack([a] * 4 + [b] * 6)  # (10, 4)
    parts = deep_feature_factorization(tokens, 2, max_iter=2000)
    first = int(np.argmax(parts.heatmaps[:, 0]))
    masks = parts.heatmaps / parts.heatmaps.max(axis=1, keepdims=True)
    np.testing.assert_allclose(masks[first], [1] * 4 + [0] * 6, atol=1e-3)
    np.testing.assert_allclose(masks[1 - first], [0] * 4 + [1] * 6, atol=1e-3)
    # areas: the mass of each part, sum(a) * 4 = 12 and sum(b) * 6 = 24 of 36
    np.testing.assert_allclose(parts.areas[[first, 1 - first]], [12 / 36, 24 / 36], atol=1e-3)


@pytest.mark.parametrize("k", [0, 5])
def test_k_outside_one_to_the_smaller_side_is_refused(k):
    with pytest.raises(ValueError, match="choose 1 to 4"):
        deep_feature_factorization(np.ones((6, 4)), k)


def test_equals_pytorch_grad_cams_dff_on_the_same_tokens():
    rng = np.random.default_rng(0)
    grid_h, grid_w, dim, k = 7, 9, 24, 4
    # tokens of a few overlapping parts plus noise, with negative channels as a ViT's residual stream has
    parts = rng.random((k, dim)) * 3 - 1
    weights = rng.random((grid_h * grid_w, k)) ** 3
    tokens = weights @ parts + 0.05 * rng.standard_normal((grid_h * grid_w, dim))  # (P, D)
    ours = deep_feature_factorization(tokens, k)
    activations = tokens.T.reshape(1, dim, grid_h, grid_w).copy()  # the reference's (B, C, H, W)
    concepts, explanations = dff(activations, n_components=k)  # (D, k), (1, k, H, W)
    theirs = explanations[0].reshape(k, -1)
    assert matched_pearson(ours.heatmaps, theirs).min() >= 0.95
    # the same settings give the same factorisation: equal heatmaps and concept embeddings, in the same order
    np.testing.assert_allclose(ours.heatmaps, theirs, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(ours.concepts, concepts.T, rtol=1e-6, atol=1e-9)


def test_matched_pearson_finds_the_permutation():
    maps = np.array([[0.0, 1.0, 2.0, 3.0], [3.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 5.0]])
    assert matched_pearson(maps, maps[[2, 0, 1]] * 7.0).tolist() == pytest.approx([1.0, 1.0, 1.0])
