import numpy as np
import pytest
from support import make_layout

from vit_inspect.analysis.attention_maps import attention_map, readout
from vit_inspect.analysis.rollout import rollout, rollout_matrix
from vit_inspect.core.tokens import TokenLayout

LAYOUTS = [make_layout(True, 0, 0, 2, 2), make_layout(False, 0, 0, 2, 2), make_layout(True, 1, 0, 2, 2),
           make_layout(True, 0, 4, 2, 2), make_layout(True, 0, 0, 2, 3)]
LAYOUT_IDS = ["class", "no-prefix", "class+dist", "class+4reg", "class-2x3"]

CLASS_1X2 = make_layout(True, 0, 0, 1, 2)  # 3 tokens: class, patch (0, 0), patch (0, 1)
PATCHES_1X3 = make_layout(False, 0, 0, 1, 3)  # 3 tokens, all patches

# Two layers of two heads over 3 tokens; head means are
#   W0 = [[.5, .5, 0], [.2, .8, 0], [0, .4, .6]],  W1 = [[.2, .4, .4], [0, 1, 0], [.6, 0, .4]].
HAND_ATTENTION = np.array([
    [[[1.0, 0.0, 0.0], [0.4, 0.6, 0.0], [0.0, 0.8, 0.2]],
     [[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]],
    [[[0.4, 0.4, 0.2], [0.0, 1.0, 0.0], [0.6, 0.0, 0.4]],
     [[0.0, 0.4, 0.6], [0.0, 1.0, 0.0], [0.6, 0.0, 0.4]]],
])  # (depth=2, heads=2, N=3, N=3)
# With the residual: A0 = .5 W0 + .5 I = [[.75, .25, 0], [.1, .9, 0], [0, .2, .8]],
#                    A1 = .5 W1 + .5 I = [[.6, .2, .2], [0, 1, 0], [.3, 0, .7]].
A0 = np.array([[0.75, 0.25, 0.0], [0.1, 0.9, 0.0], [0.0, 0.2, 0.8]])
A1 = np.array([[0.6, 0.2, 0.2], [0.0, 1.0, 0.0], [0.3, 0.0, 0.7]])
# A1 @ A0, multiplied out by hand:
#   row 0: .6 [.75 .25 0] + .2 [.1 .9 0] + .2 [0 .2 .8] = [.47, .37, .16]
#   row 1: [.1, .9, 0]
#   row 2: .3 [.75 .25 0] + .7 [0 .2 .8]                 = [.225, .215, .56]
HAND_ROLLOUT = np.array([[0.47, 0.37, 0.16], [0.1, 0.9, 0.0], [0.225, 0.215, 0.56]])


def random_attention(layout: TokenLayout, depth: int = 3, heads: int = 2, seed: int = 0) -> np.ndarray:
    weights = np.exp(np.random.default_rng(seed).normal(size=(depth, heads, layout.num_tokens, layout.num_tokens)))
    return weights / weights.sum(axis=-1, keepdims=True)


def token_matrix(layout: TokenLayout) -> np.ndarray:
    """(N, N) with entry 100 * query + key, so every readout value names its own position."""
    index = np.arange(layout.num_tokens, dtype=np.float64)
    return 100.0 * index[:, None] + index[None, :]


# --- readout and raw attention maps -------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_readout_patch_query_and_default(layout):
    matrix = token_matrix(layout)
    keys = np.arange(layout.num_prefix_tokens, layout.num_tokens).reshape(layout.grid_h, layout.grid_w)

    last = (layout.grid_h - 1, layout.grid_w - 1)
    np.testing.assert_array_equal(readout(matrix, layout, last), 100.0 * (layout.num_tokens - 1) + keys)

    mean_patch_query = np.mean(np.arange(layout.num_prefix_tokens, layout.num_tokens))
    np.testing.assert_array_equal(readout(matrix, layout, "mean"), 100.0 * mean_patch_query + keys)
    default = readout(matrix, layout)
    if layout.has_class_token:
        np.testing.assert_array_equal(default, keys)  # class token row is row 0
        np.testing.assert_array_equal(readout(matrix, layout, "class"), keys)
    else:
        np.testing.assert_array_equal(default, 100.0 * mean_patch_query + keys)


def test_readout_is_row_major_on_a_non_square_grid():
    layout = make_layout(True, 0, 4, 2, 3)  # patches are tokens 5..10
    matrix = token_matrix(layout)
    np.testing.assert_array_equal(readout(matrix, layout, (1, 0)), 800.0 + np.array([[5, 6, 7], [8, 9, 10]]))


def test_readout_errors():
    with pytest.raises(ValueError, match="no class token"):
        readout(token_matrix(PATCHES_1X3), PATCHES_1X3, "class")
    with pytest.raises(ValueError, match="unknown query"):
        readout(token_matrix(CLASS_1X2), CLASS_1X2, "cls")
    with pytest.raises(ValueError, match="outside"):
        readout(token_matrix(CLASS_1X2), CLASS_1X2, (1, 0))
    with pytest.raises(ValueError, match=r"\(3, 3\) token matrix"):
        readout(np.zeros((4, 4)), CLASS_1X2)


def test_attention_map_is_raw_per_head_or_head_mean():
    np.testing.assert_allclose(attention_map(HAND_ATTENTION, CLASS_1X2, layer=0, head=0), [[0.0, 0.0]])
    np.testing.assert_allclose(attention_map(HAND_ATTENTION, CLASS_1X2, layer=0), [[0.5, 0.0]])
    # Mass on the class key is dropped, not renormalised: 0.4 + 0.4 != 1.
    np.testing.assert_allclose(attention_map(HAND_ATTENTION, CLASS_1X2, layer=1, head=0), [[0.4, 0.2]])
    np.testing.assert_allclose(attention_map(HAND_ATTENTION, CLASS_1X2, layer=1, query=(0, 1)), [[0.0, 0.4]])


def test_attention_map_range_errors():
    with pytest.raises(ValueError, match="layer 2 out of range"):
        attention_map(HAND_ATTENTION, CLASS_1X2, layer=2)
    with pytest.raises(ValueError, match="head 2 out of range"):
        attention_map(HAND_ATTENTION, CLASS_1X2, layer=0, head=2)
    with pytest.raises(ValueError, match="depth, heads"):
        attention_map(HAND_ATTENTION[0], CLASS_1X2, layer=0)


# --- rollout ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("residual", [True, False])
def test_identity_attention_gives_one_hot_for_a_patch_query(layout, residual):
    identity = np.broadcast_to(np.eye(layout.num_tokens), (3, 2, layout.num_tokens, layout.num_tokens))
    expected = np.zeros((layout.grid_h, layout.grid_w))
    expected[1, 0] = 1.0
    np.testing.assert_allclose(rollout(identity, layout, residual=residual, query=(1, 0)), expected)


def test_two_layer_hand_product():
    np.testing.assert_allclose(rollout_matrix(HAND_ATTENTION), HAND_ROLLOUT)
    np.testing.assert_allclose(rollout(HAND_ATTENTION, CLASS_1X2), [[0.37, 0.16]])
    np.testing.assert_allclose(rollout(HAND_ATTENTION, CLASS_1X2, query=(0, 1)), [[0.215, 0.56]])
    np.testing.assert_allclose(rollout(HAND_ATTENTION, PATCHES_1X3), [[(0.47 + 0.1 + 0.225) / 3,
                                                                       (0.37 + 0.9 + 0.215) / 3,
                                                                       (0.16 + 0.0 + 0.56) / 3]])


def test_without_residual():
    # W1 @ W0, row 0: .2 [.5 .5 0] + .4 [.2 .8 0] + .4 [0 .4 .6] = [.18, .58, .24]
    matrix = rollout_matrix(HAND_ATTENTION, residual=False)
    np.testing.assert_allclose(matrix[0], [0.18, 0.58, 0.24])


def test_layer_range_uses_slice_semantics():
    np.testing.assert_allclose(rollout_matrix(HAND_ATTENTION, start_layer=1), A1)
    np.testing.assert_allclose(rollout_matrix(HAND_ATTENTION, end_layer=1), A0)
    np.testing.assert_allclose(rollout_matrix(HAND_ATTENTION, start_layer=-1), A1)
    np.testing.assert_allclose(rollout_matrix(HAND_ATTENTION, start_layer=0, end_layer=-1), A0)
    with pytest.raises(ValueError, match="no layers selected"):
        rollout_matrix(HAND_ATTENTION, start_layer=1, end_layer=1)


def test_max_and_min_head_fusion():
    # Layer 0 max over heads: [[1, 1, 0], [.4, 1, 0], [0, .8, 1]], rows renormalised.
    np.testing.assert_allclose(rollout_matrix(HAND_ATTENTION, head_fusion="max", residual=False, end_layer=1),
                               [[0.5, 0.5, 0.0], [2 / 7, 5 / 7, 0.0], [0.0, 4 / 9, 5 / 9]])
    # Layer 1 min over heads: [[0, .4, .2], [0, 1, 0], [.6, 0, .4]], rows renormalised.
    np.testing.assert_allclose(rollout_matrix(HAND_ATTENTION, head_fusion="min", residual=False, start_layer=1),
                               [[0.0, 2 / 3, 1 / 3], [0.0, 1.0, 0.0], [0.6, 0.0, 0.4]])
    with pytest.raises(ValueError, match="head_fusion"):
        rollout_matrix(HAND_ATTENTION, head_fusion="median")


DISCARD_ATTENTION = np.array([[[[0.1, 0.6, 0.3], [0.2, 0.5, 0.3], [0.05, 0.15, 0.8]]]])  # (1, 1, 3, 3)


def test_discard_keeps_the_class_column():
    # floor(0.4 * 3) = 1 entry per row dropped; the class column (0) is never dropped even when lowest.
    matrix = rollout_matrix(DISCARD_ATTENTION, discard_ratio=0.4, residual=False, layout=CLASS_1X2)
    np.testing.assert_allclose(matrix, [[1 / 7, 6 / 7, 0.0], [2 / 7, 5 / 7, 0.0], [1 / 17, 0.0, 16 / 17]])


@pytest.mark.parametrize("layout", [None, PATCHES_1X3])
def test_discard_without_class_token_drops_the_lowest_entry(layout):
    matrix = rollout_matrix(DISCARD_ATTENTION, discard_ratio=0.4, residual=False, layout=layout)
    np.testing.assert_allclose(matrix, [[0.0, 2 / 3, 1 / 3], [0.0, 5 / 8, 3 / 8], [0.0, 0.15 / 0.95, 0.8 / 0.95]])


def test_discard_everything_but_the_class_column():
    layout = LAYOUTS[0]  # class + 2x2: floor(0.9 * 5) = 4 entries per row, i.e. every patch and nothing else
    matrix = rollout_matrix(random_attention(layout, depth=1), discard_ratio=0.9, residual=False, layout=layout)
    expected = np.zeros((5, 5))
    expected[:, 0] = 1.0
    np.testing.assert_allclose(matrix, expected)


def test_discard_ratio_range():
    with pytest.raises(ValueError, match="discard_ratio"):
        rollout_matrix(HAND_ATTENTION, discard_ratio=1.0)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("head_fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard_ratio, residual", [(0.0, True), (0.0, False), (0.5, True), (0.5, False)])
def test_rows_sum_to_one(layout, head_fusion, discard_ratio, residual):
    matrix = rollout_matrix(random_attention(layout), head_fusion, discard_ratio, residual, layout=layout)
    assert matrix.shape == (layout.num_tokens, layout.num_tokens)
    np.testing.assert_allclose(matrix.sum(axis=-1), 1.0)
    assert np.all(matrix >= 0)
    assert rollout(random_attention(layout), layout).shape == (layout.grid_h, layout.grid_w)


def test_layout_token_count_must_match():
    with pytest.raises(ValueError, match="layout has"):
        rollout_matrix(HAND_ATTENTION, layout=LAYOUTS[0])


def test_vector_times_layer_by_hand():
    """v^T prepare_layer(W) without the prepared matrix: W = [[.5,.5,0],[.2,.8,0],[0,.4,.6]], class query
    v = e_0, residual: A_0 = (0.5 W_0 + 0.5 e_0) / 1 = [.75, .25, 0]; the whole-matrix discard of 5 of 9
    entries (ratio 0.6) zeroes the three zeros and the two lowest non-zeros (.2, .4), never (0, 0)."""
    from vit_inspect.analysis.rollout import vector_times_layer

    w = np.array([[.5, .5, 0.], [.2, .8, 0.], [0., .4, .6]])
    e0 = np.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(vector_times_layer(e0, w.copy(), 0, 0.0, "row", True, 0), [.75, .25, 0.], atol=1e-15)
    # discard: [[.5,.5,0],[0,.8,0],[0,0,.6]]; row 1 of 0.5 W + 0.5 I = [0, .9, 0] / .9
    v = np.array([0.0, 1.0, 0.0])
    np.testing.assert_allclose(vector_times_layer(v, w.copy(), 0, 0.6, "matrix", True, 0), [0., 1., 0.], atol=1e-15)
    # per-row discard of 1 of 3 (ratio 0.34), class column kept: row 2 [0, .4, .6] -> [0, 0, .6] (the 0 is
    # the class column, kept), no residual: renormalised [0, 0, 1]
    np.testing.assert_allclose(vector_times_layer(np.array([0., 0., 2.]), w.copy(), 0, 0.34, "row", False, 0),
                               [0., 0., 2.], atol=1e-15)


@pytest.mark.parametrize("discard", ["row", "matrix"])
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("ratio", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("dense", [True, False])
def test_vector_times_layer_equals_the_product_with_the_prepared_layer(discard, residual, ratio, dense):
    from vit_inspect.analysis.rollout import prepare_layer, vector_times_layer

    rng = np.random.default_rng(7)
    fused = rng.random((23, 23)) ** 3
    fused[3, :5] = fused[3, 7]  # ties, broken by position
    vector = rng.random(23) if dense else np.eye(23)[0] * 2.0
    try:
        expected = vector @ prepare_layer(fused.copy(), 4, ratio, discard, residual, 0)
    except ValueError:  # the whole-matrix discard without the residual empties a row: refused alike
        assert discard == "matrix" and not residual and ratio == 0.9
        with pytest.raises(ValueError, match="no attention left"):
            vector_times_layer(vector, fused.copy(), 4, ratio, discard, residual, 0)
        return
    np.testing.assert_allclose(vector_times_layer(vector, fused.copy(), 4, ratio, discard, residual, 0), expected,
                               rtol=1e-12, atol=1e-15)


def test_kth_lowest_equals_the_partition_with_ties_zeros_and_nan():
    """The whole-matrix discard's threshold: the minimum's many copies set aside, then a partition; the same
    value as np.partition for integer ties, mostly-zero matrices, random values and NaN (ranked last)."""
    from vit_inspect.analysis.rollout import _kth_lowest

    rng = np.random.default_rng(1)
    for trial in range(2000):
        n = int(rng.integers(1, 60))
        values = [rng.integers(0, 4, n).astype(float), np.where(rng.random(n) < 0.8, 0.0, rng.random(n)),
                  rng.random(n), np.where(rng.random(n) < 0.1, np.nan, rng.random(n))][trial % 4]
        count = int(rng.integers(1, n + 1))
        expected = np.partition(values, count - 1)[count - 1]
        got = _kth_lowest(values, count)
        assert got == expected or (np.isnan(got) and np.isnan(expected)), (values, count)
    assert _kth_lowest(np.array([0.0, 0.0, 0.0, 0.5]), 3) == 0.0 and _kth_lowest(np.array([0.0, 0.0, 0.7, 0.5]), 3) == 0.5
