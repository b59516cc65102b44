import numpy as np
import pytest

from vit_inspect.analysis.pos_embed import pos_embed_similarity


def test_known_angles_on_a_2x2_grid():
    # Patches at angles 0, 90, 45 and 180 degrees, with different lengths (cosine ignores length).
    root_half = np.sqrt(0.5)
    embed = np.array([[[2.0, 0.0], [0.0, 3.0]],
                      [[root_half, root_half], [-0.5, 0.0]]])  # (grid_h=2, grid_w=2, D=2)

    sim = pos_embed_similarity(embed)

    assert sim.shape == (2, 2, 2, 2)
    flat = sim.reshape(4, 4)
    expected = np.array([[1.0, 0.0, root_half, -1.0],
                         [0.0, 1.0, root_half, 0.0],
                         [root_half, root_half, 1.0, -root_half],
                         [-1.0, 0.0, -root_half, 1.0]])
    np.testing.assert_allclose(flat, expected, atol=1e-12)
    assert sim[0, 1, 1, 0] == pytest.approx(root_half)  # patch (0, 1) vs patch (1, 0)


@pytest.mark.parametrize("grid_h, grid_w", [(2, 3), (3, 2), (1, 4)])
def test_symmetric_unit_diagonal_non_square(grid_h, grid_w):
    embed = np.random.default_rng(0).normal(size=(grid_h, grid_w, 5))

    sim = pos_embed_similarity(embed)

    assert sim.shape == (grid_h, grid_w, grid_h, grid_w)
    flat = sim.reshape(grid_h * grid_w, grid_h * grid_w)
    np.testing.assert_allclose(flat, flat.T, atol=1e-12)
    np.testing.assert_allclose(np.diag(flat), 1.0, atol=1e-12)
    # Row-major: patch (r, c) is flat index r * grid_w + c.
    a, b = embed[grid_h - 1, 0], embed[0, grid_w - 1]
    assert sim[grid_h - 1, 0, 0, grid_w - 1] == pytest.approx(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_zero_vector_raises():
    embed = np.ones((2, 3, 4))
    embed[1, 2] = 0.0
    with pytest.raises(ValueError, match=r"zero position embedding at patches \[\(1, 2\)\]"):
        pos_embed_similarity(embed)


def test_rejects_prefixed_token_axis():
    with pytest.raises(ValueError, match="grid_h, grid_w, embed_dim"):
        pos_embed_similarity(np.ones((5, 4)))
