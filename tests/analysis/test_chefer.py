import numpy as np
import pytest
from support import make_layout

from vit_inspect.analysis.chefer import chefer_matrix, chefer_relevance

LAYOUTS = [make_layout(True, 0, 0, 2, 2), make_layout(False, 0, 0, 2, 2), make_layout(True, 1, 0, 2, 2),
           make_layout(True, 0, 4, 2, 2), make_layout(True, 0, 0, 2, 3)]
LAYOUT_IDS = ["class", "no-prefix", "class+dist", "class+4reg", "class-2x3"]
CLASS_1X2 = make_layout(True, 0, 0, 1, 2)  # 3 tokens: class, patch (0, 0), patch (0, 1)

# Layer 0, two heads over 3 tokens.
ATTENTION_0 = np.array([[[0.5, 0.5, 0.0], [0.2, 0.8, 0.0], [0.0, 0.4, 0.6]],
                        [[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
GRAD_0 = np.array([[[1.0, 2.0, -1.0], [0.0, 1.0, 3.0], [2.0, -1.0, 1.0]],
                   [[3.0, -2.0, 5.0], [1.0, 1.0, 1.0], [0.0, 0.0, 2.0]]])
# grad * attention, head 0: [[.5, 1, 0], [0, .8, 0], [0, -.4, .6]] -> positive part [[.5, 1, 0], [0, .8, 0], [0, 0, .6]]
#                   head 1: [[0, -2, 0], [0, 1, 0], [0, 0, 2]]      -> positive part [[0, 0, 0], [0, 1, 0], [0, 0, 2]]
# mean over heads Ā0 = [[.25, .5, 0], [0, .9, 0], [0, 0, 1.3]];  R1 = I + Ā0 @ I:
R1 = np.array([[1.25, 0.5, 0.0], [0.0, 1.9, 0.0], [0.0, 0.0, 2.3]])

# Layer 1: head 0 has gradient 1 everywhere, head 1 gradient 0, so Ā1 = attention / 2.
ATTENTION_1 = np.array([[[0.2, 0.4, 0.4], [0.0, 1.0, 0.0], [0.6, 0.0, 0.4]]] * 2)
GRAD_1 = np.stack([np.ones((3, 3)), np.zeros((3, 3))])
# Ā1 = [[.1, .2, .2], [0, .5, 0], [.3, 0, .2]]
# Ā1 @ R1, row 0: .1 [1.25 .5 0] + .2 [0 1.9 0] + .2 [0 0 2.3] = [.125, .43, .46]
#          row 1: .5 [0 1.9 0]                                 = [0, .95, 0]
#          row 2: .3 [1.25 .5 0] + .2 [0 0 2.3]                = [.375, .15, .46]
R2 = R1 + np.array([[0.125, 0.43, 0.46], [0.0, 0.95, 0.0], [0.375, 0.15, 0.46]])


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_zero_gradient_leaves_identity(layout):
    rng = np.random.default_rng(0)
    attention = rng.random((3, 2, layout.num_tokens, layout.num_tokens))
    gradient = np.zeros_like(attention)

    np.testing.assert_array_equal(chefer_matrix(attention, gradient), np.eye(layout.num_tokens))
    expected = np.zeros((layout.grid_h, layout.grid_w))
    expected[1, 0] = 1.0
    np.testing.assert_array_equal(chefer_relevance(attention, gradient, layout, query=(1, 0)), expected)
    if layout.has_class_token:
        np.testing.assert_array_equal(chefer_relevance(attention, gradient, layout, query="class"), 0.0)


def test_one_layer_hand_example_clamps_each_head_before_the_mean():
    matrix = chefer_matrix(ATTENTION_0[None], GRAD_0[None])
    np.testing.assert_allclose(matrix, R1)
    # Clamping after the head mean would give 0 at (0, 1) ((1 - 2) / 2 < 0); per head it is (1 + 0) / 2.
    assert matrix[0, 1] == pytest.approx(0.5)
    np.testing.assert_allclose(chefer_relevance(ATTENTION_0[None], GRAD_0[None], CLASS_1X2), [[0.5, 0.0]])


def test_two_layer_hand_example():
    attention = np.stack([ATTENTION_0, ATTENTION_1])  # (depth=2, heads=2, 3, 3)
    gradient = np.stack([GRAD_0, GRAD_1])
    np.testing.assert_allclose(chefer_matrix(attention, gradient), R2)
    np.testing.assert_allclose(chefer_relevance(attention, gradient, CLASS_1X2), [[0.93, 0.46]])
    np.testing.assert_allclose(chefer_relevance(attention, gradient, CLASS_1X2, query=(0, 1)), [[0.15, 2.76]])


def test_all_negative_products_contribute_nothing():
    attention = np.stack([ATTENTION_0, ATTENTION_1])
    np.testing.assert_array_equal(chefer_matrix(attention, -np.ones_like(attention)), np.eye(3))


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="gradient"):
        chefer_matrix(ATTENTION_0[None], GRAD_0)
