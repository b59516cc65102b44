"""CRAFT's pieces on hand-computed values: the Jansen estimator on hand-made outputs and on functions with known
total Sobol indices, the replicated design, and the NMF bank of a rank-k non-negative matrix; and equality
with craft-xai's own sampler and estimator."""
from __future__ import annotations

import numpy as np
import pytest
from support.craft import import_craft

from vit_inspect.analysis.craft import (
    concept_coefficients,
    fit_concept_bank,
    jansen_total_indices,
    sobol_design,
)

JansenEstimator = import_craft("craft.sobol.estimators").JansenEstimator
HaltonSequence = import_craft("craft.sobol.sampler").HaltonSequence


def test_jansen_on_hand_made_outputs():
    # k = 2, N = 2: f(A) = (1, 3), f(B) unused, f(C_1) = (2, 3), f(C_2) = (1, 5); V = ((1-2)² + (3-2)²) / 1 = 2
    outputs = np.array([1, 3, 0, 0, 2, 3, 1, 5], float)
    np.testing.assert_allclose(jansen_total_indices(outputs, k=2, design=2), [1 / 8, 4 / 8])


def test_jansen_of_a_constant_is_nan():
    assert np.isnan(jansen_total_indices(np.ones(8), k=2, design=2)).all()


def test_the_design_is_a_then_b_then_a_with_one_column_of_b():
    k, n = 3, 8
    masks = sobol_design(k, n)
    a, b, c = masks[:n], masks[n:2 * n], masks[2 * n:].reshape(k, n, k)
    for j in range(k):
        expected = a.copy()
        expected[:, j] = b[:, j]
        np.testing.assert_array_equal(c[j], expected)
    assert masks.shape == ((k + 2) * n, k) and (masks >= 0).all() and (masks < 1).all()
    np.testing.assert_array_equal(masks, HaltonSequence()(k, nb_design=n))  # the reference's masks


def linear(masks: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return masks @ weights


@pytest.mark.parametrize("weights", [np.array([3.0, 2.0, 1.0, 0.0]), np.array([1.0, 1.0, -2.0])])
def test_total_indices_of_a_linear_function(weights):
    """y = Σ a_i x_i, x_i independent uniform on [0, 1]: S_T,i = a_i² / Σ a_j² (no interactions)."""
    k, n = len(weights), 2048
    masks = sobol_design(k, n)
    found = jansen_total_indices(linear(masks, weights), k, n)
    np.testing.assert_allclose(found, weights ** 2 / (weights ** 2).sum(), atol=0.01)
    np.testing.assert_allclose(found, JansenEstimator()(masks, linear(masks, weights), n), rtol=1e-5, atol=1e-7)


def test_total_indices_of_a_product():
    """y = x_1 x_2: Var y = 1/9 - 1/16 = 7/144 and E[Var(y | x_2)] = E[x_2²] / 12 = 1/36, so S_T,i = 4/7 each
    (their sum exceeds 1: the interaction is counted in both)."""
    n = 4096
    masks = sobol_design(2, n)
    np.testing.assert_allclose(jansen_total_indices(masks[:, 0] * masks[:, 1], 2, n), [4 / 7, 4 / 7], atol=0.02)


def test_nmf_recovers_a_rank_k_non_negative_matrix():
    rng = np.random.default_rng(0)
    k, n, d = 3, 60, 12
    w_true = np.zeros((k, d))
    for j in range(k):  # disjoint channels: the factorisation is unique up to order and scale
        w_true[j, 4 * j:4 * j + 4] = rng.uniform(0.5, 2.0, 4)
    u_true = rng.uniform(0, 1, (n, k))
    a = u_true @ w_true
    u, w = fit_concept_bank(a, k)
    assert np.linalg.norm(a - u @ w) / np.linalg.norm(a) < 1e-3
    cos = (w / np.linalg.norm(w, axis=1, keepdims=True)) @ (w_true / np.linalg.norm(w_true, axis=1, keepdims=True)).T
    match = cos.argmax(axis=1)
    assert sorted(match) == [0, 1, 2] and cos.max(axis=1).min() > 0.99  # the solver stops at its tolerance
    fresh = rng.uniform(0, 1, (20, k))  # new rows, their coefficients found with the bank fixed
    coefficients = concept_coefficients(fresh @ w_true, w)
    assert np.linalg.norm(coefficients @ w - fresh @ w_true) / np.linalg.norm(fresh @ w_true) < 0.02
    for j in range(k):  # each concept's coefficients are the true ones up to the bank row's scale
        assert np.corrcoef(coefficients[:, j], fresh[:, match[j]])[0, 1] > 0.99


def test_the_bank_refuses_negative_activations_and_a_k_too_large():
    with pytest.raises(ValueError, match="non-negative"):
        fit_concept_bank(-np.ones((4, 3)), 2)
    with pytest.raises(ValueError, match="choose 1 to 3"):
        fit_concept_bank(np.ones((4, 3)), 4)
