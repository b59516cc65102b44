"""One pass per image: every method on every token layout, from one forward and one backward."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from support import TINY_TIMM, tiny_handle, tiny_hf

from vit_inspect.analysis import chefer_relevance
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.hf_models import handle_from_hf
from vit_inspect.jobs.distance import dataset_attention_distance
from vit_inspect.passes import relevance
from vit_inspect.passes.attention_store import keeps_maps
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.pipeline import add_relevance, analyze_image, relevance_maps
from vit_inspect.studies.model_report import model_report, pos_similarity_at


def _image(seed: int = 0, size=(40, 56)) -> Image.Image:
    array = np.random.default_rng(seed).integers(0, 256, size=(*size, 3), dtype=np.uint8)
    return Image.fromarray(array)


def _check_result(handle, result):
    layout = result.layout
    grid = (layout.grid_h, layout.grid_w)
    stack = result.attention_stack()
    assert stack.shape == (handle.depth, handle.num_heads, layout.num_tokens, layout.num_tokens)
    assert stack.dtype == np.float16
    np.testing.assert_allclose(stack.astype(np.float32).sum(-1), 1.0, atol=5e-3)
    # the tiny models' maps are small: kept as they are; else plain softmax(q k^T / sqrt(d)), from float16 q, k
    small = keeps_maps(handle.depth, handle.num_heads, layout.num_tokens)
    assert small and result.attention_store.mode == "maps"
    assert result.rgb.shape == (*layout.input_size, 3)
    assert result.probs.shape == (len(handle.labels),) and abs(result.probs.sum() - 1) < 1e-5
    assert result.target == int(np.argmax(result.probs))
    assert result.gradcam.shape == (handle.depth, *grid) and np.isfinite(result.gradcam).all()
    assert result.chefer.shape == grid and (result.chefer >= 0).all()
    assert result.mean_distance.shape == (handle.depth, handle.num_heads)
    assert result.rollout().shape == grid
    assert result.attention_map(handle.depth - 1, 0, (0, 0)).shape == grid


def test_every_method_on_every_layout(tiny_kind):
    handle = tiny_handle(tiny_kind)
    result = analyze_image(handle, _image(), input_size=TINY_TIMM[tiny_kind][1])
    _check_result(handle, result)
    assert result.readout == ("mean" if tiny_kind == "gap" else "class")


@pytest.mark.parametrize("distilled", [False, True])
def test_every_method_on_hf_models(distilled):
    handle = handle_from_hf(tiny_hf(distilled=distilled), device="cpu", input_size=(32, 48))
    result = analyze_image(handle, _image())
    _check_result(handle, result)
    assert result.layout.num_prefix_tokens == (2 if distilled else 1)


def test_one_forward_and_one_backward(monkeypatch):
    handle = tiny_handle("reg4")
    forwards = []
    hook = handle.model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    backwards = []
    real_grad = torch.autograd.grad
    # count the top-level backwards (the Gamma rules of AttnLRP run small ones inside its backward)
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: (
        backwards.append(1) if torch._C._current_graph_task_id() == -1 else None) or real_grad(*a, **k))
    monkeypatch.setattr(torch.Tensor, "backward", lambda *a, **k: pytest.fail("Tensor.backward must not be used"))
    try:
        result = analyze_image(handle, _image())
        # every redraw afterwards comes from the cached arrays
        result.rollout(head_fusion="max", discard_ratio=0.5, start_layer=1)
        result.attention_map(0, None, (1, 2))
    finally:
        hook.remove()
    # one forward; one backward for the gradient methods, one modified backward for AttnLRP, and one
    # short backward through one block per LeGrad layer (the tiny model has 2 blocks)
    assert (len(forwards), len(backwards)) == (1, 1 + 1 + 2)



def test_relevance_off_is_one_backward_and_add_relevance_matches(monkeypatch):
    """``relevance=False``: one forward, one ordinary backward, no LRP hooks; `add_relevance` later gives
    the same LeGrad and AttnLRP maps as the one-forward pass with ``relevance=True``, everything else equal."""
    handle = tiny_handle("reg4")
    full = analyze_image(handle, _image())
    forwards, backwards, switches = [], [], []
    hook = handle.model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    real_grad, real_apply = torch.autograd.grad, relevance._Switch.apply
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: (
        backwards.append(1) if torch._C._current_graph_task_id() == -1 else None) or real_grad(*a, **k))
    monkeypatch.setattr(relevance._Switch, "apply", lambda *a: switches.append(1) or real_apply(*a))
    try:
        fast = analyze_image(handle, _image(), relevance=False)
    finally:
        hook.remove()
    assert (len(forwards), len(backwards), len(switches)) == (1, 1, 0)
    assert fast.legrad is None and fast.attnlrp is None and full.legrad is not None and full.attnlrp is not None
    assert fast.target == full.target
    for name in ("gradcam", "chefer", "mean_distance", "probs"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(full, name))
    added = add_relevance(handle, fast, _image())
    np.testing.assert_array_equal(added.legrad, full.legrad)
    np.testing.assert_array_equal(added.attnlrp, full.attnlrp)
    assert fast.legrad is None and added.gradcam is fast.gradcam  # the cached result itself is unchanged
    assert add_relevance(handle, fast, _image(size=(80, 80))).attnlrp.shape == full.attnlrp.shape  # same crop size
    legrad, attnlrp = relevance_maps(handle, _image(), target=(full.target + 1) % len(full.probs))
    assert legrad.shape == attnlrp.shape == full.attnlrp.shape and not np.array_equal(attnlrp, full.attnlrp)
    with pytest.raises(VitInspectError, match="out of range"):
        relevance_maps(handle, _image(), target=len(full.probs))


def test_gradcam_and_chefer_equal_direct_autograd():
    """Recompute both from scratch with plain autograd on the same tiny model and input."""
    handle = tiny_handle("distilled", seed=4)
    image = _image(3)
    result = analyze_image(handle, image, target=7)
    pixels, _ = handle.preprocess.apply(image)
    model = handle.model
    saved = {}
    hook = model.blocks[-1].norm1.register_forward_hook(lambda m, a, out: saved.setdefault("act", out))
    with torch.enable_grad(), capture_attention(handle) as rec:
        logit = model(pixels)[0, 7]
    hook.remove()
    attention = rec.attention_tensors()
    grads = torch.autograd.grad(logit, [saved["act"], *attention])
    act, act_grad = saved["act"][0].detach(), grads[0][0]  # (N, D)
    patches = slice(handle.num_prefix_tokens, None)
    weights = act_grad[patches].mean(0)  # (D,)
    expected_cam = (act[patches] * weights).sum(-1).reshape(result.layout.grid_h, result.layout.grid_w)
    np.testing.assert_allclose(result.gradcam[-1], expected_cam.numpy(), rtol=1e-4, atol=1e-6)

    relevance = torch.eye(result.layout.num_tokens)
    for a, g in zip(attention, grads[1:]):
        relevance = relevance + (a[0].detach() * g[0]).clamp(min=0).mean(0) @ relevance
    expected_chefer = relevance[0, patches].reshape(result.layout.grid_h, result.layout.grid_w)
    np.testing.assert_allclose(result.chefer, expected_chefer.numpy(), rtol=1e-4, atol=1e-7)
    assert result.target == 7


def test_target_out_of_range_is_clear():
    with pytest.raises(VitInspectError, match="out of range"):
        analyze_image(tiny_handle("cls"), _image(), target=99)


def test_headless_model_has_no_gradient_maps():
    from timm.models.vision_transformer import VisionTransformer

    from vit_inspect.core.timm_models import handle_from_timm

    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=0,
                              dynamic_img_size=True).eval()
    handle = handle_from_timm(model, device="cpu")
    result = analyze_image(handle, _image())
    assert not handle.has_head and result.probs.size == 0
    assert result.target is None and result.gradcam is None and result.chefer is None
    assert result.rollout().shape == (4, 4)
    assert relevance_maps(handle, _image(), target=0) == (None, None)
    assert add_relevance(handle, result, _image()) is result


def test_model_report_and_other_resolution():
    handle = tiny_handle("reg4")
    report = model_report(handle, k=5)
    assert report.filter_pca.components.shape == (5, 8, 8, 3)
    assert report.pos_similarity.shape == (4, 4, 4, 4)
    np.testing.assert_allclose(np.einsum("ijij->ij", report.pos_similarity), 1.0, rtol=1e-5)
    assert pos_similarity_at(handle, (4, 6)).shape == (4, 6, 4, 6)


def test_dataset_distance_streams_and_skips_bad_files(tmp_path):
    handle = tiny_handle("cls")
    paths = []
    for i in range(5):
        path = tmp_path / f"{i}.png"
        _image(i).save(path)
        paths.append(path)
    (tmp_path / "bad.jpg").write_text("not an image")
    stats = dataset_attention_distance(handle, paths + [tmp_path / "bad.jpg"], batch_size=2)
    singles = [analyze_image(handle, p, gradients=False).mean_distance for p in paths]
    assert stats.num_images == 5 and len(stats.skipped) == 1 and "bad.jpg" in stats.skipped[0]
    np.testing.assert_allclose(stats.distances, np.mean(singles, axis=0), rtol=1e-4)


def test_chefer_from_cached_arrays_matches_pass():
    """The pass computes Chefer from float32 maps; recomputing from them agrees with the stored map."""
    handle = tiny_handle("cls")
    image = _image(1)
    result = analyze_image(handle, image)
    pixels, _ = handle.preprocess.apply(image)
    with torch.enable_grad(), capture_attention(handle) as rec:
        logits = handle.forward(pixels)
    rec.backward(logits[0, result.target])
    expected = chefer_relevance(rec.attention[0].numpy(), rec.attention_grad()[0].numpy(), result.layout)
    np.testing.assert_allclose(result.chefer, expected, rtol=1e-5)


@pytest.mark.parametrize("kind", ["cls", "distilled", "gap"])
def test_gradient_reductions_equal_their_definitions(kind):
    """First order sum_ij A * dA per head and G = max(0, mean_h A * dA) per layer (head means taken as one
    matrix product in the pass), against float64 stacks of the recorded maps and gradients."""
    from support import sharpen_attention

    from vit_inspect.passes.pipeline import gradient_reductions, readout_query

    handle = sharpen_attention(tiny_handle(kind, seed=5))
    pixels, rgb = handle.preprocess.apply(_image(2))
    with torch.enable_grad(), capture_attention(handle) as rec:
        logit = handle.forward(pixels.requires_grad_(True))[0, 3]
    rec.backward(logit)
    reduced = gradient_reductions(rec, handle.layout(rgb.shape[:2]), readout_query(handle))
    weighted = (torch.stack([a[0].detach() for a in rec.attention_tensors()]).double()
                * torch.stack([g[0] for g in rec.attention_grad_tensors()]).double())  # (depth, heads, N, N)
    assert reduced.first_order.dtype == np.float32 and reduced.fused[0].dtype == np.float16
    np.testing.assert_allclose(reduced.first_order, weighted.sum((-2, -1)).numpy(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(np.stack(reduced.fused).astype(np.float64), weighted.mean(1).clamp(min=0).numpy(),
                               rtol=2e-3, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu_checks.sh runs it on one)")
@pytest.mark.parametrize("kept", [True, False], ids=["kept-maps", "qk-store"])
def test_the_pass_on_the_gpu_equals_the_cpus(kept, monkeypatch):
    """On a GPU every per-layer reduction runs where the maps are and the result crosses to the host once;
    the store, Grad-CAM, the distances, the head statistics and every gradient method equal the CPU pass's
    to float32 rounding (a float16 store to one unit in its last place)."""
    from support import make_tiny_timm

    from vit_inspect.core.timm_models import handle_from_timm
    from vit_inspect.passes import attention_store, spill

    if not kept:
        monkeypatch.setattr(attention_store, "MAPS_IN_MEMORY_BYTES", 0)
        monkeypatch.setattr(spill, "shared_folder", lambda: None)  # and no automatic spill
    image = _image(2)
    results = [analyze_image(handle_from_timm(make_tiny_timm("cls", 0), name="tiny-cls", device=device,
                                              input_size=TINY_TIMM["cls"][1]), image, relevance=False)
               for device in ("cpu", "cuda")]
    cpu, gpu = results
    assert gpu.target == cpu.target
    assert gpu.attention_store.mode == cpu.attention_store.mode == ("maps" if kept else "qk16")
    np.testing.assert_allclose(gpu.attention_store.stack().astype(np.float32),
                               cpu.attention_store.stack().astype(np.float32), rtol=2e-3, atol=1e-3)
    np.testing.assert_allclose(gpu.gradcam, cpu.gradcam, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gpu.mean_distance, cpu.mean_distance, rtol=1e-5)
    np.testing.assert_allclose(gpu.heads.prefix_share, cpu.heads.prefix_share, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(gpu.chefer, cpu.chefer, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(gpu.heads.first_order, cpu.heads.first_order, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(gpu.gradient_rollout(0.9), cpu.gradient_rollout(0.9), rtol=1e-3, atol=1e-6)


def test_public_api_and_no_gradio_import():
    import subprocess
    import sys

    code = ("import sys, vit_inspect; "
            "assert all(hasattr(vit_inspect, n) for n in vit_inspect.__all__); "
            "assert 'gradio' not in sys.modules and 'matplotlib.pyplot' not in sys.modules; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_preview_and_the_model_input_are_resampled_side_by_side(monkeypatch, tmp_path):
    """The preview of the upload is made on a thread of its own while the model's input is made: each of
    the two waits (10 s at most) until the other has started, which only two concurrent calls both see.
    The preview is still Pillow's (`preview_rgb`), for a lazily opened file too (loaded once, beforehand)."""
    import threading

    from vit_inspect.core.images import preview_rgb
    from vit_inspect.passes import pipeline

    started = {"preview": threading.Event(), "input": threading.Event()}
    ran_on = {}
    make_preview, make_input = pipeline.preview_rgb, pipeline.model_input

    def preview(picture, side):
        ran_on["preview"] = threading.current_thread()
        started["preview"].set()
        assert started["input"].wait(10), "the preview waited for a model input that never started"
        return make_preview(picture, side)

    def model_input(*args, **kwargs):
        ran_on["input"] = threading.current_thread()
        started["input"].set()
        assert started["preview"].wait(10), "the model input waited for a preview that never started"
        return make_input(*args, **kwargs)

    monkeypatch.setattr(pipeline, "preview_rgb", preview)
    monkeypatch.setattr(pipeline, "model_input", model_input)
    _image(size=(300, 500)).save(tmp_path / "big.png")
    lazy = Image.open(tmp_path / "big.png")  # not loaded yet: the pass loads it before the two threads read it
    result = analyze_image(tiny_handle("cls"), lazy)
    assert ran_on["input"] is threading.current_thread() and ran_on["preview"] is not ran_on["input"]
    assert result.preview.shape == (269, 448, 3)  # 448 x 300 / 500 = 268.8 -> 269, its aspect's nearest
    np.testing.assert_array_equal(result.preview, preview_rgb(_image(size=(300, 500)), pipeline.PREVIEW_SIDE))


def test_a_failing_preview_fails_the_pass_with_its_own_error(monkeypatch):
    from vit_inspect.passes import pipeline

    def broken(picture, side):
        raise VitInspectError("The preview could not be made.")
    monkeypatch.setattr(pipeline, "preview_rgb", broken)
    with pytest.raises(VitInspectError, match="The preview could not be made."):
        analyze_image(tiny_handle("cls"), _image())
