"""Class-specific gradient rollout within the depth x N x D bound: the kept float16 stack and the per-option
maps both give the first release's values (rollout over the float16 (depth, N, N) stack) to float16
precision, the stack is kept only while it is no larger than the attention store, and an option outside
the app's grid is refused with a sentence."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from support import TINY_TIMM, tiny_handle

from vit_inspect.analysis import gradient_fused_attention, gradient_rollout
from vit_inspect.core.errors import VitInspectError
from vit_inspect.passes import attention_store, spill
from vit_inspect.passes import gradient_rollouts as gr_module
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.pipeline import analyze_image

F16 = 2e-3  # float16 precision, relative to the map's largest value


def _image(seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, size=(40, 56, 3), dtype=np.uint8))


def _first_release(handle, result, contrast=None) -> np.ndarray:
    """(depth, N, N) float16 G as the first release kept it: from the full (depth, heads, N, N) stacks."""
    pixels = handle.preprocess.apply(_image(), result.layout.input_size)[0]
    with capture_attention(handle) as rec:
        logits = handle.forward(pixels.requires_grad_(True))
        score = logits[0, result.target] - (0 if contrast is None else logits[0, contrast])
        rec.backward(score)
    dense, grad = rec.attention[0].detach().numpy(), rec.attention_grad()[0].numpy()
    return gradient_fused_attention(dense, grad).astype(np.float16)


OPTIONS = [dict(discard_ratio=0.0), dict(discard_ratio=0.9), dict(discard_ratio=0.9, discard="row"),
           dict(discard_ratio=0.5, start_layer=1), dict(discard_ratio=0.95, end_layer=1, discard="row"),
           dict(discard_ratio=0.05, start_layer=1, end_layer=2)]


def _check(handle, result, fused):
    for options in OPTIONS:
        expected = gradient_rollout(fused, result.layout, query=result.readout, **options)
        ours = result.gradient_rollout(**options)
        assert ours.shape == (result.layout.grid_h, result.layout.grid_w)
        np.testing.assert_allclose(ours, expected, atol=F16 * np.abs(expected).max())


@pytest.mark.parametrize("tiny_kind", ["cls", "reg4", "distilled", "nonsquare"])
def test_kept_stack_equals_the_first_release(tiny_kind):
    handle = tiny_handle(tiny_kind)
    result = analyze_image(handle, _image(), input_size=TINY_TIMM[tiny_kind][1])
    assert result.gradient.fused is not None and result.gradient.maps is None
    fused = _first_release(handle, result)
    np.testing.assert_array_max_ulp(result.gradient.fused, fused, maxulp=1)  # float16 numbers, to one unit
    _check(handle, result, fused)


@pytest.mark.parametrize("tiny_kind", ["cls", "reg4"])
def test_per_option_maps_equal_the_first_release(tiny_kind, monkeypatch):
    """Past the threshold the rollout for every option of the app's grid is computed in the pass."""
    monkeypatch.setattr("vit_inspect.passes.pipeline.KEEP_FRACTION", 0.0)
    handle = tiny_handle(tiny_kind)
    target, contrast = 2, 3
    result = analyze_image(handle, _image(), input_size=TINY_TIMM[tiny_kind][1], target=target, contrast=contrast)
    assert result.gradient.fused is None
    depth = handle.depth
    assert len(result.gradient.maps) == 39 * depth * (depth + 1) // 2  # 0 once, 19 ratios x 2 rules; every range
    _check(handle, result, _first_release(handle, result, contrast))
    for bad in (dict(discard_ratio=0.42), dict(discard_ratio=0.5, query=(0, 0))):
        with pytest.raises(VitInspectError, match="kept only for discard ratios"):
            result.gradient_rollout(**bad)


def test_stack_kept_only_while_no_larger_than_the_store(monkeypatch):
    """The tiny model has D = 32: G's 2 * N^2 bytes per layer exceed the store's 4 * N * D from N = 65 (a
    64 x 64 input, 1 + 8 * 8 tokens) on; a 32 x 32 input (N = 17) keeps the stack. (Both stores hold Q and K
    here: a store of maps is never smaller than G's stack.)"""
    monkeypatch.setattr(attention_store, "MAPS_IN_MEMORY_BYTES", 0)
    monkeypatch.setattr(spill, "shared_folder", lambda: None)  # and no automatic spill
    handle = tiny_handle("cls")
    small = analyze_image(handle, _image(), input_size=(32, 32))
    large = analyze_image(handle, _image(), input_size=(64, 64))
    for result in (small, large):
        stack_bytes = handle.depth * result.layout.num_tokens ** 2 * 2
        keep = stack_bytes <= gr_module.KEEP_FRACTION * result.attention_store.nbytes()
        assert (result.gradient.fused is not None) == keep
    assert small.gradient.fused is not None and large.gradient.fused is None
    assert large.gradient.nbytes() == 39 * handle.depth * (handle.depth + 1) // 2 * large.layout.num_patches * 4
    _check(handle, large, _first_release(handle, large))


def test_no_head_no_gradient_rollout():
    handle = tiny_handle("cls")
    result = analyze_image(handle, _image(), input_size=(32, 32), gradients=False)
    assert result.gradient is None and result.gradient_rollout(0.9) is None
