"""The pass crosses from the model's device to the host a fixed number of times, whatever the depth: every
per-layer reduction stays on the device, and the result is copied once, already compact. Counted as the
calls of `Tensor.cpu`, `Tensor.numpy`, `Tensor.item` and `Tensor.tolist` made during one `analyze_image`
(on the CPU each is a no-op or a view, but the same code runs on a GPU, where each is a copy and a wait)."""
from __future__ import annotations

import collections
import traceback

import numpy as np
import pytest
import torch
from PIL import Image
from timm.models.vision_transformer import VisionTransformer

from vit_inspect.core.timm_models import handle_from_timm
from vit_inspect.passes import attention_store
from vit_inspect.passes.pipeline import analyze_image

CALLS = ("cpu", "numpy", "item", "tolist")


def _image() -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8))


NO_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu_checks.sh runs it on one)")
DEVICES = ["cpu", pytest.param("cuda", marks=NO_GPU)]


def _handle(depth: int, num_classes: int, device: str = "cpu"):
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=depth, num_heads=2,
                              num_classes=num_classes).eval()
    return handle_from_timm(model, name=f"depth-{depth}", device=device, input_size=(32, 32))


def transfers(monkeypatch, handle, **options) -> collections.Counter:
    """(method, file:line in vit_inspect) -> calls during one pass."""
    counted: collections.Counter = collections.Counter()
    for name in CALLS:
        real = getattr(torch.Tensor, name)

        def counting(self, *args, _name=name, _real=real, **kwargs):
            caller = next((f"{f.filename.rsplit('/vit_inspect/', 1)[1]}:{f.lineno}"
                           for f in reversed(traceback.extract_stack()[:-1]) if "/vit_inspect/" in f.filename), "?")
            counted[(_name, caller)] += 1
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counting)
    analyze_image(handle, _image(), **{"spill": None, **options})  # the store's own copies, no spill's
    monkeypatch.undo()
    return counted


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_classes, kept", [(10, False), (10, True), (0, False), (0, True)],
                         ids=["head-qk", "head-kept-maps", "backbone-qk", "backbone-kept-maps"])
def test_the_copies_to_the_host_do_not_grow_with_depth(monkeypatch, num_classes, kept, device):
    """Two and six layers, with and without gradients, Q/K stores and kept maps: the same calls, each as often."""
    if not kept:  # every layer's maps over the kept-maps bound: Q/K recorded, checked and stored
        monkeypatch.setattr(attention_store, "MAPS_IN_MEMORY_BYTES", 0)
    bound = attention_store.MAPS_IN_MEMORY_BYTES
    shallow = transfers(monkeypatch, _handle(2, num_classes, device), relevance=False)
    monkeypatch.setattr(attention_store, "MAPS_IN_MEMORY_BYTES", bound)
    deep = transfers(monkeypatch, _handle(6, num_classes, device), relevance=False)
    assert shallow == deep, (shallow, deep)
    assert sum(deep.values()) <= 40, deep  # a handful per result array: each .cpu().numpy() counts twice


def test_a_result_copied_once_equals_the_models_own_maps(monkeypatch):
    """The store made on the device holds what the model computed: its float16 Q/K rebuild every map within
    the check's tolerance, and the kept maps are the model's maps rounded once to float16."""
    handle = _handle(3, 10)
    from vit_inspect.passes.capture import capture_attention

    pixels = handle.preprocess.apply(_image(), (32, 32))[0]
    with torch.no_grad(), capture_attention(handle) as rec:
        handle.forward(pixels)
    model_maps = rec.attention[0].numpy()  # (depth, heads, N, N) float32
    kept = analyze_image(handle, _image(), input_size=(32, 32)).attention_store
    assert kept.mode == "maps"
    np.testing.assert_array_equal(kept.maps, model_maps.astype(np.float16))
    monkeypatch.setattr(attention_store, "MAPS_IN_MEMORY_BYTES", 0)
    rebuilt = analyze_image(handle, _image(), input_size=(32, 32), spill=None).attention_store
    assert rebuilt.mode == "qk16" and rebuilt.queries.dtype == np.float16
    assert np.abs(rebuilt.stack().astype(np.float32) - model_maps).max() <= attention_store.TOLERANCE


@pytest.mark.parametrize("device", DEVICES)
def test_a_float16_store_leaves_the_device_as_one_array(monkeypatch, device):
    """Every layer's float16 Q and K are written into one device array as the check passes them, so the store
    is that array copied once (queries and keys its two halves), with no stacked copy made beside the layers'
    own; its values are each layer's recorded Q and K rounded once to float16."""
    from vit_inspect.passes.capture import capture_attention

    monkeypatch.setattr(attention_store, "MAPS_IN_MEMORY_BYTES", 0)
    handle = _handle(3, 10, device)
    store = analyze_image(handle, _image(), input_size=(32, 32), relevance=False, spill=None).attention_store
    assert store.mode == "qk16" and store.queries.shape == store.keys.shape == (3, 2, 17, 16)
    assert store.queries.base is not None and store.queries.base is store.keys.base  # one copy, two halves
    recorded = {}
    hooks = [block.attn.qkv.register_forward_hook(lambda m, a, out, i=i: recorded.__setitem__(i, out.detach()))
             for i, block in enumerate(handle.model.blocks)]
    try:
        pixels = handle.preprocess.apply(_image(), (32, 32))[0].to(handle.device)
        with torch.no_grad(), capture_attention(handle):
            handle.forward(pixels)
    finally:
        for h in hooks:
            h.remove()
    for layer, qkv in recorded.items():  # timm's fused qkv: (1, N, 3 * heads * d) -> q, k as (heads, N, d)
        q, k, _ = qkv[0].reshape(17, 3, 2, 16).permute(1, 2, 0, 3).float().cpu()
        np.testing.assert_array_equal(store.queries[layer], q.to(torch.float16).numpy())
        np.testing.assert_array_equal(store.keys[layer], k.to(torch.float16).numpy())
