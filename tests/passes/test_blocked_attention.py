"""Attention computed a block of query rows at a time (`capture.blocked_attention`): the same probabilities and
output as timm's own attention, handed to the pass's reductions block by block; the whole-map path wherever
gradients, a mask or another attention class is involved; the same result as the whole-map pass."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import REPO
from timm.layers.attention import Attention

from vit_inspect.core.images import load_image
from vit_inspect.core.load import load_model
from vit_inspect.passes import capture
from vit_inspect.passes.capture import blocked_attention, capture_attention, rows_per_block
from vit_inspect.passes.attention_store import rollout
from vit_inspect.passes.pipeline import analyze_image, readout_query
from vit_inspect.passes.spill import SpillFolder

LARGE = (448, 448)  # DeiT-Ti at 448 px: 785 tokens, queries and keys kept, maps spilled


class Sink:
    """Records what `blocked_attention` hands over."""

    def __init__(self):
        self.blocks, self.done = [], []

    def on_rows(self, layer, start, block):
        self.blocks.append((layer, start, block.clone()))

    def on_layer_done(self, layer):
        self.done.append(layer)


def _module(seed: int = 0) -> tuple[Attention, torch.Tensor]:
    torch.manual_seed(seed)
    attn = Attention(8, num_heads=2, qkv_bias=True).eval()
    return attn, torch.randn(1, 5, 8)


def test_rows_per_block_fit_the_budget():
    # 2 heads x 5 tokens x 4 bytes = 40 bytes a row: 80 bytes hold 2 rows, 79 one, 1 byte still one
    assert rows_per_block(2, 5, 80) == 2 and rows_per_block(2, 5, 79) == 1 and rows_per_block(2, 5, 1) == 1
    assert rows_per_block(16, 1374) == 95  # DINOv2-L/14 at 518, 8 MiB: 8388608 // (4 x 16 x 1374)


def test_blocks_are_the_softmax_of_scaled_scores_and_the_output_is_timms(monkeypatch):
    monkeypatch.setattr(capture, "ROW_BLOCK_BYTES", 80)  # 2 rows a block: blocks start at rows 0, 2 and 4
    attn, x = _module()
    sink = Sink()
    with torch.no_grad():
        ours = blocked_attention(attn, 3, sink)(x)
        # by hand from the module's own weights: q, k, v per head, P = softmax(q kᵀ / sqrt(d)), out = proj(P v)
        qkv = (x[0] @ attn.qkv.weight.T + attn.qkv.bias).reshape(5, 3, 2, 4)  # (N, q/k/v, heads, d)
        q, k, v = (qkv[:, i].transpose(0, 1) for i in range(3))  # (heads, N, d)
        probs = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1)  # sqrt(4) = 2
        expected = attn.proj((probs @ v).transpose(0, 1).reshape(5, 8))
        attn.fused_attn = False
        unfused = Attention.forward(attn, x)
        attn.fused_attn = True
        fused = Attention.forward(attn, x)
    assert [(layer, start, tuple(b.shape)) for layer, start, b in sink.blocks] == [
        (3, 0, (2, 2, 5)), (3, 2, (2, 2, 5)), (3, 4, (2, 1, 5))]
    assert sink.done == [3]
    torch.testing.assert_close(torch.cat([b for _, _, b in sink.blocks], dim=1), probs, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ours[0], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours, unfused, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours, fused, rtol=1e-5, atol=1e-6)


def test_gradients_a_mask_training_or_a_batch_take_timms_own_forward():
    attn, x = _module()
    attn.fused_attn = False
    sink = Sink()
    forward = blocked_attention(attn, 0, sink)
    with torch.no_grad():
        whole = Attention.forward(attn, x)
        mask = torch.zeros(1, 1, 5, 5)
        torch.testing.assert_close(forward(x, attn_mask=mask), Attention.forward(attn, x, attn_mask=mask))
        batch = torch.cat([x, x])
        torch.testing.assert_close(forward(batch), Attention.forward(attn, batch))
        attn.train()
        torch.testing.assert_close(forward(x), whole)  # dropout 0: the same values, timm's path
        attn.eval()
    torch.testing.assert_close(forward(x).detach(), whole)  # gradients enabled
    assert sink.blocks == [] and sink.done == []


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_model("deit_tiny_patch16_224", pretrained=False)


def test_capture_blocks_only_timms_own_class_and_restores_it_after_an_error(tiny):
    sink = Sink()
    modules = tiny.attention_modules
    with pytest.raises(RuntimeError, match="inside"):
        with capture_attention(tiny, rows=sink):
            assert all("forward" in vars(a) for a in modules)
            raise RuntimeError("an error inside the block")
    assert not any("forward" in vars(a) for a in modules) and all(a.fused_attn for a in modules)

    class Subclass(Attention):  # a subclass may compute its attention otherwise: it keeps its own forward
        pass

    modules[0].__class__ = Subclass
    try:
        with capture_attention(tiny, rows=sink):
            assert "forward" not in vars(modules[0]) and "forward" in vars(modules[1])
    finally:
        modules[0].__class__ = Attention
    assert sink.blocks == []  # no forward ran


def _pass(tiny, folder, blocked: bool, monkeypatch, gradients: bool = False):
    picture = load_image(REPO / "assets" / "chelsea.png")
    with monkeypatch.context() as patch:
        patch.setattr(capture, "ROW_BLOCK_BYTES", 3 * 785 * 4 * 50)  # 50 rows a block: 16 blocks a layer
        if not blocked:
            patch.setattr(capture, "TimmAttention", type("NotTimm", (), {}))  # no module qualifies
        calls = []
        sink_rows = capture.blocked_attention

        def counting(attn, layer, sink):
            calls.append(layer)
            return sink_rows(attn, layer, sink)
        patch.setattr(capture, "blocked_attention", counting)
        result = analyze_image(tiny, picture, input_size=LARGE, gradients=gradients, relevance=False, spill=folder)
    return result, calls


@pytest.mark.slow  # four 448-px DeiT-Ti passes
def test_the_pass_by_rows_gives_the_whole_map_pass_result(tiny, tmp_path, monkeypatch):
    folder = SpillFolder(2 ** 30, root=tmp_path)
    rows, calls = _pass(tiny, folder, True, monkeypatch)
    whole, none = _pass(tiny, folder, False, monkeypatch)
    assert calls == list(range(tiny.depth)) and none == []
    a, b = rows.attention_store, whole.attention_store
    assert a.mode == b.mode == "qk16" and a.spill is not None and b.spill is not None
    # the blocks' products and sums run in another order: float32 rounding apart, the same numbers
    np.testing.assert_allclose(rows.probs, whole.probs, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(rows.mean_distance, whole.mean_distance, rtol=1e-5)
    np.testing.assert_allclose(rows.heads.prefix_share, whole.heads.prefix_share, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(a.queries.astype(np.float32), b.queries.astype(np.float32), rtol=1e-2, atol=1e-3)
    assert a.max_error <= 1e-3 and b.max_error <= 1e-3
    index = np.arange(0, 785, 13)
    for layer in (0, tiny.depth - 1):
        np.testing.assert_allclose(a.spill.rows(layer, index, "sum"), b.spill.rows(layer, index, "sum"),
                                   rtol=1e-4, atol=1e-7)
        for plane in ("max", "min"):
            np.testing.assert_allclose(a.spill.rows(layer, index, plane).astype(np.float32),
                                       b.spill.rows(layer, index, plane).astype(np.float32), rtol=2e-3, atol=1e-7)
    query = readout_query(tiny)
    for options in (dict(), dict(head_fusion="max", discard_ratio=0.9)):
        ours, theirs = rollout(a, rows.layout, query=query, **options), rollout(b, whole.layout, query=query, **options)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-3 * theirs.max())
    # a pass with gradients keeps each layer's whole maps for the backward: no module is blocked
    with_gradients, calls = _pass(tiny, folder, True, monkeypatch, gradients=True)
    assert calls == [] and with_gradients.gradcam is not None
