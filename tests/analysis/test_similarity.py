"""Cosine similarity of one token to many, on hand-made vectors."""
from __future__ import annotations

import numpy as np
import pytest

from vit_inspect.analysis.similarity import cosine_similarity


def test_cosine_similarity_of_hand_made_vectors():
    query = np.array([1.0, 0.0])
    tokens = np.array([[2.0, 0.0], [0.0, 3.0], [-1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    np.testing.assert_allclose(cosine_similarity(query, tokens), [1.0, 0.0, -1.0, 1 / np.sqrt(2), 0.0])
    grid = tokens[:4].reshape(2, 2, 2)  # any leading shape
    np.testing.assert_allclose(cosine_similarity(query, grid), [[1.0, 0.0], [-1.0, 1 / np.sqrt(2)]])
    with pytest.raises(ValueError, match="query"):
        cosine_similarity(np.ones(3), tokens)
