"""The compact attention store: maps rebuilt from float16 queries/keys equal the recorded maps to float16
precision on every token layout, rollout/attention/distance equal the dense reference functions, and
models whose attention is not softmax(s q k^T) fall back to stored maps."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from support import TINY_TIMM, make_layout, sharpen_attention, tiny_handle, tiny_hf

from vit_inspect.analysis import (
    attention_map,
    mean_attention_distance,
    prefix_shares,
    rollout,
)
from vit_inspect.analysis.attention_distance import patch_distances
from vit_inspect.core.families import adapter_of
from vit_inspect.core.hf_models import handle_from_hf
from vit_inspect.passes import attention_store, capture, layer_stream, spill
from vit_inspect.passes.attention_store import AttentionStore
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.pipeline import analyze_image

F16 = 2e-3  # float16 precision of a probability in [0, 1], with the rebuild's own rounding


@pytest.fixture(autouse=True)
def qk_store(monkeypatch):
    """This module's subject is the Q/K store, which the tiny models' maps (a few kB) would skip: kept as they
    are (`keeps_maps`). So the bound is 0 bytes here, but for the tests of that path, which set it back."""
    monkeypatch.setattr(attention_store, "MAPS_IN_MEMORY_BYTES", 0)
    monkeypatch.setattr(spill, "shared_folder", lambda: None)  # and no automatic spill


def _image(seed: int = 0, size=(40, 56)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, size=(*size, 3), dtype=np.uint8))


def _dense(handle, result):
    """The first release's pass: every map recorded by capture_attention, float32."""
    pixels = handle.preprocess.apply(_image(), result.layout.input_size)[0]
    with torch.no_grad(), capture_attention(handle) as rec:
        handle.forward(pixels)
    return rec.attention[0].numpy()  # (depth, heads, N, N)


def _queries(layout):
    return ([None, "mean", (0, 0), (layout.grid_h - 1, layout.grid_w - 1)] + (["class"] if layout.has_class_token else [])
            + (["distillation"] if layout.num_dist_tokens else []))


def _compare(handle, result):
    dense = _dense(handle, result)
    layout = result.layout
    assert np.abs(result.attention_stack().astype(np.float32) - dense).max() < F16
    for layer in range(handle.depth):
        np.testing.assert_allclose(result.attention_layer(layer), dense[layer], atol=F16)
        for head in (None, handle.num_heads - 1):
            for query in _queries(layout):
                expected = attention_map(dense, layout, layer, head, query or result.readout)
                np.testing.assert_allclose(result.attention_map(layer, head, query), expected, atol=F16)
    for options in (dict(), dict(head_fusion="max", discard_ratio=0.5), dict(head_fusion="min", residual=False),
                    dict(start_layer=1, query="mean"), dict(end_layer=1, query=(0, 1))):
        # today's design: rollout over the float16-stored maps (discarding ranks entries, so the reference
        # must round like the stored maps do)
        expected = rollout(dense.astype(np.float16), layout, **({"query": result.readout} | options))
        np.testing.assert_allclose(result.rollout(**options), expected, atol=F16, rtol=1e-2)
    for options in (dict(discard_ratio=0.9, discard="matrix"), dict(discard_ratio=0.3, discard="matrix", start_layer=1)):
        expected = rollout(dense.astype(np.float16), layout, **({"query": result.readout} | options))
        np.testing.assert_allclose(result.rollout(**options), expected, atol=F16, rtol=1e-2)
    for layer in range(handle.depth):
        heads = np.stack([attention_map(dense, layout, layer, h, result.readout) for h in range(handle.num_heads)])
        np.testing.assert_allclose(result.head_maps(layer), heads, atol=F16)
        for head in (None, 0):
            for query in (None, "mean", (0, 0)):  # the first release's prefix shares, read from the stack
                matrix = dense[layer].mean(axis=0) if head is None else dense[layer, head]
                expected = prefix_shares(matrix, layout, query or result.readout)
                np.testing.assert_allclose(list(result.prefix_share(layer, head, query).values()), expected, atol=F16)
    np.testing.assert_allclose(result.mean_distance, mean_attention_distance(dense, layout), rtol=1e-5)


def test_rebuilt_maps_equal_recorded_maps_on_every_layout(tiny_kind):
    handle = tiny_handle(tiny_kind)
    result = analyze_image(handle, _image(), input_size=TINY_TIMM[tiny_kind][1])
    assert result.attention_store.mode == "qk16" and result.attention_store.maps is None
    assert result.attention_store.max_error < attention_store.TOLERANCE
    _compare(handle, result)


@pytest.mark.parametrize("distilled", [False, True])
def test_rebuilt_maps_on_hf_models(distilled):
    handle = handle_from_hf(tiny_hf(distilled=distilled), device="cpu", input_size=(32, 48))
    result = analyze_image(handle, _image())
    assert result.attention_store.mode == "qk16"
    _compare(handle, result)


@pytest.mark.parametrize("gradients", [True, False])  # whole maps per layer; without: blocks of query rows
def test_distance_sums_as_one_batched_product(tiny_kind, gradients, monkeypatch):
    """Large maps take each query's distance sum and patch mass from one batched product, (2, P) x (P, heads)
    per query (`layer_stream.BATCHED_DISTANCE_ENTRIES`, set to 0 here so tiny maps take it): the mean distance
    equals the dense reference, whole layers or 5 rows a block."""
    monkeypatch.setattr(layer_stream, "BATCHED_DISTANCE_ENTRIES", 0)
    handle = tiny_handle(tiny_kind)
    sharpen_attention(handle)  # distinct heads: a sum taken from the wrong rows or keys shows
    num_tokens = handle.layout(TINY_TIMM[tiny_kind][1]).num_tokens
    monkeypatch.setattr(capture, "ROW_BLOCK_BYTES", 4 * handle.num_heads * 5 * num_tokens)
    result = analyze_image(handle, _image(), input_size=TINY_TIMM[tiny_kind][1], gradients=gradients)
    expected = mean_attention_distance(_dense(handle, result), result.layout)
    np.testing.assert_allclose(result.mean_distance, expected, rtol=1e-5)


@pytest.mark.parametrize("batched, autocast", [(True, False), (False, False), (True, True)])
def test_distance_sums_of_whole_maps_and_of_rows(batched, autocast, monkeypatch):
    """`LayerStream._distance_sums_of` on sharp random maps, both ways of computing it: sum_j a_hij d_ij and
    sum_j a_hij over patch keys j for every patch query i, against the same sums in float64 numpy, for a
    layer's whole maps and for a block of patch query rows that starts inside the patches. Inside autocast
    (a half-precision pass calls it during its forward) the batched product still runs in float32, where
    autocast would take a batched product to bfloat16 (3 significant digits)."""
    monkeypatch.setattr(layer_stream, "BATCHED_DISTANCE_ENTRIES", 0 if batched else 2 ** 62)
    handle = tiny_handle("reg4")
    layout = handle.layout((32, 48))  # 4 x 6 patches after 5 prefix tokens
    torch.manual_seed(0)
    maps = torch.softmax(6 * torch.randn(2, layout.num_tokens, layout.num_tokens), dim=-1)
    patch = layout.patch_slice
    weights = maps[:, patch, patch].double().numpy()  # (heads, P, P)
    distances = patch_distances(layout)  # (P, P) pixels
    sums, mass = (weights * distances).sum(-1), weights.sum(-1)  # (heads, P)
    rows = maps[:, patch.start + 7:patch.start + 18]  # patch queries 7 .. 17, every key
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        whole = layer_stream.LayerStream(handle, layout)._distance_sums_of(maps)
        block = layer_stream.LayerStream(handle, layout)._distance_sums_of(rows, 7)
    for (got_sums, got_mass), queries in ((whole, slice(None)), (block, slice(7, 18))):
        assert got_sums.dtype == got_mass.dtype == torch.float32
        np.testing.assert_allclose(got_sums.numpy(), sums[:, queries], rtol=1e-5)
        np.testing.assert_allclose(got_mass.numpy(), mass[:, queries], rtol=1e-5)


def test_no_head_pass_keeps_the_same_store():
    handle = tiny_handle("reg4")
    with_grad = analyze_image(handle, _image(), input_size=(32, 32))
    without = analyze_image(handle, _image(), input_size=(32, 32), gradients=False)
    np.testing.assert_array_equal(with_grad.attention_store.queries, without.attention_store.queries)
    np.testing.assert_allclose(with_grad.mean_distance, without.mean_distance)
    assert without.chefer is None and without.gradcam is None


def test_store_size_grows_like_depth_n_d():
    """q and k of every layer in float16: depth * 2 * N * D * 2 bytes, nothing quadratic in N."""
    handle = tiny_handle("cls")
    store = analyze_image(handle, _image(), input_size=(64, 64)).attention_store  # N = 1 + 64
    assert store.nbytes() == handle.depth * 2 * 65 * handle.embed_dim * 2 + store.scale.nbytes


def test_wrong_rebuild_falls_back_to_maps(monkeypatch):
    """A model that does not compute softmax(s q k^T) (here: a scale the module does not use) is caught by
    the check during the pass; the maps are then stored and still equal the recorded ones."""
    handle = tiny_handle("distilled")
    adapter = adapter_of(handle)
    real = adapter.query_key_modules

    def wrong_scale(attn):
        q, k, shape, scale = real(attn)
        return q, k, shape, scale * 3.0

    monkeypatch.setattr(adapter, "query_key_modules", wrong_scale)
    result = analyze_image(handle, _image(), input_size=(32, 32))
    store = result.attention_store
    assert store.mode == "maps" and store.queries is None and store.max_error > attention_store.TOLERANCE
    _compare(handle, result)


def test_large_logits_keep_float32_queries():
    """qk-norm with a large gain: logits so large that float16 q, k cannot reproduce the probabilities to
    the tolerance; the store keeps q, k in float32 and the maps stay exact."""
    from timm.models.vision_transformer import VisionTransformer

    from vit_inspect.core.timm_models import handle_from_timm

    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=1, num_classes=10,
                              qk_norm=True).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_norm.weight.fill_(8.0)
            block.attn.k_norm.weight.fill_(8.0)
    handle = handle_from_timm(model, name="tiny-qknorm", device="cpu", input_size=(32, 32))
    result = analyze_image(handle, _image(), input_size=(32, 32))
    assert result.attention_store.mode == "qk32"
    _compare(handle, result)


@pytest.mark.parametrize("kind", ["cls", "reg4"])
def test_batched_check_equals_the_check_of_each_layer_alone(kind, monkeypatch):
    """The Q/K check waits until CHECK_BYTES are pending and then runs for the waiting layers at once. With a
    bound of 0 bytes every layer is checked alone as its maps appear (one layer pending at each flush); the
    tiny model's layers all fit the default bound (one flush, at the end). Same store, same errors."""
    flushed: list[list[int]] = []
    real_flush = layer_stream.LayerStream._flush

    def counting_flush(self):
        flushed.append([entry.layer for entry in self._pending])
        real_flush(self)

    monkeypatch.setattr(layer_stream.LayerStream, "_flush", counting_flush)
    handle = tiny_handle(kind)
    batched = analyze_image(handle, _image(), input_size=(32, 32)).attention_store
    assert [layers for layers in flushed if layers] == [list(range(handle.depth))]
    flushed.clear()
    monkeypatch.setattr(layer_stream, "CHECK_BYTES", 0)
    alone = analyze_image(handle, _image(), input_size=(32, 32)).attention_store
    assert [layers for layers in flushed if layers] == [[layer] for layer in range(handle.depth)]
    assert batched.mode == alone.mode == "qk16"
    np.testing.assert_array_equal(batched.queries, alone.queries)
    np.testing.assert_array_equal(batched.keys, alone.keys)
    assert batched.max_error == pytest.approx(alone.max_error, rel=1e-5, abs=1e-9)
    assert 0 < batched.max_error < attention_store.TOLERANCE


def test_check_flushes_when_the_pending_layers_reach_the_byte_bound(monkeypatch):
    """Pending layers are checked as soon as they hold CHECK_BYTES: with a bound of two layers' bytes, a
    six-layer model is checked two layers at a time, and the store is still every layer's Q/K."""
    from timm.models.vision_transformer import VisionTransformer

    from vit_inspect.core.timm_models import handle_from_timm

    flushed: list[tuple[list[int], int]] = []
    real_flush = layer_stream.LayerStream._flush

    def recording_flush(self):
        flushed.append(([entry.layer for entry in self._pending], self._pending_bytes))
        real_flush(self)

    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=6, num_heads=2, num_classes=10).eval()
    handle = handle_from_timm(model, name="six-layers", device="cpu", input_size=(32, 32))
    monkeypatch.setattr(layer_stream.LayerStream, "_flush", recording_flush)
    analyze_image(handle, _image(), input_size=(32, 32))
    [(layers, total)] = [f for f in flushed if f[0]]
    assert layers == list(range(6))
    flushed.clear()
    monkeypatch.setattr(layer_stream, "CHECK_BYTES", 2 * total // 6)
    store = analyze_image(handle, _image(), input_size=(32, 32)).attention_store
    assert [layers for layers, _ in flushed if layers] == [[0, 1], [2, 3], [4, 5]]
    assert store.mode == "qk16" and store.queries.shape[0] == 6


def test_store_rows_by_hand():
    """Two tokens, one head, d = 1: A = softmax(s q k^T) computed by hand."""
    q = np.array([[[[1.0], [0.0]]]], np.float16)  # (depth 1, heads 1, N 2, d 1)
    k = np.array([[[[2.0], [0.0]]]], np.float16)
    store = AttentionStore("qk16", q, k, np.array([0.5]), None, 0.0)
    e = np.exp(1.0)  # row 0: logits (0.5 * 1 * 2, 0) = (1, 0)
    np.testing.assert_allclose(store.rows(0, [0]), [[[e / (e + 1), 1 / (e + 1)]]], rtol=1e-3)  # float16 values
    np.testing.assert_allclose(store.layer(0)[0, 1], [0.5, 0.5])  # row 1: logits (0, 0)
    layout = make_layout(True, 0, 0, grid_h=1, grid_w=1)
    # rollout over one layer, residual: row 0 of 0.5 A + 0.5 I, patch key = 0.5 * 1/(e+1)
    from vit_inspect.passes.attention_store import rollout as store_rollout
    np.testing.assert_allclose(store_rollout(store, layout), [[0.5 / (e + 1)]], rtol=1e-3)
    with pytest.raises(ValueError, match="out of range"):
        store.rows(1, [0])


@pytest.mark.parametrize("small", [False, True], ids=["qk", "maps"])
def test_one_head_s_rows_equal_that_head_of_every_head_s_rows(small, monkeypatch):
    """`rows(..., head=h)` rebuilds or reads that head only, with the same values as head h of all heads'
    rows, bit for bit, and so do the one-head maps and prefix shares built on it."""
    from vit_inspect.passes import pipeline

    monkeypatch.setattr(pipeline, "keeps_maps", lambda *args: small)
    handle = tiny_handle("reg4")
    result = analyze_image(handle, _image(), input_size=TINY_TIMM["reg4"][1], gradients=False)
    store, layout = result.attention_store, result.layout
    assert store.mode == ("maps" if small else "qk16")
    tokens = np.arange(store.num_tokens)
    for layer in (0, handle.depth - 1):
        every = store.rows(layer, tokens)
        for head in range(handle.num_heads):
            np.testing.assert_array_equal(store.rows(layer, tokens, head), every[head:head + 1])
            np.testing.assert_array_equal(store.rows(layer, [3], head), every[head:head + 1, [3]])
            for query in ("mean", (0, 1), None):
                rows = attention_store.attention_rows(store, layout, layer, query)
                np.testing.assert_array_equal(attention_store.attention_rows(store, layout, layer, query, head),
                                              rows[head:head + 1])
    with pytest.raises(ValueError, match="head 9 out of range"):
        store.rows(0, [0], 9)


def test_rollout_is_cached_per_option():
    handle = tiny_handle("cls")
    result = analyze_image(handle, _image(), input_size=(32, 32))
    first = result.rollout(head_fusion="max")
    calls = []
    real = attention_store.AttentionStore.fused_row_chunks
    try:
        attention_store.AttentionStore.fused_row_chunks = lambda self, *a, **k: calls.append(1) or real(self, *a, **k)
        np.testing.assert_array_equal(result.rollout(head_fusion="max"), first)
        assert calls == []
        result.rollout(head_fusion="min")
        assert len(calls) == handle.depth
    finally:
        attention_store.AttentionStore.fused_row_chunks = real


def test_dataset_distance_runs_in_chunks_and_never_keeps_the_stack(monkeypatch, tmp_path):
    """A byte bound of one layer's maps for one image makes every forward a single image; the averages
    equal one big batch's, and only one layer's maps of one chunk are ever reduced at a time."""
    from vit_inspect.jobs import distance

    handle = tiny_handle("reg4")
    paths = []
    for i in range(5):
        paths.append(tmp_path / f"{i}.png")
        _image(i).save(paths[-1])
    whole = distance.dataset_attention_distance(handle, paths, batch_size=8)
    shapes = []
    real = distance.distances_per_image  # the folder job's worker reduces each layer as it appears
    monkeypatch.setattr(distance, "distances_per_image", lambda a, *r, **k: shapes.append(a.shape) or real(a, *r, **k))
    num_tokens = handle.layout().num_tokens
    one_map = handle.num_heads * num_tokens ** 2 * 4
    chunked = distance.dataset_attention_distance(handle, paths, batch_size=8, max_map_bytes=2 * one_map)
    np.testing.assert_allclose(chunked.distances, whole.distances, rtol=1e-5)
    assert chunked.num_images == whole.num_images == 5
    assert len(shapes) == 3 * handle.depth  # chunks of 2, 2, 1 images, one reduction per layer
    assert all(s[0] <= 2 and s[1] == 1 for s in shapes)  # (chunk, one layer, heads, N, N)


def test_head_statistics_per_layer_equal_the_stacked_definitions(tiny_kind, monkeypatch):
    """The per-head prefix share and first-order estimate, reduced layer by layer in the streaming pass, and
    the entropy, from the store on first read, equal the stacked functions on an independent dense pass;
    the pass never builds the (depth, heads, N, N) stack of the maps or of their gradients."""
    from vit_inspect.analysis.heads import (
        first_order_importance,
        head_entropy,
        prefix_attention_share,
    )
    from vit_inspect.passes.capture import AttentionRecorder

    handle = tiny_handle(tiny_kind)
    size = TINY_TIMM[tiny_kind][1]
    with monkeypatch.context() as patched:
        def refuse(self):
            raise AssertionError("the pass stacked every layer")
        patched.setattr(AttentionRecorder, "attention", property(refuse))
        patched.setattr(AttentionRecorder, "attention_grad", refuse)
        result = analyze_image(handle, _image(), input_size=size)
        no_grad = analyze_image(handle, _image(), input_size=size, gradients=False)
    pixels = handle.preprocess.apply(_image(), size)[0].requires_grad_()
    with torch.enable_grad(), capture_attention(handle) as rec:
        logits = handle.forward(pixels)
    rec.backward(logits[0, result.target])
    dense, grad = rec.attention[0].numpy(), rec.attention_grad()[0].numpy()  # (depth, heads, N, N)
    for heads in (result.heads, no_grad.heads):
        assert heads.computed_entropy is None  # not reduced in the pass: from the store, on first read
        # rows rebuilt from q and k, rounded to float16: float16's first-order bound (see the kept maps' test)
        # plus each probability's rebuild error (at most the store's max_error) times |ln a + 1| <= 18
        exact, n = head_entropy(dense), result.layout.num_tokens
        bound = 2.0 ** -11 * (exact + 1) + n * (2.0 ** -25 + result.attention_store.max_error) * 18
        assert np.all(np.abs(heads.entropy - exact) <= bound), (np.abs(heads.entropy - exact).max(), bound.min())
        np.testing.assert_allclose(heads.prefix_share, prefix_attention_share(dense, result.layout), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(result.heads.first_order, first_order_importance(dense, grad), rtol=1e-4, atol=1e-6)
    assert no_grad.heads.first_order is None
    assert result.heads.entropy.shape == (handle.depth, handle.num_heads) and result.heads.entropy.dtype == np.float32


def test_kept_maps_give_the_entropy_on_first_read(tiny_kind, monkeypatch):
    """A model whose float16 maps are kept reduces no entropy in the pass (nothing the app shows reads it):
    `HeadPass.entropy` takes it from the kept maps on first read, equal to `head_entropy` of those maps
    and within float16's rounding of the float32 maps' entropy: each probability within 2^-11 of itself
    (relative) moves H_i = -sum_j a_ij ln a_ij by at most 2^-11 sum_j a_ij |ln a_ij + 1| <= 2^-11 (H_i + 1),
    to first order, plus 2^-25 per subnormal float16 entry times |ln a + 1| (at most 18)."""
    from vit_inspect.analysis.heads import head_entropy
    from vit_inspect.passes import head_pass

    monkeypatch.undo()  # this test is of the kept maps, not of the Q/K store
    handle = tiny_handle(tiny_kind)
    size = TINY_TIMM[tiny_kind][1]
    calls = []
    monkeypatch.setattr(head_pass, "entropy_sums", lambda maps: calls.append(maps.shape) or
                        maps.clamp_min(torch.finfo(maps.dtype).tiny).log_().mul_(maps).sum(-1))
    result = analyze_image(handle, _image(), input_size=size)
    store = result.attention_store
    assert store.mode == "maps" and result.heads.computed_entropy is None and calls == []  # nothing in the pass
    assert result.heads.store is store  # the result's store, not a copy
    entropy = result.heads.entropy
    assert len(calls) == handle.depth and result.heads.entropy is entropy  # one reduction per layer, then kept
    np.testing.assert_allclose(entropy, head_entropy(store.maps.astype(np.float32)), rtol=1e-6)
    exact = head_entropy(_dense(handle, result))  # (depth, heads) float32 maps' entropy, float64
    bound = 2.0 ** -11 * (exact + 1) + result.layout.num_tokens * 2.0 ** -25 * 18
    assert np.all(np.abs(entropy - exact) <= bound), (np.abs(entropy - exact).max(), bound.min())
    assert entropy.shape == (handle.depth, handle.num_heads) and entropy.dtype == np.float32
    heads = result.heads  # its own arrays, the entropy now included; the kept maps are the store's, counted there
    assert heads.nbytes() == sum(a.nbytes for a in (heads.logits, heads.token_norms, entropy, heads.prefix_share,
                                                     heads.first_order, *heads.lens.values()))


def test_nbytes_counts_the_store_legrad_attnlrp_features_gradient_preview_and_heads():
    handle = tiny_handle("cls")
    result = analyze_image(handle, _image())
    assert result.legrad is not None and result.attnlrp is not None and result.heads is not None
    assert result.patch_features is not None and result.preview is not None and result.gradient.fused is not None
    assert result.block_tokens is not None  # every block's patch tokens: small for a tiny model
    arrays = (result.rgb, result.probs, result.mean_distance, result.gradcam, result.chefer, result.legrad,
              result.attnlrp, result.patch_features, result.block_tokens, result.preview, result.gradient.fused)
    expected = result.attention_store.nbytes() + sum(a.nbytes for a in arrays) + result.heads.nbytes()
    assert result.heads.nbytes() > 0 and result.nbytes() == expected
    cached = result.rollout(head_fusion="max")  # a cached rollout counts too
    assert cached.shape == (result.layout.grid_h, result.layout.grid_w) and result.nbytes() == expected + cached.nbytes


def test_which_passes_keep_their_maps():
    """depth * heads * N^2 * 2 bytes of float16 maps, at most MAPS_IN_MEMORY_BYTES = 4 MiB (4,194,304)."""
    bound = 4 * 2 ** 20
    cases = {(12, 3, 197): True,  # DeiT-Ti/16 at 224: 12 * 3 * 197^2 * 2 = 2,794,248 bytes
             (12, 6, 197): False,  # ViT-S/16 at 224: 5,588,496
             (12, 12, 197): False,  # ViT-B/16 at 224: 11,176,992
             (12, 3, 577): False,  # DeiT-Ti/16 at 384
             (12, 3, 241): True, (12, 3, 242): False}  # the boundary: 4,181,832 <= 4,194,304 < 4,216,608
    for (depth, heads, tokens), kept in cases.items():
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(attention_store, "MAPS_IN_MEMORY_BYTES", bound)
            assert attention_store.keeps_maps(depth, heads, tokens) is kept, (depth, heads, tokens)


@pytest.mark.parametrize("kind", ["cls", "reg4", "nonsquare"])
def test_small_maps_are_kept_as_the_model_made_them(kind, monkeypatch, tmp_path):
    """Under the bound the pass records no Q/K, checks nothing and spills nothing (even where a spill folder
    is given and the model would spill): the store holds every layer's maps, each rounded once to float16
    (torch rounds to nearest even, as numpy does), and every view equals the first release's."""
    from vit_inspect.passes import pipeline
    from vit_inspect.passes.spill import SpillFolder

    monkeypatch.setattr(attention_store, "MAPS_IN_MEMORY_BYTES", 4 * 2 ** 20)
    monkeypatch.setattr(pipeline, "worth_spilling", lambda *args: True)
    handle = tiny_handle(kind)
    recorded = []
    monkeypatch.setattr(layer_stream.LayerStream, "_record", lambda self, *args: recorded.append(args))
    folder = SpillFolder(2 ** 30, root=tmp_path)
    result = analyze_image(handle, _image(), input_size=TINY_TIMM[kind][1], spill=folder)
    store = result.attention_store
    assert store.mode == "maps" and store.queries is None and store.keys is None and store.max_error == 0.0
    assert store.spill is None and folder.used == 0 and recorded == []  # no Q/K hook ran
    dense = _dense(handle, result)
    np.testing.assert_array_equal(store.maps, dense.astype(np.float16))
    assert store.nbytes() == handle.depth * handle.num_heads * result.layout.num_tokens ** 2 * 2
    _compare(handle, result)
