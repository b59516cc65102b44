"""Faithfulness metrics: hand-computed AUCs, a model whose output is a known function of the patches,
and agreement with the peer reference curves on the real DeiT-Ti weights."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import IMAGENET, SHARED, make_layout

from vit_inspect.analysis.faithfulness import (
    DEL_INS_FRACTIONS,
    POS_NEG_FRACTIONS,
    Curves,
    PerturbationSettings,
    auc,
    compose,
    patch_counts,
    plan_perturbations,
    ranking,
)
from vit_inspect.studies.faithfulness import (
    FaithfulnessAccumulator,
    ImageFaithfulness,
    score_maps,
)

REFERENCE = SHARED / "reference" / "faithfulness_deit_tiny_20.npz"


def test_auc_by_hand():
    pos = np.array([1, 1, 0, 0, 0, 0, 0, 0, 0, 0], dtype=float)
    assert auc(pos, POS_NEG_FRACTIONS, 100.0) == pytest.approx(15.0)  # .1·(1+1)/2 + .1·(1+0)/2 = .15
    assert auc(np.ones(10), POS_NEG_FRACTIONS, 100.0) == pytest.approx(90.0)  # an always-right model
    deletion = np.linspace(1.0, 0.0, 11)
    assert auc(deletion, DEL_INS_FRACTIONS) == pytest.approx(0.5)
    curves = Curves(pos=pos, neg=np.ones(10), deletion=deletion, insertion=deletion[::-1])
    assert curves.aucs() == pytest.approx({"pos": 15.0, "neg": 90.0, "del": 0.5, "ins": 0.5})


def test_counts_and_ranking_with_ties():
    assert patch_counts(POS_NEG_FRACTIONS, 196).tolist() == [0, 20, 39, 59, 78, 98, 118, 137, 157, 176]
    relevance = np.array([0.0, 3.0, 0.0, 1.0])
    permutation = np.array([2, 0, 3, 1])
    assert ranking(relevance, permutation).tolist() == [1, 3, 2, 0]  # the tie 0/2 in permutation order
    assert ranking(relevance, permutation, descending=False).tolist() == [2, 0, 3, 1]
    with pytest.raises(ValueError, match="NaN"):
        ranking(np.array([np.nan, 1, 2, 3]), permutation)


def test_plan_shares_inputs_between_curves_and_methods():
    permutation = np.arange(4)
    maps = {"a": np.array([[4.0, 3.0], [2.0, 1.0]]), "b": np.array([[1.0, 2.0], [3.0, 4.0]])}
    plan = plan_perturbations(maps, permutation)
    # P=4: pos/del remove round(4k) = 0,0,1,1,2,2,2,3,3,4 patches; "b" ranks the reverse of "a", so a's
    # negative perturbation inputs are b's positive ones. Distinct inputs: clean, 3 removals of a,
    # 3 of b, all removed, blurred start, 3 insertions of a and 3 of b.
    assert plan.keep.shape == (1 + 3 + 3 + 1 + 1 + 3 + 3, 4)
    assert np.array_equal(plan.index["a"]["neg"], plan.index["b"]["pos"])
    assert np.array_equal(plan.index["a"]["del"][:10], plan.index["a"]["pos"][[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
    clean = plan.index["a"]["pos"][0]
    assert plan.keep[clean].all() and plan.index["b"]["ins"][-1] == clean  # k = 1 of insertion is the clean image
    assert plan.keep[plan.index["a"]["del"][3]].tolist() == [False, True, True, True]  # round(.3·4) = 1 patch


def test_compose_replaces_whole_patches():
    layout = make_layout(True, 0, 0, grid_h=2, grid_w=2, patch_h=2, patch_w=3)
    pixels = torch.arange(3 * 4 * 6, dtype=torch.float32).view(3, 4, 6) + 1
    replacements = torch.stack([torch.zeros(3, 4, 6), -torch.ones(3, 4, 6)])
    batch = compose(pixels, replacements, np.array([[True, False, True, True], [False, False, False, True]]),
                    np.array([0, 1]), layout)
    assert batch.shape == (2, 3, 4, 6)
    assert torch.equal(batch[0, :, :2, 3:], torch.zeros(3, 2, 3)) and torch.equal(batch[0, :, 2:], pixels[:, 2:])
    assert torch.equal(batch[1, :, :2], -torch.ones(3, 2, 6)) and torch.equal(batch[1, :, 2:, 3:], pixels[:, 2:, 3:])


def linear_patch_model(weights: torch.Tensor, layout):
    """A model whose logits are a known linear function of the patch means: logit_c = Σ_p W[c, p] · mean(patch p)."""
    def score(batch: torch.Tensor) -> torch.Tensor:
        means = torch.nn.functional.avg_pool2d(batch, (layout.patch_h, layout.patch_w)).mean(1).flatten(1)  # (B, P)
        return (means @ weights.T).softmax(-1)
    return score


def test_the_true_contribution_map_wins_on_a_known_model():
    layout = make_layout(True, 0, 0, grid_h=4, grid_w=4, patch_h=4, patch_w=4)
    torch.manual_seed(0)
    weights = torch.randn(3, layout.num_patches) * 4
    pixels = torch.rand(3, 16, 16) + 0.5  # positive patch means
    score = linear_patch_model(weights, layout)
    target = int(score(pixels[None]).argmax())
    means = torch.nn.functional.avg_pool2d(pixels[None], 4).mean(1).flatten()  # (P,)
    # removing patch p (setting it to 0) changes logit_c by -W[c, p]·mean_p: the true relevance for
    # the target against the strongest rival
    rival = [c for c in range(3) if c != target]
    truth = (weights[target] * means - weights[rival].mean(0) * means).view(4, 4).numpy()
    rng = np.random.default_rng(0)
    maps = {"truth": truth, "inverse": -truth, "random": rng.random((4, 4))}
    curves = score_maps(score, pixels, layout, maps, label=target, target=target,
                        permutation=rng.permutation(16), settings=PerturbationSettings(insertion_start="mean"),
                        batch_size=5)
    aucs = {name: c.aucs() for name, c in curves.items()}
    assert aucs["truth"]["del"] < aucs["random"]["del"] < aucs["inverse"]["del"]
    assert aucs["truth"]["ins"] > aucs["inverse"]["ins"]
    assert aucs["truth"]["pos"] <= aucs["random"]["pos"] <= aucs["inverse"]["pos"]
    assert aucs["truth"]["neg"] >= aucs["inverse"]["neg"]
    # the curves are the model's own numbers: k = 0 is the clean image, deletion ends at the all-mean image
    clean = score(pixels[None])[0, target].item()
    assert curves["truth"].deletion[0] == pytest.approx(clean, rel=1e-6)
    assert curves["truth"].deletion[-1] == pytest.approx(1 / 3, rel=1e-6)  # all logits 0: uniform
    assert curves["truth"].insertion[-1] == pytest.approx(clean, rel=1e-6)
    # batching does not change a number
    again = score_maps(score, pixels, layout, maps, target, target, np.random.default_rng(0).permutation(16),
                       PerturbationSettings(insertion_start="mean"), batch_size=1000)
    assert again["random"].aucs() != aucs["truth"]
    # to float32 rounding: a matrix product's kernel may change with the batch's size, and a softmax of logits
    # near -25 turns its last-bit differences into a few 1e-6 of a probability near 1e-11
    np.testing.assert_allclose(again["truth"].deletion, curves["truth"].deletion, rtol=2e-5)


def test_accumulator_mean_se_and_merge():
    def result(value: float) -> ImageFaithfulness:
        curve = Curves(pos=np.full(10, value), neg=np.full(10, value), deletion=np.full(11, value),
                       insertion=np.full(11, value))
        return ImageFaithfulness(label=0, target=0, correct=True, curves={"m": curve})

    left, right = FaithfulnessAccumulator(), FaithfulnessAccumulator()
    left.add(result(0.0))
    left.add(result(1.0))
    right.add(result(0.5))
    table = left.merge(right).table()["m"]
    # del AUC of a constant curve v is v; values 0, 1, .5: mean .5, sd .5, s.e. .5/√3
    assert table["del"] == pytest.approx((0.5, 0.5 / np.sqrt(3)))
    assert table["pos"] == pytest.approx((45.0, 45.0 / np.sqrt(3)))


@pytest.fixture(scope="module")
def reference():
    if not REFERENCE.is_file():
        pytest.skip("reference curves not available")
    return np.load(REFERENCE)


def tie_free_points(relevance: np.ndarray, counts: np.ndarray, descending: bool) -> np.ndarray:
    """Which curve points remove a set of patches that does not depend on how ties are broken."""
    values = np.sort(relevance.ravel())[::-1] if descending else np.sort(relevance.ravel())
    return np.array([c == 0 or c == values.size or values[c - 1] != values[c] for c in counts])


@pytest.mark.slow
def test_reference_curves_are_reproduced_exactly_up_to_ties(deit, reference):
    """The shared reference curves (peer libraries, same model) for their own maps, on two of the 20 images."""
    from vit_inspect.core.images import load_image
    from vit_inspect.studies.faithfulness import model_scorer

    files = (SHARED / "reference" / "faithfulness_files.txt").read_text().split()
    methods = ("gradcam_relu", "attnlrp", "legrad_cls", "chefer", "attention")
    layout = deit.layout()
    checked = 0
    for name in files[:2]:
        stem = name.rsplit(".", 1)[0]
        pixels, _ = deit.preprocess.apply(load_image(IMAGENET / name))
        maps = {m: reference[f"{stem}/map/{m}"] for m in methods}
        curves = score_maps(model_scorer(deit), pixels, layout, maps, int(reference[f"{stem}/label"]),
                            int(reference[f"{stem}/target"]), np.random.default_rng(1).permutation(196))
        for method in methods:
            for curve, field, fractions in (("pos", "pos", POS_NEG_FRACTIONS), ("neg", "neg", POS_NEG_FRACTIONS),
                                            ("del", "deletion", DEL_INS_FRACTIONS),
                                            ("ins", "insertion", DEL_INS_FRACTIONS)):
                free = tie_free_points(maps[method], patch_counts(fractions, 196), descending=curve != "neg")
                ours, theirs = getattr(curves[method], field), reference[f"{stem}/{curve}/{method}"]
                np.testing.assert_allclose(ours[free], theirs[free], atol=2e-5, err_msg=f"{stem} {method} {curve}")
                checked += int(free.sum())
    assert checked > 300
