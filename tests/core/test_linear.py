"""Linear layers through oneDNN (`core.linear`): the same y = x·Wᵀ + b as `nn.Linear`, only where every
condition holds, and nothing changed on leaving."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from vit_inspect.core.timm_models import handle_from_timm
from vit_inspect.core import linear
from vit_inspect.core.linear import onednn_linears
from vit_inspect.passes.pipeline import analyze_image

pytestmark = pytest.mark.skipif(not linear.available(), reason="this PyTorch has no oneDNN linear op")
ONEDNN_OP = "mkldnn::_linear_pointwise"


@pytest.fixture
def any_size(monkeypatch):
    """Small layers through oneDNN too (by default only those of at least `ONEDNN_MIN_MACS` are)."""
    monkeypatch.setattr(linear, "ONEDNN_MIN_MACS", 0)


def _ops(function) -> tuple[object, set[str]]:
    """``function()``'s result and the names of the operators it ran."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = function()
    return out, {event.key for event in prof.key_averages()}


def _small_layer() -> nn.Linear:
    layer = nn.Linear(2, 3)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.0], [0.5, -1.0], [2.0, 3.0]]))
        layer.bias.copy_(torch.tensor([0.25, 0.0, -1.0]))
    return layer


def test_a_small_layer_gives_the_hand_computed_values_through_onednn(any_size):
    """x = (1, 2): y = (1 + 0.25, 0.5 - 2, 2 + 6 - 1), exact in float32."""
    layer = _small_layer()
    with torch.no_grad(), onednn_linears(layer) as rerouted:
        y, ops = _ops(lambda: layer(torch.tensor([[1.0, 2.0]])))
    assert rerouted == 1
    assert ONEDNN_OP in ops and "aten::addmm" not in ops
    assert y.tolist() == [[1.25, -1.5, 7.0]]


def test_a_large_layer_agrees_with_a_float64_product_to_float32_rounding():
    """(1, 577, 1024) tokens into 4096 outputs: within the error of torch's own float32 path, times 4."""
    torch.manual_seed(0)
    layer = nn.Linear(1024, 4096)
    x = torch.randn(1, 577, 1024)
    exact = x.double() @ layer.weight.double().T + layer.bias.double()
    with torch.no_grad():
        ours = layer(x)
        with onednn_linears(layer):
            rerouted, ops = _ops(lambda: layer(x))
    assert ONEDNN_OP in ops
    assert rerouted.shape == (1, 577, 1024 * 4)
    torch_error = (ours.double() - exact).abs().max().item()
    assert 0 < (rerouted.double() - exact).abs().max().item() <= 4 * torch_error
    assert not torch.equal(rerouted, torch.zeros_like(rerouted))


@pytest.mark.parametrize("case", ["grad", "autocast", "float64", "transposed weight", "small"])
def test_every_other_call_runs_the_layers_own_forward(case, monkeypatch):
    """With gradients (which then flow), under CPU autocast, for float64 layers, for a weight oneDNN would
    reorder on every call, and for a product below `ONEDNN_MIN_MACS`: `nn.Linear.forward` itself."""
    if case != "small":
        monkeypatch.setattr(linear, "ONEDNN_MIN_MACS", 0)
    layer = _small_layer()
    x = torch.tensor([[1.0, 2.0]])
    if case == "float64":
        layer, x = layer.double(), x.double()
    if case == "transposed weight":
        layer.weight = nn.Parameter(layer.weight.detach().T.contiguous().T)
    with onednn_linears(layer) as rerouted:
        def call():
            if case == "grad":
                return layer(x.requires_grad_(True))
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=case == "autocast"):
                return layer(x)
        y, ops = _ops(call)
    assert rerouted == 1 and ONEDNN_OP not in ops
    assert y.float().tolist() == [[1.25, -1.5, 7.0]]
    if case == "grad":
        y.sum().backward()
        assert x.grad.tolist() == [[3.5, 2.0]]  # column sums of W


def test_the_layers_are_restored_on_leaving_even_through_an_exception(any_size):
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    with pytest.raises(RuntimeError, match="inside"), onednn_linears(model) as rerouted:
        assert rerouted == 2 and all("forward" in vars(m) for m in model if isinstance(m, nn.Linear))
        raise RuntimeError("inside")
    assert not any("forward" in vars(m) for m in model)
    with torch.no_grad():
        _, ops = _ops(lambda: model(torch.ones(1, 2)))
    assert ONEDNN_OP not in ops


def test_onednn_turned_off_or_set_to_lower_precision_changes_nothing():
    layer = _small_layer()
    try:
        torch.backends.mkldnn.enabled = False
        with onednn_linears(layer) as rerouted:
            assert rerouted == 0
    finally:
        torch.backends.mkldnn.enabled = True
    if hasattr(torch.backends.mkldnn, "matmul") and hasattr(torch.backends.mkldnn.matmul, "fp32_precision"):
        saved = torch.backends.mkldnn.matmul.fp32_precision
        try:
            torch.backends.mkldnn.matmul.fp32_precision = "bf16"
            with onednn_linears(layer) as rerouted:
                assert rerouted == 0
        finally:
            torch.backends.mkldnn.matmul.fp32_precision = saved


def _pass(num_classes: int, enabled: bool, monkeypatch):
    torch.manual_seed(0)
    model = VisionTransformer(img_size=56, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                              num_classes=num_classes).eval()
    handle = handle_from_timm(model, name="tiny", device="cpu", input_size=(56, 56))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (56, 56, 3), dtype=np.uint8))
    monkeypatch.setattr(linear, "ENABLED", enabled)
    return _ops(lambda: analyze_image(handle, image, relevance=False))


def test_a_pass_without_gradients_uses_onednn_and_gives_the_same_result(monkeypatch, any_size):
    """A backbone (no head: no gradients): every linear layer through oneDNN, the same maps and features as
    through torch's own path to float32 rounding."""
    ours, ops = _pass(0, True, monkeypatch)
    plain, plain_ops = _pass(0, False, monkeypatch)
    assert ONEDNN_OP in ops and ONEDNN_OP not in plain_ops
    np.testing.assert_allclose(ours.mean_distance, plain.mean_distance, rtol=1e-5)
    np.testing.assert_allclose(ours.patch_features.astype(np.float32), plain.patch_features.astype(np.float32),
                               atol=2e-3)
    store, plain_store = ours.attention_store, plain.attention_store
    for layer in range(2):
        np.testing.assert_allclose(store.layer(layer), plain_store.layer(layer), atol=1e-3)


def test_a_pass_with_gradients_keeps_torchs_own_linear_layers(monkeypatch, any_size):
    _, ops = _pass(10, True, monkeypatch)
    assert ONEDNN_OP not in ops and "aten::addmm" in ops


def test_the_handles_forward_uses_onednn_only_without_gradients(monkeypatch, any_size):
    """`ViTHandle.forward`: through oneDNN under `torch.no_grad`, torch's own path with gradients, the same
    logits to float32 rounding, and the model's layers left as they were after either."""
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=5).eval()
    handle = handle_from_timm(model, name="tiny", device="cpu", input_size=(32, 32))
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        fast, ops = _ops(lambda: handle.forward(pixels))
    slow, slow_ops = _ops(lambda: handle.forward(pixels))
    assert ONEDNN_OP in ops and ONEDNN_OP not in slow_ops
    torch.testing.assert_close(fast, slow.detach(), rtol=1e-5, atol=1e-5)
    assert not any("forward" in vars(m) for m in model.modules())
