"""Lens, head statistics in the pass, ablated analyses and per-image head importance on tiny models."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from support import TINY_TIMM, sharpen_attention, tiny_handle, tiny_hf

from vit_inspect.core.errors import Cancelled, VitInspectError
from vit_inspect.core.hf_models import handle_from_hf
from vit_inspect.passes.interventions import ablate_heads, head_output_module
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.studies.ablation import (
    ablation_effect,
    analyze_ablated,
    head_importance,
)


def _picture(size):
    rng = np.random.default_rng(3)
    return Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8))


def test_layer_blocks_join_layers_up_to_the_byte_bound(monkeypatch):
    from vit_inspect.passes import head_pass

    layers = [torch.full((1, 3, 4), float(i)) for i in range(5)]  # 48 bytes each
    monkeypatch.setattr(head_pass, "LENS_BYTES", 100)
    blocks = head_pass._layer_blocks(layers)
    assert [b.shape[0] for b in blocks] == [2, 2, 1]
    assert torch.equal(torch.cat(blocks), torch.cat(layers))
    monkeypatch.setattr(head_pass, "LENS_BYTES", 10)  # under one layer: still one layer per block
    assert [b.shape[0] for b in head_pass._layer_blocks(layers)] == [1] * 5


@pytest.mark.parametrize("kind", ["distilled", "gap"])
def test_lens_in_one_batch_equals_the_lens_layer_by_layer(kind, monkeypatch):
    """Every block's residual stream through the head in one call, or one block per call (a byte bound under
    one layer): the same lens logits and token norms."""
    from vit_inspect.passes import head_pass

    handle = tiny_handle(kind)
    batched = analyze_image(handle, _picture(TINY_TIMM[kind][1])).heads
    monkeypatch.setattr(head_pass, "LENS_BYTES", 1)
    alone = analyze_image(handle, _picture(TINY_TIMM[kind][1])).heads
    assert set(batched.lens) == set(alone.lens) and batched.lens
    for name in batched.lens:
        np.testing.assert_allclose(batched.lens[name], alone.lens[name], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batched.token_norms, alone.token_norms, rtol=1e-6)


@pytest.mark.parametrize("kind", ["cls", "gap", "distilled", "reg4"])
def test_lens_after_last_block_is_the_model_and_after_block_0_is_replayed(kind):
    handle = tiny_handle(kind)
    result = analyze_image(handle, _picture(TINY_TIMM[kind][1]))
    lens = result.heads.lens
    np.testing.assert_allclose(lens["readout"][-1], result.heads.logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.heads.logits, np.log(result.probs) - np.log(result.probs).mean()
                               + result.heads.logits.mean(), rtol=1e-4, atol=1e-4)
    model = handle.model
    pixels, _ = handle.preprocess.apply(_picture(TINY_TIMM[kind][1]))
    with torch.no_grad():
        tokens = model.blocks[0](model.norm_pre(model._pos_embed(model.patch_embed(pixels))))
        np.testing.assert_allclose(lens["readout"][0], model.forward_head(model.norm(tokens))[0].numpy(),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(result.heads.token_norms[0], tokens[0].norm(dim=-1).numpy(), rtol=1e-5)
    if kind == "distilled":
        np.testing.assert_allclose((lens["class"] + lens["distillation"]) / 2, lens["readout"], rtol=1e-5, atol=1e-5)
    else:
        assert set(lens) == {"readout"}


def test_hf_lens_and_the_note_for_models_without_a_head():
    handle = handle_from_hf(tiny_hf(distilled=True), device="cpu")
    result = analyze_image(handle, _picture((32, 32)))
    assert set(result.heads.lens) == {"readout", "class", "distillation"}
    np.testing.assert_allclose(result.heads.lens["readout"][-1], result.heads.logits, rtol=1e-5, atol=1e-5)
    from timm.models.vision_transformer import VisionTransformer

    from vit_inspect.core.timm_models import handle_from_timm
    headless = handle_from_timm(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                                  num_classes=0).eval(), device="cpu")
    result = analyze_image(headless, _picture((32, 32)))
    assert result.heads.lens == {} and "no classification head" in result.heads.lens_note
    assert result.heads.first_order is None and result.heads.entropy.shape == (2, 2)


def test_first_order_equals_the_derivative_of_scaling_the_head_output():
    """sum_ij A dy/dA = dy/dxi for the head output scaled by xi: checked by central differences."""
    handle = sharpen_attention(tiny_handle("cls"))
    picture = _picture((32, 32))
    result = analyze_image(handle, picture)
    layer, head, eps = 1, 0, 1e-3
    cols = slice(head * 16, (head + 1) * 16)
    pixels, _ = handle.preprocess.apply(picture)

    def scaled(xi):
        def hook(module, args):
            x = args[0].clone()
            x[..., cols] *= xi
            return (x,)
        h = head_output_module(handle, layer).register_forward_pre_hook(hook)
        try:
            with torch.no_grad():
                return handle.forward(pixels)[0, result.target].item()
        finally:
            h.remove()

    numeric = (scaled(1 + eps) - scaled(1 - eps)) / (2 * eps)
    assert result.heads.first_order[layer, head] == pytest.approx(numeric, rel=1e-2, abs=1e-4)


@pytest.mark.parametrize("mode", ["zero", "uniform"])
def test_importance_equals_one_ablation_per_head(mode):
    handle = sharpen_attention(tiny_handle("distilled"))
    picture = _picture((32, 32))
    calls = []
    importance = head_importance(handle, picture, mode=mode, batch_size=3, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(3, 5), (5, 5)]
    pixels, _ = handle.preprocess.apply(picture)
    with torch.no_grad():
        base = handle.forward(pixels)[0]
        target = int(base.argmax())
        for layer in range(2):
            for head in range(2):
                with ablate_heads(handle, [(layer, head)], mode):
                    ablated = handle.forward(pixels)[0]
                assert importance.logit_drop[layer, head] == pytest.approx(float(base[target] - ablated[target]), abs=1e-5)
                assert importance.prob_drop[layer, head] == pytest.approx(
                    float(base.softmax(-1)[target] - ablated.softmax(-1)[target]), abs=1e-6)
    assert importance.target == target and importance.logit == pytest.approx(float(base[target]), abs=1e-5)
    assert np.abs(importance.logit_drop).max() > 1e-3
    same = head_importance(handle, picture, mode=mode, batch_size=1)
    np.testing.assert_allclose(same.logit_drop, importance.logit_drop, atol=1e-5)


def test_importance_can_be_cancelled_and_checks_its_input():
    handle = tiny_handle("cls")
    seen = []
    with pytest.raises(Cancelled, match="after 2 of 5"):
        head_importance(handle, _picture((32, 32)), batch_size=2, progress=lambda d, t: seen.append(d),
                        cancelled=lambda: bool(seen))
    assert seen == [2]
    with pytest.raises(VitInspectError, match="out of range"):
        head_importance(handle, _picture((32, 32)), target=10)


def test_analyze_ablated_shows_the_ablated_model():
    handle = sharpen_attention(tiny_handle("cls"))
    picture = _picture((32, 32))
    original = analyze_image(handle, picture)
    ablated = analyze_ablated(handle, picture, [(1, 0)], "uniform", target=original.target)
    n = original.layout.num_tokens
    np.testing.assert_allclose(ablated.attention_map(1, 0), np.full((4, 4), 1 / n), rtol=1e-3)
    assert np.abs(ablated.attention_map(1, 1) - original.attention_map(1, 1)).max() < 1e-3  # layer 1's input unchanged
    effect = ablation_effect(original, ablated)
    importance = head_importance(handle, picture, mode="uniform")
    assert effect.delta_logit == pytest.approx(-importance.logit_drop[1, 0], abs=1e-4)
    assert effect.prob_before == pytest.approx(importance.prob, abs=1e-5)
    assert effect.top_before[0][0] == original.target and len(effect.top_after) == 5
    assert ablated.target == original.target and ablated.gradcam is not None
    assert all(a.fused_attn for a in handle.attention_modules)
