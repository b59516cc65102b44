"""ZeroGPU wiring with a stand-in `spaces.GPU`: the pass and only the pass runs under it, with the model
moved to the lent device for the call and back afterwards; redraws never enter it; without the
package nothing changes."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from PIL import Image
from support import tiny_handle
from support.app import StandIn

from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.inspector import Inspector
from vit_inspect.ui.zerogpu import gpu_pass, spaces_gpu


def _image():
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))


def test_without_spaces_the_pass_is_unchanged(monkeypatch):
    monkeypatch.setitem(sys.modules, "spaces", None)  # import spaces -> ImportError
    assert spaces_gpu() is None
    assert gpu_pass(analyze_image) is analyze_image


def test_spaces_gpu_is_found_when_importable(monkeypatch):
    stand_in = StandIn()
    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=stand_in))
    assert spaces_gpu() is stand_in
    assert getattr(gpu_pass(analyze_image), "on_gpu", False) and stand_in.decorated == ["on_gpu"]


def test_the_pass_runs_under_the_decorator_on_the_lent_device(monkeypatch):
    handle = tiny_handle("cls")
    stand_in = StandIn()
    moves = []
    real_to = handle.model.to

    def tracked_to(device):
        moves.append((str(device), stand_in.inside))
        return real_to(device)

    monkeypatch.setattr(handle.model, "to", tracked_to)
    seen = {}

    def fake_pass(h, image, **kwargs):  # what the decorated function hands the pass
        seen["device"], seen["inside"] = str(h.device), stand_in.inside
        return analyze_image(h, image, **kwargs)

    run = gpu_pass(fake_pass, decorator=stand_in, device="cpu")  # "cpu" stands in for the lent GPU
    result = run(handle, _image(), input_size=(32, 32))
    assert stand_in.calls == 1 and seen == {"device": "cpu", "inside": True}
    assert moves == [("cpu", True), ("cpu", True)]  # to the lent device, and back, both inside the lent call
    assert handle.device == torch.device("cpu")  # the shared handle is untouched
    # redraws come from numpy on the CPU: they never enter the decorated function
    result.attention_map(1, None, (0, 0))
    result.rollout(head_fusion="max")
    assert stand_in.calls == 1
    np.testing.assert_allclose(result.mean_distance, analyze_image(handle, _image(), input_size=(32, 32)).mean_distance)


def test_the_model_goes_back_after_a_failing_pass():
    handle = tiny_handle("cls")
    stand_in = StandIn()

    def failing(h, *args, **kwargs):
        raise ValueError("bad input")

    run = gpu_pass(failing, decorator=stand_in, device="cpu")
    with pytest.raises(ValueError, match="bad input"):
        run(handle, _image())
    assert next(handle.model.parameters()).device == handle.device


def test_the_app_routes_its_passes_through_gpu_pass(monkeypatch):

    stand_in = StandIn()
    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=stand_in))
    from vit_inspect.ui.model_cache import ModelCache

    inspector = Inspector(AppConfig(), ModelCache(loader=lambda *a, **k: tiny_handle("cls")))
    assert getattr(inspector.run_pass, "on_gpu", False) and getattr(inspector.run_relevance, "on_gpu", False)
    assert inspector.spill is None  # a ZeroGPU worker's pass writes no spill files the app would read
    assert stand_in.decorated == ["on_gpu", "on_gpu"]  # the pass and LeGrad/AttnLRP on demand (All maps toggle)
