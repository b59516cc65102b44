"""An SAE feature and a DFF concept as targets of Grad-CAM, LeGrad and AttnLRP: hand-computed values on tiny
models, one check against plain autograd on a truncated model, and blocks after the target's taking no part."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import tiny_handle

from vit_inspect.analysis.concepts import concept_coefficients
from vit_inspect.core.errors import InputError
from vit_inspect.core.sae_file import SAEInfo, SparseAutoencoder
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.pipeline import analyze_pixels
from vit_inspect.passes.relevance import relevance_rules
from vit_inspect.passes.sae import block_output
from vit_inspect.passes.targets import (ConceptTarget, FeatureTarget, concept_target, explain_feature, legrad_blocks,
                                        target_maps)


def _pixels(seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, 3, 32, 32, generator=generator)


def picking_sae(handle, layer: int, channel: int, rival: int, scale: float = 2.0, b_enc: float = 0.0):
    """F = 2, k = 1: feature 0 reads x_channel / scale, feature 1 reads x_rival / scale; TopK_1 keeps the larger."""
    width = handle.embed_dim
    w_enc = torch.zeros(width, 2)
    w_enc[channel, 0] = w_enc[rival, 1] = 1.0
    info = SAEInfo(model=handle.name, layer=layer, k=1, features=2, width=width)
    return SparseAutoencoder(w_enc, torch.full((2,), b_enc), torch.randn(2, width), torch.zeros(width), info,
                             input_scale=torch.tensor(scale))


def _block_output(handle, pixels, layer: int) -> np.ndarray:
    seen = []
    with torch.no_grad(), block_output(handle, layer, seen.append):
        handle.forward(pixels)
    return seen[0][0].double().numpy()  # (N, D)


def test_gradcam_of_a_feature_that_picks_one_coordinate_is_computed_by_hand():
    handle = tiny_handle("cls")
    layout, pixels = handle.layout(), _pixels()
    sae = picking_sae(handle, layer=1, channel=3, rival=7)
    tokens = layout.patches(_block_output(handle, pixels, 1), axis=0)  # (P, D)
    x, rival = tokens[:, 3] / 2.0, tokens[:, 7] / 2.0
    active = (x > rival) & (x > 0)  # feature 0 kept by TopK_1 and positive
    assert 0 < active.sum() < len(active)  # the gates matter in this case
    # alpha = mean_p dS/dx_p = e_3 / 2 * (share of active patches); cam_p = x_p . alpha
    expected = layout.to_grid(tokens[:, 3] / 2.0 * active.mean())
    maps = target_maps(handle, pixels, FeatureTarget(sae, 0, "picking.safetensors"))
    np.testing.assert_allclose(maps.maps["gradcam"], expected, rtol=1e-5, atol=1e-6)
    assert maps.score == pytest.approx(float((x * active).sum()), rel=1e-5)
    assert maps.gradcam_layer == 1 and maps.legrad_layers == (0, 1)
    assert maps.target == {"kind": "sae_feature", "feature": 0, "sae": "picking.safetensors", "block": 1}


def _truncated_score(model, pixels, sae, feature, upto, read_at):
    """Plain autograd through timm's own modules, blocks 0 to ``upto`` only, the SAE written out again."""
    x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(pixels))))
    kept = None
    for index, block in enumerate(model.blocks[:upto + 1]):
        x = block(x)
        if index == read_at:
            kept = x
            kept.retain_grad()
    patches = x[:, model.num_prefix_tokens:]
    normalised = (patches - sae.input_mean) / sae.input_scale
    pre = (normalised - sae.b_dec) @ sae.W_enc + sae.b_enc  # (1, P, F)
    threshold = pre.topk(sae.info.k, dim=-1).values[..., -1:]
    z = torch.where(pre >= threshold, pre.clamp(min=0), torch.zeros_like(pre))
    z[..., feature].sum().backward()
    return kept[0].detach(), kept.grad[0]


def test_gradcam_of_a_feature_at_an_earlier_block_matches_autograd_on_a_truncated_model():
    handle = tiny_handle("cls", seed=1)
    layout, pixels = handle.layout(), _pixels(1)
    generator = torch.Generator().manual_seed(5)
    width, features = handle.embed_dim, 8
    info = SAEInfo(model=handle.name, layer=1, k=3, features=features, width=width)
    sae = SparseAutoencoder(torch.randn(width, features, generator=generator),
                            torch.randn(features, generator=generator), torch.randn(features, width, generator=generator),
                            torch.randn(width, generator=generator), info,
                            input_mean=torch.randn(width, generator=generator), input_scale=torch.tensor(1.5))
    feature = int(torch.randint(features, (1,), generator=generator))
    tokens, grad = _truncated_score(handle.model, pixels, sae, feature, upto=1, read_at=0)
    alpha = layout.patches(grad, axis=0).double().mean(0)  # (D,)
    expected = layout.to_grid(layout.patches(tokens, axis=0).double().numpy() @ alpha.numpy())
    ours = explain_feature(handle, pixels, sae, feature, "gradcam", gradcam_layer=0)
    assert np.abs(expected).max() > 1e-3
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())


def test_blocks_after_the_target_take_no_part():
    handle = tiny_handle("cls", seed=2)
    pixels = _pixels(2)
    sae = picking_sae(handle, layer=0, channel=1, rival=4)
    before = target_maps(handle, pixels, FeatureTarget(sae, 0))
    with torch.no_grad():
        for parameter in handle.blocks[1].parameters():
            parameter.mul_(-3.0)
    after = target_maps(handle, pixels, FeatureTarget(sae, 0))
    assert before.legrad_layers == (0,)
    for name in ("gradcam", "legrad", "attnlrp"):
        assert np.abs(before.maps[name]).max() > 0
        np.testing.assert_allclose(after.maps[name], before.maps[name], rtol=1e-5, atol=1e-7)


def test_attnlrp_enters_the_encoder_as_a_linear_layer_with_the_gates_held():
    """With every gate open (b_enc large, F = k = 1), the feature is x_c / s + b and AttnLRP of it equals
    AttnLRP of the linear score sum_p x_pc / s taken straight from the block's output."""
    handle = tiny_handle("cls", seed=3)
    layout, pixels = handle.layout(), _pixels(3)
    width = handle.embed_dim
    w_enc = torch.zeros(width, 1)
    w_enc[5, 0] = 1.0
    info = SAEInfo(model=handle.name, layer=1, k=1, features=1, width=width)
    sae = SparseAutoencoder(w_enc, torch.tensor([100.0]), torch.randn(1, width), torch.zeros(width), info,
                            input_scale=torch.tensor(2.0))
    ours = target_maps(handle, pixels, FeatureTarget(sae, 0), ("attnlrp",)).maps["attnlrp"]
    seen = []
    inputs = pixels.clone().requires_grad_(True)
    with torch.enable_grad(), capture_attention(handle), relevance_rules(handle) as lrp, \
            block_output(handle, 1, lambda t: None):
        handle.forward(inputs)
        seen.append(lrp.block_outputs[1])
    linear = (seen[0][0, layout.patch_slice, 5] / 2.0).sum()
    relevance = lrp.attnlrp(linear, inputs)[0].sum(0)  # (H, W)
    expected = relevance.reshape(layout.grid_h, layout.patch_h, layout.grid_w, layout.patch_w).sum((1, 3))
    np.testing.assert_allclose(ours, expected.double().numpy(), rtol=1e-5, atol=1e-7)


def test_legrad_of_a_feature_reads_the_feature_at_each_block():
    """LeGrad of a target at block 1 of a 2-block model averages blocks 0 and 1; with the SAE moved to block 0
    it reads block 0 only, and its map is then the first half of the sum."""
    handle = tiny_handle("cls", seed=4)
    pixels = _pixels(4)
    at_one = picking_sae(handle, layer=1, channel=2, rival=9, b_enc=1.0)
    at_zero = SparseAutoencoder(at_one.W_enc, at_one.b_enc, at_one.W_dec, at_one.b_dec,
                                SAEInfo(model=handle.name, layer=0, k=1, features=2, width=handle.embed_dim),
                                input_scale=at_one.input_scale)
    both = target_maps(handle, pixels, FeatureTarget(at_one, 0), ("legrad",)).maps["legrad"]
    first = target_maps(handle, pixels, FeatureTarget(at_zero, 0), ("legrad",)).maps["legrad"]
    assert legrad_blocks(1) == (0, 1) and legrad_blocks(9) == (6, 7, 8, 9)
    last = 2 * both - first  # mean of two blocks
    assert np.abs(first).max() > 0 and np.abs(last).max() > 0 and not np.allclose(first, last)
    assert (last >= -1e-12).all()  # each block's part is a mean of ReLU'd gradients


def test_a_feature_target_refuses_a_bad_index_and_a_later_gradcam_block():
    handle = tiny_handle("cls")
    sae = picking_sae(handle, layer=0, channel=0, rival=1)
    with pytest.raises(InputError, match="features 0 to 1"):
        FeatureTarget(sae, 2)
    with pytest.raises(InputError, match="up to 0"):
        target_maps(handle, _pixels(), FeatureTarget(sae, 0), ("gradcam",), gradcam_layer=1)
    with pytest.raises(InputError, match="explained by"):
        target_maps(handle, _pixels(), FeatureTarget(sae, 0), ("rollout",))


def test_concept_coefficients_return_the_true_coefficients_of_exact_combinations():
    generator = torch.Generator().manual_seed(0)
    parts = torch.rand(3, 10, generator=generator, dtype=torch.float64)  # (k, D)
    coefficients = torch.rand(6, 3, generator=generator, dtype=torch.float64)  # (P, k), non-negative
    offset = torch.randn(10, generator=generator, dtype=torch.float64)
    tokens = coefficients @ parts + offset
    np.testing.assert_allclose(concept_coefficients(tokens, parts, offset).numpy(), coefficients.numpy(),
                               atol=1e-10)


def test_gradcam_of_a_concept_is_each_patch_token_read_by_the_concept_projection():
    """S = sum_p (a_p - o) W⁺ e_j has the same gradient v = W⁺ e_j at every patch: Grad-CAM is a_p . v."""
    handle = tiny_handle("gap", seed=5)
    layout, pixels = handle.layout(), _pixels(5)
    result = analyze_pixels(handle, pixels, relevance=False)
    target = concept_target(handle, result, index=1, k=3, layer=1, seed=0)
    assert target.record() == {"kind": "dff_concept", "block": 1, "k": 3, "index": 1, "seed": 0,
                               "ordered_by_class": result.target}
    tokens = layout.patches(_block_output(handle, pixels, 1), axis=0)  # (P, D)
    direction = np.linalg.pinv(target.parts.astype(np.float64))[:, 1]  # (D,)
    maps = target_maps(handle, pixels, target, ("gradcam",))
    np.testing.assert_allclose(maps.maps["gradcam"], layout.to_grid(tokens @ direction), rtol=1e-4,
                               atol=1e-6 * np.abs(tokens @ direction).max())
    assert maps.score == pytest.approx(float(((tokens - target.offset) @ direction).sum()), rel=1e-4, abs=1e-6)


def test_a_concept_target_holds_the_image_factorisation():
    """The target keeps the factorisation's parts and offsets: the channels' minima over the image's patches (of
    the float16 tokens the pass kept), and parts whose pseudo-inverse reads the NMF's own parts back exactly."""
    handle = tiny_handle("cls", seed=6)
    layout, pixels = handle.layout(), _pixels(6)
    result = analyze_pixels(handle, pixels, relevance=False)
    target = concept_target(handle, result, index=0, k=2, layer=0)
    assert isinstance(target, ConceptTarget) and target.parts.shape == (2, handle.embed_dim)
    with pytest.raises(InputError, match="choose 0 to 1"):
        concept_target(handle, result, index=2, k=2, layer=0)
    tokens = layout.patches(_block_output(handle, pixels, 0), axis=0)  # (P, D) float64
    np.testing.assert_allclose(target.offset, tokens.min(0), atol=2e-3 * np.abs(tokens).max())
    parts = torch.as_tensor(target.parts, dtype=torch.float64)
    np.testing.assert_allclose(concept_coefficients(parts + torch.as_tensor(target.offset, dtype=torch.float64),
                                                    parts, torch.as_tensor(target.offset)).numpy(), np.eye(2),
                               atol=1e-6)


def test_no_hook_is_left_behind_after_an_exception():
    handle = tiny_handle("cls", seed=7)
    before = {name: (dict(m._forward_hooks), dict(m._forward_pre_hooks)) for name, m in handle.model.named_modules()}
    sae = picking_sae(handle, layer=1, channel=0, rival=1)
    with pytest.raises(RuntimeError):  # four channels: the patch embedding fails inside the forward
        target_maps(handle, torch.zeros(1, 4, 32, 32), FeatureTarget(sae, 0))
    after = {name: (dict(m._forward_hooks), dict(m._forward_pre_hooks)) for name, m in handle.model.named_modules()}
    assert after == before
    np.testing.assert_allclose(target_maps(handle, _pixels(7), FeatureTarget(sae, 0), ("gradcam",)).maps["gradcam"],
                               explain_feature(handle, _pixels(7), sae, 0), rtol=1e-6)
