"""Attention capture: every layer and head, rows sum to 1, parity with fused attention, clean exit."""
from __future__ import annotations

import pytest
import torch
from support import TINY_TIMM, tiny_handle, tiny_hf

from vit_inspect.core.errors import CaptureError
from vit_inspect.core.hf_models import handle_from_hf
from vit_inspect.passes.capture import capture_attention


def _forward(handle, batch=2, grad=False):
    height, width = handle.input_size
    x = torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(0))
    with torch.set_grad_enabled(grad):
        with capture_attention(handle, activation_layers=[-1]) as rec:
            logits = handle.forward(x)
    return x, logits, rec


def test_capture_shapes_and_rows(tiny_kind):
    handle = tiny_handle(tiny_kind)
    x, logits, rec = _forward(handle)
    layout = handle.layout()
    attention = rec.attention
    assert attention.shape == (2, handle.depth, handle.num_heads, layout.num_tokens, layout.num_tokens)
    torch.testing.assert_close(attention.sum(-1), torch.ones(attention.shape[:-1]))
    assert rec.activation(handle.depth - 1).shape == (2, layout.num_tokens, handle.embed_dim)


def test_capture_matches_fused_model(tiny_kind):
    handle = tiny_handle(tiny_kind)
    assert all(a.fused_attn for a in handle.attention_modules)  # timm's default: no maps at all
    x, logits, _ = _forward(handle)
    with torch.no_grad():
        plain = handle.forward(x)
    torch.testing.assert_close(logits, plain, rtol=1e-5, atol=1e-5)


def test_attention_equals_softmax_of_scaled_scores():
    """Layer 0 recomputed by hand from the block's own qkv weights."""
    handle = tiny_handle("reg4")
    x, _, rec = _forward(handle, batch=1)
    model = handle.model
    with torch.no_grad():
        tokens = model._pos_embed(model.patch_embed(x))
        attn = model.blocks[0].attn
        qkv = attn.qkv(model.blocks[0].norm1(tokens)).reshape(1, tokens.shape[1], 3, attn.num_heads, -1)
        q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)  # (1, heads, N, hd)
        expected = (q @ k.transpose(-2, -1) * attn.scale).softmax(-1)
    torch.testing.assert_close(rec.attention[:, 0], expected)


def test_hf_capture_switches_to_eager_and_restores():
    model = tiny_hf()
    model.set_attn_implementation("sdpa")
    handle = handle_from_hf(model, device="cpu")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        plain = handle.forward(x)
        with capture_attention(handle) as rec:
            logits = handle.forward(x)
    assert model.config._attn_implementation == "sdpa"
    assert rec.attention.shape == (2, 2, 2, 17, 17)
    torch.testing.assert_close(rec.attention.sum(-1), torch.ones(2, 2, 2, 17))
    torch.testing.assert_close(logits, plain, rtol=1e-5, atol=1e-5)


def test_hf_distilled_and_nonsquare_capture():
    handle = handle_from_hf(tiny_hf(distilled=True), device="cpu", input_size=(32, 48))
    with torch.no_grad(), capture_attention(handle) as rec:
        handle.forward(torch.randn(1, 3, 32, 48))
    assert rec.attention.shape == (1, 2, 2, 2 + 4 * 6, 2 + 4 * 6)


def _hook_count(model):
    return sum(len(m._forward_hooks) for m in model.modules())


def test_exception_inside_forward_leaves_nothing_behind():
    handle = tiny_handle("distilled")
    before = _hook_count(handle.model)

    def boom(module, args, output):
        raise RuntimeError("boom")

    failing = handle.model.blocks[1].register_forward_hook(boom)
    with pytest.raises(RuntimeError, match="boom"):
        with capture_attention(handle, activation_layers=[0, 1]):
            assert not any(a.fused_attn for a in handle.attention_modules)
            handle.forward(torch.randn(1, 3, 32, 32))
    failing.remove()
    assert _hook_count(handle.model) == before
    assert all(a.fused_attn for a in handle.attention_modules)


def test_hf_exception_restores_attention_implementation():
    model = tiny_hf()
    model.set_attn_implementation("sdpa")
    handle = handle_from_hf(model, device="cpu")
    with pytest.raises(ValueError):
        with capture_attention(handle):
            raise ValueError("user code failed")
    assert model.config._attn_implementation == "sdpa"
    assert _hook_count(model) == 0


def test_missing_layer_fails_loudly():
    handle = tiny_handle("cls")
    with capture_attention(handle) as rec:
        pass  # no forward
    with pytest.raises(CaptureError, match=r"layer\(s\) \[0, 1\]"):
        rec.attention


def test_gradients_flow_to_attention_and_activations():
    handle = tiny_handle("cls")
    _, logits, rec = _forward(handle, batch=1, grad=True)
    rec.backward(logits[0, 3])
    grad = rec.attention_grad()
    assert grad.shape == rec.attention.shape and grad.abs().sum() > 0
    assert rec.activation_grad(1).abs().sum() > 0
    assert all(p.grad is None for p in handle.model.parameters())  # no parameter .grad allocated


def test_attention_gradient_matches_finite_difference():
    """d logit / d A for one attention entry, checked by perturbing that entry in a replayed forward."""
    handle = tiny_handle("cls")
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.enable_grad(), capture_attention(handle) as rec:
        logits = handle.forward(x)
    rec.backward(logits[0, 2])
    layer, head, q, k = 1, 1, 3, 5
    eps = 1e-3

    def bumped(delta):
        def hook(module, args, output):
            output = output.clone()
            output[0, head, q, k] += delta
            return output
        h = handle.attention_modules[layer].attn_drop.register_forward_hook(hook)
        try:
            with torch.no_grad(), capture_attention(handle):
                return handle.forward(x)[0, 2].item()
        finally:
            h.remove()

    numeric = (bumped(eps) - bumped(-eps)) / (2 * eps)
    assert abs(rec.attention_grad()[0, layer, head, q, k].item() - numeric) < 1e-3


def test_nonsquare_tiny_input():
    handle = tiny_handle("nonsquare")
    _, _, rec = _forward(handle)
    assert rec.attention.shape[-1] == 1 + 4 * 6 == handle.layout(TINY_TIMM["nonsquare"][1]).num_tokens
