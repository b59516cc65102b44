import numpy as np
import pytest
from support import make_layout

from vit_inspect.analysis.attention_distance import (
    AttentionDistanceAccumulator,
    distance_as_fraction_of_width,
    mean_attention_distance,
)
from vit_inspect.core.tokens import TokenLayout

UNIFORM_2X2_16PX = (0 + 16 + 16 + 16 * np.sqrt(2)) / 4  # 13.6569 px: mean distance to the 4 patch centres




PREFIXED_2X2 = [make_layout(True, 0, 0), make_layout(True, 1, 0), make_layout(True, 0, 4)]
ALL_2X2 = [make_layout(False, 0, 0), *PREFIXED_2X2]


def tokens_attention(layout: TokenLayout, patch_rows: np.ndarray, prefix_mass: float = 0.0) -> np.ndarray:
    """(N, N) attention whose patch queries put ``prefix_mass`` on the prefix keys and the rest as ``patch_rows``."""
    attention = np.full((layout.num_tokens, layout.num_tokens), 1.0 / layout.num_tokens)  # prefix queries: ignored
    patch_queries = attention[layout.patch_slice]
    patch_queries[:, :layout.num_prefix_tokens] = prefix_mass / max(layout.num_prefix_tokens, 1)
    patch_queries[:, layout.patch_slice] = (1.0 - prefix_mass) * patch_rows
    return attention


def stack(*maps: np.ndarray, depth: int = 1) -> np.ndarray:
    """Heads from ``maps``, repeated over ``depth`` layers: (depth, heads, N, N)."""
    return np.repeat(np.stack(maps)[None], depth, axis=0)


@pytest.mark.parametrize("layout", ALL_2X2, ids=lambda l: l.prefix_names().__repr__())
@pytest.mark.parametrize("renormalize", [True, False])
def test_uniform_attention_on_2x2_grid(layout, renormalize):
    uniform = tokens_attention(layout, np.full((4, 4), 0.25))
    distances = mean_attention_distance(stack(uniform, uniform, depth=3), layout, renormalize)
    assert distances.shape == (3, 2)
    np.testing.assert_allclose(distances, UNIFORM_2X2_16PX)
    assert UNIFORM_2X2_16PX == pytest.approx(13.6569, abs=1e-4)


@pytest.mark.parametrize("layout", ALL_2X2, ids=lambda l: l.prefix_names().__repr__())
def test_identity_attention_is_zero(layout):
    identity = tokens_attention(layout, np.eye(4))
    np.testing.assert_allclose(mean_attention_distance(stack(identity, depth=2), layout), 0.0)


def test_1x3_grid_with_known_rows():
    # 10 px high, 8 px wide patches: centres at x = 4, 12, 20, so neighbours are 8 px apart.
    layout = make_layout(True, 0, 0, grid_h=1, grid_w=3, patch_h=10, patch_w=8)
    rows = np.array([[0.5, 0.5, 0.0],  # 0.5 * 8 = 4 px
                     [0.25, 0.5, 0.25],  # 0.25 * 8 + 0.25 * 8 = 4 px
                     [1.0, 0.0, 0.0]])  # 16 px
    distances = mean_attention_distance(stack(tokens_attention(layout, rows)), layout)
    np.testing.assert_allclose(distances, [[(4 + 4 + 16) / 3]])


@pytest.mark.parametrize("layout", PREFIXED_2X2, ids=lambda l: l.prefix_names().__repr__())
def test_renormalisation_with_half_the_mass_on_prefix_tokens(layout):
    attention = stack(tokens_attention(layout, np.full((4, 4), 0.25), prefix_mass=0.5))
    np.testing.assert_allclose(mean_attention_distance(attention, layout, renormalize=True), UNIFORM_2X2_16PX)
    np.testing.assert_allclose(mean_attention_distance(attention, layout, renormalize=False), UNIFORM_2X2_16PX / 2)


def test_heads_and_layers_are_kept_apart():
    layout = make_layout(True, 0, 0)
    uniform = tokens_attention(layout, np.full((4, 4), 0.25))
    identity = tokens_attention(layout, np.eye(4))
    attention = np.stack([stack(uniform, identity)[0], stack(identity, uniform)[0]])  # (depth=2, heads=2, N, N)
    np.testing.assert_allclose(mean_attention_distance(attention, layout),
                               [[UNIFORM_2X2_16PX, 0.0], [0.0, UNIFORM_2X2_16PX]])


def random_attention(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    logits = rng.normal(size=shape)
    weights = np.exp(logits)
    return weights / weights.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("renormalize", [True, False])
def test_batch_mean_and_accumulator_match_per_image_results(renormalize):
    layout = make_layout(True, 0, 4, grid_h=2, grid_w=3, patch_h=16, patch_w=12)
    rng = np.random.default_rng(0)
    images = random_attention(rng, (5, 3, 2, layout.num_tokens, layout.num_tokens))  # (B, depth, heads, N, N)
    per_image = np.stack([mean_attention_distance(image, layout, renormalize) for image in images])

    np.testing.assert_allclose(mean_attention_distance(images, layout, renormalize), per_image.mean(axis=0))

    accumulator = AttentionDistanceAccumulator(layout, renormalize)
    accumulator.update(images[:3])
    accumulator.update(images[3])
    accumulator.update(images[4:])
    assert accumulator.count == 5
    np.testing.assert_allclose(accumulator.result(), per_image.mean(axis=0))
    assert all(np.ndim(value) <= 2 for value in vars(accumulator).values())  # no attention maps kept


def test_accumulator_errors():
    layout = make_layout(True, 0, 0)
    accumulator = AttentionDistanceAccumulator(layout)
    with pytest.raises(ValueError, match="update"):
        accumulator.result()
    accumulator.update(stack(tokens_attention(layout, np.eye(4)), depth=2))
    with pytest.raises(ValueError, match="earlier updates"):
        accumulator.update(stack(tokens_attention(layout, np.eye(4)), depth=3))


def test_fraction_of_width():
    square = make_layout(True, 0, 0)  # 32 px wide
    np.testing.assert_allclose(distance_as_fraction_of_width(np.array([[UNIFORM_2X2_16PX, 16.0]]), square),
                               [[UNIFORM_2X2_16PX / 32, 0.5]])
    wide = make_layout(False, 0, 0, grid_h=1, grid_w=3, patch_h=10, patch_w=8)  # 24 px wide
    np.testing.assert_allclose(distance_as_fraction_of_width(np.array([[6.0]]), wide), [[0.25]])


def test_rejects_wrong_shapes():
    layout = make_layout(True, 0, 0)
    with pytest.raises(ValueError, match="tokens"):
        mean_attention_distance(np.zeros((1, 1, 4, 4)), layout)
    with pytest.raises(ValueError, match="depth, heads"):
        mean_attention_distance(np.zeros((5, 5)), layout)


def test_renormalising_an_all_prefix_row_raises():
    layout = make_layout(True, 0, 0)
    attention = stack(tokens_attention(layout, np.full((4, 4), 0.25), prefix_mass=1.0))
    with pytest.raises(ValueError, match="renormalise"):
        mean_attention_distance(attention, layout, renormalize=True)
    np.testing.assert_allclose(mean_attention_distance(attention, layout, renormalize=False), 0.0)
