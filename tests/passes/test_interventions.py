"""Head ablation: each mode against weight surgery on a copy of the model, per-row masks, capture, clean exit."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from support import sharpen_attention, tiny_handle, tiny_hf

from vit_inspect.core.errors import InterventionError
from vit_inspect.core.hf_models import handle_from_hf
from vit_inspect.core.timm_models import handle_from_timm
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.interventions import (
    ablate_heads,
    head_mask,
    mean_head_outputs,
    parse_heads,
)


def _x(handle, batch=2, seed=0):
    height, width = handle.input_size
    return torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


def _head_cols(handle, head):
    dim = handle.embed_dim // handle.num_heads
    return slice(head * dim, (head + 1) * dim)


def _surgery_timm(handle, layer, head, mode):
    """A copy of the model with the head removed by editing weights: zero -> the projection's columns
    of the head are zero; uniform -> the head's query weights and bias are zero, so every score is 0
    and softmax gives exactly 1/N."""
    model = copy.deepcopy(handle.model)
    attn = model.blocks[layer].attn
    cols = _head_cols(handle, head)
    with torch.no_grad():
        if mode == "zero":
            attn.proj.weight[:, cols] = 0
        else:
            attn.qkv.weight[cols] = 0  # the first embed_dim rows of qkv are the queries
            if attn.qkv.bias is not None:
                attn.qkv.bias[cols] = 0
    return handle_from_timm(model, device="cpu", input_size=handle.input_size)


@pytest.mark.parametrize("mode", ["zero", "uniform"])
@pytest.mark.parametrize("kind", ["cls", "distilled", "reg4"])
def test_timm_ablation_equals_weight_surgery(kind, mode):
    handle = sharpen_attention(tiny_handle(kind))
    x = _x(handle)
    expected = _surgery_timm(handle, 1, 0, mode).forward(x)
    with torch.no_grad():
        plain = handle.forward(x)
        with ablate_heads(handle, [(1, 0)], mode):
            ablated = handle.forward(x)
    torch.testing.assert_close(ablated, expected, rtol=1e-5, atol=1e-5)
    assert (ablated - plain).abs().max() > 1e-3  # the head mattered
    assert all(a.fused_attn for a in handle.attention_modules)


def test_zero_ablation_runs_on_fused_attention():
    handle = tiny_handle("cls")
    assert all(a.fused_attn for a in handle.attention_modules)
    seen = []
    hook = handle.attention_modules[1].proj.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    try:
        with torch.no_grad(), ablate_heads(handle, [(1, 1)], "zero"):
            assert all(a.fused_attn for a in handle.attention_modules)  # zero/mean never switch fusion off
            handle.forward(_x(handle, 1))
    finally:
        hook.remove()
    # hooks registered earlier run first: this one saw the input before the ablation replaced it
    cols = _head_cols(handle, 1)
    assert seen[0][..., cols].abs().sum() > 0


def test_mean_ablation_with_own_mean_changes_nothing_and_means_are_hand_computed():
    handle = tiny_handle("cls")
    x = _x(handle, 1)
    means = mean_head_outputs(handle, [x[0]])
    with torch.no_grad():
        plain = handle.forward(x)
        with ablate_heads(handle, [(0, 0), (1, 1)], "mean", mean=means):
            same = handle.forward(x)
    torch.testing.assert_close(same, plain, rtol=1e-5, atol=1e-5)
    # layer 0's head outputs recomputed by hand: softmax(q k^T / sqrt(d)) v, heads concatenated
    model = handle.model
    with torch.no_grad():
        tokens = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        attn = model.blocks[0].attn
        qkv = attn.qkv(model.blocks[0].norm1(tokens)).reshape(1, tokens.shape[1], 3, attn.num_heads, -1)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (1, heads, N, hd)
        out = ((q @ k.transpose(-2, -1) * attn.scale).softmax(-1) @ v).transpose(1, 2).reshape(1, tokens.shape[1], -1)
    np.testing.assert_allclose(means.values[0], out[0].numpy(), rtol=1e-5, atol=1e-5)
    assert means.values.shape == (2, 17, 32) and means.num_images == 1


def test_mean_ablation_uses_the_average_of_the_reference_set():
    """With reference images a and b, the replacement is (o_a + o_b) / 2: the same as editing the
    projection bias by W_O[:, head] @ mean for every token, checked on the block's attention output."""
    handle = tiny_handle("cls")
    x = _x(handle, 3, seed=4)
    means = mean_head_outputs(handle, [x[0], x[1]], batch_size=1)
    seen = {}
    proj = handle.attention_modules[1].proj
    hook = proj.register_forward_pre_hook(lambda m, args: seen.setdefault("a", []).append(args[0].clone()))
    with torch.no_grad():
        handle.forward(x[:2])
    hook.remove()
    cols = _head_cols(handle, 1)
    manual = seen["a"][0][:, :, cols].mean(0)  # (N, hd): the head's mean over the two images
    np.testing.assert_allclose(means.values[1][:, cols], manual.numpy(), rtol=1e-5, atol=1e-5)
    after = {}
    hook = proj.register_forward_hook(lambda m, args, out: after.setdefault("in", args[0].clone()))
    with torch.no_grad(), ablate_heads(handle, [(1, 1)], "mean", mean=means):
        handle.forward(x[2:])
    hook.remove()
    torch.testing.assert_close(after["in"][0][:, cols], manual)


def test_mean_ablation_refuses_other_token_counts():
    handle = tiny_handle("nonsquare")
    means = mean_head_outputs(handle, [_x(handle, 1)[0]])
    other = torch.randn(1, 3, 32, 32)
    with pytest.raises(InterventionError, match="Recompute"):
        with torch.no_grad(), ablate_heads(handle, [(0, 0)], "mean", mean=means):
            handle.forward(other)
    with pytest.raises(InterventionError, match="needs"):
        with ablate_heads(handle, [(0, 0)], "mean"):
            pass


@pytest.mark.parametrize("mode", ["zero", "uniform"])
def test_per_row_masks_equal_separate_ablations(mode):
    handle = sharpen_attention(tiny_handle("distilled"))
    x = _x(handle, 1)
    pairs = [(0, 0), (0, 1), (1, 0), (1, 1)]
    mask = torch.zeros(len(pairs), 2, 2, dtype=torch.bool)
    for row, (layer, head) in enumerate(pairs):
        mask[row, layer, head] = True
    with torch.no_grad():
        with ablate_heads(handle, mask, mode):
            batched = handle.forward(x.expand(len(pairs), -1, -1, -1))
        for row, pair in enumerate(pairs):
            with ablate_heads(handle, [pair], mode):
                torch.testing.assert_close(batched[row:row + 1], handle.forward(x), rtol=1e-5, atol=1e-5)


def test_uniform_attention_is_what_capture_records():
    handle = sharpen_attention(tiny_handle("cls"))
    x = _x(handle, 2)
    with torch.no_grad(), capture_attention(handle) as rec, ablate_heads(handle, [(1, 0)], "uniform"):
        logits = handle.forward(x)
    attention = rec.attention  # (B, depth, heads, N, N)
    n = attention.shape[-1]
    torch.testing.assert_close(attention[:, 1, 0], torch.full_like(attention[:, 1, 0], 1 / n))
    assert (attention[:, 1, 1] - 1 / n).abs().max() > 1e-3  # the other head untouched
    torch.testing.assert_close(logits, _surgery_timm(handle, 1, 0, "uniform").forward(x), rtol=1e-5, atol=1e-5)
    assert all(a.fused_attn for a in handle.attention_modules)


def test_ablation_inside_capture_in_either_order():
    handle = tiny_handle("cls")
    x = _x(handle, 1)
    with torch.no_grad():
        with ablate_heads(handle, [(0, 1)], "zero"), capture_attention(handle) as rec_a:
            first = handle.forward(x)
        with capture_attention(handle) as rec_b, ablate_heads(handle, [(0, 1)], "zero"):
            second = handle.forward(x)
        expected = _surgery_timm(handle, 0, 1, "zero").forward(x)
    torch.testing.assert_close(first, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(second, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rec_a.attention, rec_b.attention)


def _hook_count(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("mode", ["zero", "uniform"])
def test_exception_restores_the_model_exactly(mode):
    handle = tiny_handle("distilled")
    x = _x(handle, 1)
    with torch.no_grad():
        before = handle.forward(x)
    hooks_before = _hook_count(handle.model)
    state = {k: v.clone() for k, v in handle.model.state_dict().items()}
    with pytest.raises(RuntimeError, match="boom"):
        with capture_attention(handle), ablate_heads(handle, [(0, 0), (1, 1)], mode):
            handle.forward(x)
            raise RuntimeError("boom")
    assert _hook_count(handle.model) == hooks_before
    assert all(a.fused_attn for a in handle.attention_modules)
    assert all(torch.equal(v, state[k]) for k, v in handle.model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(handle.forward(x), before)


def _hf_surgery(model, layer, head, mode):
    model = copy.deepcopy(model)
    attn = model.base_model.layers[layer].attention
    cols = slice(head * 16, (head + 1) * 16)  # hidden 32, 2 heads
    with torch.no_grad():
        if mode == "zero":
            attn.o_proj.weight[:, cols] = 0
        else:
            attn.q_proj.weight[cols] = 0
            attn.q_proj.bias[cols] = 0
    return model


@pytest.mark.parametrize("mode", ["zero", "uniform"])
@pytest.mark.parametrize("distilled", [False, True])
def test_hf_ablation_equals_weight_surgery(mode, distilled):
    model = tiny_hf(distilled=distilled)
    handle = sharpen_attention(handle_from_hf(model, device="cpu"))
    surgery = handle_from_hf(_hf_surgery(model, 1, 1, mode), device="cpu")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        plain = handle.forward(x)
        with capture_attention(handle) as rec, ablate_heads(handle, [(1, 1)], mode):
            ablated = handle.forward(x)
        expected = surgery.forward(x)
    torch.testing.assert_close(ablated, expected, rtol=1e-5, atol=1e-5)
    assert (ablated - plain).abs().max() > 1e-4
    if mode == "uniform":
        n = rec.attention.shape[-1]
        torch.testing.assert_close(rec.attention[:, 1, 1], torch.full_like(rec.attention[:, 1, 1], 1 / n))
    assert _hook_count(model) == 0


def test_hf_exception_leaves_nothing_behind():
    model = tiny_hf()
    handle = handle_from_hf(model, device="cpu")
    with pytest.raises(ValueError):
        with ablate_heads(handle, [(0, 0)], "uniform"):
            raise ValueError("user code failed")
    assert _hook_count(model) == 0


def test_head_sets_are_checked():
    assert head_mask([(1, 0), (-1, -1)], 2, 2)[0].tolist() == [[False, False], [True, True]]
    with pytest.raises(InterventionError, match="does not exist"):
        head_mask([(2, 0)], 2, 2)
    with pytest.raises(InterventionError, match="pair"):
        head_mask(["ab"], 2, 2)
    with pytest.raises(InterventionError, match="shape"):
        head_mask(np.ones((3, 2), bool), 2, 2)
    with pytest.raises(InterventionError, match="mode"):
        with ablate_heads(tiny_handle("cls"), [(0, 0)], "scramble"):
            pass
    with pytest.raises(InterventionError, match="rows"):
        handle = tiny_handle("cls")
        with torch.no_grad(), ablate_heads(handle, np.ones((3, 2, 2), bool)):
            handle.forward(_x(handle, 2))
    assert parse_heads("3:1, 5:0") == [(3, 1), (5, 0)]
    for bad in ("3", "a:b", "", "1:2:3"):
        with pytest.raises(InterventionError):
            parse_heads(bad)
