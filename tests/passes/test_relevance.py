"""AttnLRP and LeGrad: conservation, hand-computed rules and readouts, no effect on the ordinary
gradients, hooks removed after an exception, and agreement with the lxt / torchcam reference maps."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import IMAGENET, SHARED, make_layout, tiny_handle, tiny_hf, zero_biases
from torch import nn

from vit_inspect.analysis import legrad_map, patch_relevance
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.passes.relevance import LRPRules, gamma_rule, relevance_rules

REFERENCE = SHARED / "reference" / "faithfulness_deit_tiny_20.npz"


def test_legrad_map_by_hand():
    layout = make_layout(True, 0, 0, grid_h=1, grid_w=2)  # tokens: class, p0, p1
    grads = np.zeros((2, 2, 3, 3))
    grads[0, 0, :, 1] = 3.0  # layer 0, head 0: every query +3 on p0 -> mean over 2 heads, 3 queries = 1.5
    grads[0, 1, 0, 2] = -6.0  # negative: removed by the ReLU
    grads[1, 1, 0, 2] = 6.0  # layer 1, head 1, class query only: 6 / (2·3) = 1
    np.testing.assert_allclose(legrad_map(grads, layout), [[1.5 / 2, 1.0 / 2]])  # mean over the 2 layers


def test_patch_relevance_sums_channels_and_patches():
    layout = make_layout(True, 0, 0, grid_h=1, grid_w=2, patch_h=2, patch_w=2)
    relevance = np.zeros((3, 2, 4))
    relevance[0, 0, 0], relevance[2, 1, 1], relevance[1, 0, 3] = 1.0, 2.0, -0.5
    np.testing.assert_allclose(patch_relevance(relevance, layout), [[3.0, -0.5]])


def test_gamma_rule_by_hand():
    # one output y = 1·x0 - 1·x1 + 0 with x = (2, 1): y = 1 > 0; γ = 0.5 -> W⁺ = (1.5, -1),
    # denominator x⁺·W⁺ = 3 - 1 = 2; R = (2·1.5, 1·(-1)) · R_out / 2 with R_out = y·g = 1·2 = 2
    weight, x = torch.tensor([[1.0, -1.0]]), torch.tensor([[2.0, 1.0]])
    rule = gamma_rule(torch.nn.functional.linear, weight, None, 0.5, 1e-12)
    grad = rule(x, x @ weight.T, torch.tensor([[2.0]]))
    np.testing.assert_allclose((x * grad).numpy(), [[3.0, -1.0]], rtol=1e-6)
    # γ = 0 is LRP-0, i.e. the plain gradient
    plain = gamma_rule(torch.nn.functional.linear, weight, torch.tensor([0.3]), 0.0, 1e-12)
    np.testing.assert_allclose(plain(x, x @ weight.T + 0.3, torch.tensor([[2.0]])).numpy(), [[2.0, -2.0]], rtol=1e-6)



def _four_product_gamma(forward, weight, bias, gamma, stabilizer, x, y, grad):
    """zennit's Gamma rule as written (four products, four transposed products), the form the two-product
    `gamma_rule` rewrites."""
    w_pos, w_neg = weight + gamma * weight.clamp(min=0), weight + gamma * weight.clamp(max=0)
    b_pos = None if bias is None else bias + gamma * bias.clamp(min=0)
    b_neg = None if bias is None else bias + gamma * bias.clamp(max=0)
    relevance_out = grad * y
    inputs = [t.detach().requires_grad_() for t in (x.clamp(min=0), x.clamp(max=0), x.clamp(min=0), x.clamp(max=0))]
    outputs = [forward(inputs[0], w_pos, b_pos), forward(inputs[1], w_neg, None),
               forward(inputs[2], w_neg, b_neg), forward(inputs[3], w_pos, None)]
    stab = lambda t, e: t + ((t == 0).to(t) + t.sign()) * e
    upper = (y > 0) * relevance_out / stab(outputs[0] + outputs[1], stabilizer)
    lower = (y < 0) * relevance_out / stab(outputs[2] + outputs[3], stabilizer)
    grads = torch.autograd.grad(outputs, inputs, [upper, upper, lower, lower])
    return sum(i.detach() * g for i, g in zip(inputs, grads)) / stab(x, 1e-10)


@pytest.mark.parametrize("gamma", [0.0, 0.1, 0.25, 1.0])
@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_two_product_gamma_rule_equals_the_four_product_form(gamma, kind):
    seed = int(gamma * 100) + (kind == "conv")
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():  # the layer's own initialisation seeded too, whatever ran before
        torch.manual_seed(seed)
        module = nn.Linear(24, 16) if kind == "linear" else nn.Conv2d(3, 8, kernel_size=4, stride=4)
    if kind == "linear":
        x = torch.randn(2, 5, 24, generator=generator, dtype=torch.float64).float()
        forward = torch.nn.functional.linear
    else:
        x = torch.randn(2, 3, 8, 8, generator=generator)
        forward = module._conv_forward
    x[0, 0] = 0.0  # zero inputs get no relevance in both forms
    with torch.no_grad():
        module.bias.uniform_(-0.5, 0.5, generator=generator)
        y = module(x)
    grad = torch.randn(y.shape, generator=generator)
    weight, bias = module.weight.detach(), module.bias.detach()
    ours = gamma_rule(forward, weight, bias, gamma, 1e-6, channels_first=kind == "conv")(x, y, grad)
    expected = _four_product_gamma(forward, weight, bias, gamma, 1e-6, x, y, grad)
    assert (y > 0).any() and (y < 0).any()
    np.testing.assert_allclose((x * ours).numpy(), (x * expected).numpy(), rtol=1e-4,
                               atol=1e-5 * float((x * expected).abs().max()))

@pytest.mark.parametrize("rules", [LRPRules(), LRPRules(conv_gamma=0.0, linear_gamma=0.0)])
def test_attnlrp_conserves_the_logit_on_a_tiny_model(rules):
    """Without biases, all relevance of the logit lands on the pixels, the class token and the
    position embeddings (the only other inputs): sum = logit, up to the stabilisers."""
    handle = tiny_handle("cls", seed=3)
    model = handle.model
    zero_biases(model)
    pixels = torch.randn(1, 3, 32, 32, requires_grad=True)
    with capture_attention(handle), relevance_rules(handle, rules) as lrp:
        logits = handle.forward(pixels)
        target = logits[0, 4]
        with lrp.lrp_mode():
            grads = torch.autograd.grad(target, [pixels, model.cls_token, model.pos_embed])
    parts = [float((t.detach() * g).sum()) for t, g in zip([pixels, model.cls_token, model.pos_embed], grads)]
    assert sum(parts) == pytest.approx(float(target), rel=1e-4)
    assert abs(parts[0]) > 1e-3 and abs(parts[0] - float(target)) > 1e-3  # the pixels get a share, not all of it


def test_attnlrp_biases_absorb_relevance_and_the_gradient_is_untouched():
    handle = tiny_handle("cls", seed=1)
    pixels = torch.randn(1, 3, 32, 32)
    plain = analyze_image_tensors(handle, pixels, rules=False)
    ruled = analyze_image_tensors(handle, pixels, rules=True)
    for a, b in zip(plain, ruled):  # the ordinary gradients pass the switches unchanged
        torch.testing.assert_close(a, b)


def analyze_image_tensors(handle, pixels, rules: bool):
    pixels = pixels.clone().requires_grad_()
    with capture_attention(handle, activation_layers=[1]) as rec:
        if rules:
            with relevance_rules(handle):
                logits = handle.forward(pixels)
        else:
            logits = handle.forward(pixels)
        rec.backward(logits[0, 2])
    return rec.attention_grad(), rec.activation_grad(1), logits.detach()


def test_hooks_are_removed_after_an_exception():
    handle = tiny_handle("cls")
    counts = [(len(m._forward_hooks)) for m in handle.model.modules()]
    with pytest.raises(RuntimeError, match="boom"):
        with relevance_rules(handle):
            handle.forward(torch.randn(1, 3, 32, 32))
            raise RuntimeError("boom")
    assert [len(m._forward_hooks) for m in handle.model.modules()] == counts


@pytest.mark.parametrize("kind", ["cls", "gap", "distilled", "reg4", "nonsquare"])
def test_maps_in_the_pass_for_every_layout(kind):
    handle = tiny_handle(kind)
    result = analyze_image(handle, torch_image(handle))
    layout = result.layout
    assert result.legrad.shape == result.attnlrp.shape == (layout.grid_h, layout.grid_w)
    assert np.all(result.legrad >= 0) and result.legrad.max() > 0
    assert np.abs(result.attnlrp).max() > 0


def test_hf_model_gets_both_maps():
    from vit_inspect.core.hf_models import handle_from_hf

    handle = handle_from_hf(tiny_hf(), device="cpu")
    result = analyze_image(handle, torch_image(handle))
    assert result.legrad is not None and result.legrad.max() > 0
    assert result.attnlrp is not None and np.abs(result.attnlrp).max() > 0


def torch_image(handle):
    from PIL import Image

    rng = np.random.default_rng(0)
    height, width = handle.input_size
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))


@pytest.mark.slow
def test_legrad_and_attnlrp_equal_the_reference_maps_on_20_images(deit):
    """torchcam 0.5 LeGrad (class-token projection, last 4 blocks) and lxt 2.1 AttnLRP on a torchvision
    ViT with the same weights: the same maps up to float rounding."""
    from scipy.stats import spearmanr

    if not REFERENCE.is_file():
        pytest.skip("reference maps not available")
    reference = np.load(REFERENCE)
    for name in (SHARED / "reference" / "faithfulness_files.txt").read_text().split():
        stem = name.rsplit(".", 1)[0]
        result = analyze_image(deit, IMAGENET / name)
        assert result.target == int(reference[f"{stem}/target"])
        for ours, key in ((result.legrad, "legrad_cls"), (result.attnlrp, "attnlrp")):
            theirs = reference[f"{stem}/map/{key}"]
            assert spearmanr(ours.ravel(), theirs.ravel())[0] > 0.999, (stem, key)
            np.testing.assert_allclose(ours, theirs, atol=1e-4 * np.abs(theirs).max(), err_msg=f"{stem} {key}")


def test_hf_distilled_model_without_a_single_head_still_gets_the_other_maps():
    from vit_inspect.core.hf_models import handle_from_hf

    handle = handle_from_hf(tiny_hf(distilled=True), device="cpu")
    result = analyze_image(handle, torch_image(handle))
    assert result.gradcam is not None and result.chefer is not None
    assert result.legrad is None  # two heads averaged: no single class score per layer to follow
    assert result.attnlrp is not None
