import numpy as np
import pytest

from vit_inspect.analysis.filters import FilterPCA, filter_pca


def test_planted_direction_is_first_component():
    rng = np.random.default_rng(0)
    direction = rng.normal(size=(3, 4, 2))  # (C, ph, pw): non-square patches
    coefficients = rng.normal(scale=10.0, size=(64, 1, 1, 1))
    weight = coefficients * direction + 0.01 * rng.normal(size=(64, 3, 4, 2))  # (embed_dim, C, ph, pw)

    pca = filter_pca(weight, k=5)

    first = pca.components[0].transpose(2, 0, 1).ravel()  # back to (C, ph, pw) order
    cosine = first @ direction.ravel() / (np.linalg.norm(first) * np.linalg.norm(direction))
    assert abs(cosine) > 0.99
    assert pca.explained_variance_ratio[0] > 0.9


def test_channels_last_layout_of_components():
    # All variance sits in one weight entry: channel 2, row 1, column 0 of a 3x2 patch.
    weight = np.zeros((6, 3, 3, 2))
    weight[:, 2, 1, 0] = [1.0, -2.0, 3.0, 0.5, -1.5, 4.0]

    pca = filter_pca(weight, k=1)

    expected = np.zeros((1, 3, 2, 3))  # (k, ph, pw, C)
    expected[0, 1, 0, 2] = 1.0
    np.testing.assert_allclose(np.abs(pca.components), expected, atol=1e-12)
    np.testing.assert_allclose(pca.explained_variance_ratio, [1.0])


@pytest.mark.parametrize(
    "shape, k, expected_k",
    [((64, 3, 4, 2), 28, 24),  # clipped by C * ph * pw
     ((5, 3, 2, 3), 28, 5),  # clipped by embed_dim
     ((40, 3, 4, 4), 7, 7)])
def test_shapes_and_clipping(shape, k, expected_k):
    weight = np.random.default_rng(1).normal(size=shape)
    embed_dim, channels, patch_h, patch_w = shape

    pca = filter_pca(weight, k=k)

    assert isinstance(pca, FilterPCA)
    assert pca.components.shape == (expected_k, patch_h, patch_w, channels)
    assert pca.explained_variance_ratio.shape == (expected_k,)
    flat = pca.components.reshape(expected_k, -1)
    np.testing.assert_allclose(flat @ flat.T, np.eye(expected_k), atol=1e-10)
    assert np.all(np.diff(pca.explained_variance_ratio) <= 1e-12)
    assert pca.explained_variance_ratio.sum() <= 1.0 + 1e-12


def test_result_is_frozen():
    pca = filter_pca(np.random.default_rng(2).normal(size=(8, 3, 2, 2)), k=2)
    with pytest.raises(AttributeError):
        pca.components = np.zeros(1)


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="conv weight"):
        filter_pca(np.zeros((8, 12)))
    with pytest.raises(ValueError, match="k must be"):
        filter_pca(np.zeros((8, 3, 2, 2)), k=0)
