"""Head facts on the real DeiT-Ti/16 weights (see the README's "Heads" section for the numbers)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import IMAGENET, PHOTOS

from bench.facts_heads import (
    layer_vs_head_kl,  # the same measurement as the README's fact
)
from vit_inspect.analysis.heads import head_entropy
from vit_inspect.analysis.logit_lens import lens_ranks, settled_block
from vit_inspect.analysis.rank_correlation import spearman
from vit_inspect.core.images import find_images, load_image
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.studies.ablation import head_importance

pytestmark = pytest.mark.slow
RHO_FLOOR = 0.5  # measured: mean 0.735 over 8 ImageNet samples (python -m bench.facts_heads)


def test_a_whole_layer_usually_but_not_always_changes_the_prediction_more_than_any_head_in_it(deit):
    """Measured, not assumed: zero-ablating all heads of a layer moves the class distribution more than
    its most disruptive single head in most layers, but heads can cancel (chelsea, layer 8: the layer
    0.043 nats, its head 0 alone 0.115). bench.facts_heads: 73 of 96 (image, layer) pairs on 8 samples."""
    wins = []
    for photo in ("chelsea.png", "coffee.png"):
        layer_kl, head_kl = layer_vs_head_kl(deit, PHOTOS / photo)
        wins.extend(layer_kl > head_kl.max(axis=1))
    assert 0.6 <= np.mean(wins) < 1.0, wins


def test_lens_rank_of_the_final_class_reaches_1_before_the_last_block(deit):
    files = find_images([IMAGENET])[::50]  # 20 of the 1000 samples; the README's mean is over every 10th
    blocks = []
    for path in files:
        result = analyze_image(deit, path, gradients=False)
        final = int(np.argmax(result.heads.logits))
        ranks = lens_ranks(result.heads.lens["readout"], final)
        assert ranks[-1] == 1  # the lens after the last block is the model
        blocks.append(settled_block(ranks))
    assert np.mean([b < deit.depth - 1 for b in blocks]) >= 0.8
    assert 6 <= np.mean(blocks) <= 10.5


def test_first_order_estimate_ranks_heads_like_real_ablation(deit):
    rhos = []
    for path in [PHOTOS / "chelsea.png", PHOTOS / "coffee.png", *find_images([IMAGENET])[::250]]:
        result = analyze_image(deit, path)
        importance = head_importance(deit, path, target=result.target, batch_size=37)
        rhos.append(spearman(result.heads.first_order, importance.logit_drop))
    assert np.mean(rhos) > RHO_FLOOR, rhos


def test_entropy_from_the_kept_float16_maps_is_within_2e_5_nats_of_the_float32_maps(deit):
    """DeiT-Ti keeps its maps in float16 and reads its entropy from them (`HeadPass.entropy`): on real
    weights the roundings cancel, so it is far inside the first-order bound 2^-11 (H + 1) (1.5e-5 measured)."""
    for photo in ("chelsea.png", "coffee.png"):
        result = analyze_image(deit, PHOTOS / photo, gradients=False)
        pixels = deit.preprocess.apply(load_image(PHOTOS / photo))[0]
        with torch.no_grad(), capture_attention(deit) as rec:
            deit.forward(pixels)
        exact = head_entropy(rec.attention[0].numpy())  # (depth, heads) of the float32 maps
        assert result.heads.computed_entropy is None
        assert np.abs(result.heads.entropy - exact).max() < 2e-5
        assert 0.5 < exact.min() and exact.max() < np.log(deit.layout().num_tokens)


def test_entropy_from_the_rebuilt_maps_at_448_px_is_within_float16s_bound_of_the_float32_maps(deit):
    """At 448 px DeiT-Ti keeps queries and keys (785 tokens), and its entropy is read from rows rebuilt from
    them (`HeadPass.entropy`). Rounding q and k to float16 moves each log-probability by at most about
    2^-11 (relative), so the entropy moves by at most the first-order bound 2^-11 (H + 1) nats per head
    (>= 1e-3 here). On real weights the largest error is 1.8e-4 to 2.6e-4 nats depending on the CPU's
    kernels; a wrong scale, a missing softmax or a wrong row would miss the bound by orders of magnitude."""
    for photo in ("chelsea.png", "coffee.png"):
        result = analyze_image(deit, PHOTOS / photo, gradients=False, input_size=(448, 448))
        assert result.attention_store.mode == "qk16" and result.heads.computed_entropy is None
        pixels = deit.preprocess.apply(load_image(PHOTOS / photo), (448, 448))[0]
        with torch.no_grad(), capture_attention(deit) as rec:
            deit.forward(pixels)
        exact = head_entropy(rec.attention[0].numpy())
        bound = 2.0**-11 * (exact + 1.0)
        assert np.all(np.abs(result.heads.entropy - exact) <= bound)
        assert np.abs(result.heads.entropy - exact).mean() < 1e-4
