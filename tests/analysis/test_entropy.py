"""Attention entropy on hand-computed distributions."""
from __future__ import annotations

import numpy as np
import pytest

from vit_inspect.analysis import attention_entropy


def test_uniform_one_hot_and_a_hand_computed_row():
    rows = np.array([[0.25, 0.25, 0.25, 0.25], [0.0, 1.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.5, 0.25, 0.25, 0.0]])
    expected = [np.log(4), 0.0, np.log(2), 0.5 * np.log(2) + 0.5 * np.log(4)]  # -sum p ln p by hand
    np.testing.assert_allclose(attention_entropy(rows), expected, atol=1e-12)


def test_keeps_leading_axes_and_refuses_negative_values():
    attention = np.full((3, 2, 5, 5), 0.2)  # (depth, heads, N, N) uniform
    np.testing.assert_allclose(attention_entropy(attention), np.full((3, 2, 5), np.log(5)))
    with pytest.raises(ValueError, match="non-negative"):
        attention_entropy(np.array([1.5, -0.5]))
