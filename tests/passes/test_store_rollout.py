"""Rollout redrawn from the attention store (`attention_store.rollout`) builds only the rows of each layer
that the propagated query vector reaches, and still equals the reference (`analysis.rollout` over the full
stack of the same maps) for every option: head fusions, both discard rules (ties included), residual or
not, layer ranges and every query."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from support import TINY_TIMM, make_layout, sharpen_attention, tiny_handle

from vit_inspect.analysis import rollout as reference_rollout
from vit_inspect.passes import attention_store
from vit_inspect.passes.attention_store import AttentionStore, rollout
from vit_inspect.passes.pipeline import analyze_image

DISCARDS = [(0.0, "row"), (0.5, "row"), (0.9, "row"), (0.9, "matrix"), (0.3, "matrix")]


def _image(seed: int = 0):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, size=(40, 56, 3), dtype=np.uint8))


def _queries(layout):
    return ([None, "mean", (0, 0), (layout.grid_h - 1, layout.grid_w - 1)]
            + (["class"] if layout.has_class_token else []) + (["distillation"] if layout.num_dist_tokens else []))


def _random_store(heads: int, num_tokens: int, head_dim: int, depth: int = 2, seed: int = 0) -> AttentionStore:
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(depth, heads, num_tokens, head_dim, generator=generator).half().numpy() for _ in range(2))
    return AttentionStore("qk16", q, k, np.full(depth, head_dim ** -0.5), None, 0.0)


def test_store_rollout_equals_the_reference_on_every_option(tiny_kind):
    handle = sharpen_attention(tiny_handle(tiny_kind))
    result = analyze_image(handle, _image(), input_size=TINY_TIMM[tiny_kind][1], gradients=False)
    store, layout = result.attention_store, result.layout
    stack = store.stack()  # (depth, heads, N, N) float16: the same rebuilt values, every row
    for fusion, (ratio, discard), residual, query, (start, end) in itertools.product(
            ("mean", "max", "min"), DISCARDS, (True, False), _queries(layout), ((0, None), (1, None), (0, 1))):
        options = dict(head_fusion=fusion, discard_ratio=ratio, residual=residual, start_layer=start,
                       end_layer=end, query=query, discard=discard)
        try:
            expected = reference_rollout(stack, layout, **options)
        except ValueError as error:  # a layer left a row empty; the store says so too when the query reaches it
            assert "no attention left" in str(error) and not residual
            continue
        # max/min are exact; the mean sums heads in float32 in the store, in float64 in the reference
        np.testing.assert_allclose(rollout(store, layout, **options), expected, rtol=1e-6, atol=1e-9,
                                   err_msg=str(options))


def test_rows_do_not_depend_on_which_rows_come_with_them():
    """A row rebuilt alone (a BLAS matrix-vector product) or with any other rows has the values of the
    whole layer's rebuild, bit for bit: rollout's discard ranks exactly the numbers a full layer gives."""
    for heads, num_tokens, head_dim in ((3, 197, 64), (2, 17, 16), (4, 3, 8)):
        store = _random_store(heads, num_tokens, head_dim)
        whole = store.layer(1)  # (heads, N, N)
        rng = np.random.default_rng(0)
        for size in sorted({1, 2, 3, 5, num_tokens // 2, num_tokens}):
            rows = np.sort(rng.choice(num_tokens, size=min(size, num_tokens), replace=False))
            np.testing.assert_array_equal(store.rows(1, rows), whole[:, rows])
            for fusion in ("mean", "max", "min"):
                chunks = list(store.fused_row_chunks(1, rows, fusion))
                fused = np.concatenate([block for _, block in chunks])
                np.testing.assert_array_equal(np.concatenate([chunk for chunk, _ in chunks]), rows)
                np.testing.assert_array_equal(fused, store.fused_layer(1, fusion)[rows])


def test_stored_maps_fuse_heads_exactly_by_torch_and_by_numpy():
    """Kept float16 maps: a few rows are fused by numpy, many by torch (`TORCH_ROWS`); both give the exact
    float64 head mean, max and min of the float16 values (the definition, in float64 here)."""
    from vit_inspect.passes.attention_store import TORCH_ROWS, _fused_stored_rows

    rng = np.random.default_rng(3)
    for heads in (3, 12):
        maps = (rng.random((heads, 197, 197)) ** 8).astype(np.float16)  # many tiny values, subnormals too
        maps[0, 5, :7] = 0.0
        exact = maps.astype(np.float64)
        for size in (1, TORCH_ROWS - 1, TORCH_ROWS, 197):
            rows = np.sort(rng.choice(197, size=size, replace=False))
            for fusion, reduce in (("mean", np.mean), ("max", np.max), ("min", np.min)):
                got = _fused_stored_rows(maps, rows, fusion)
                assert got.dtype == np.float64 and got.shape == (size, 197)
                np.testing.assert_array_equal(got, reduce(exact[:, rows], axis=0), err_msg=f"{heads} {size} {fusion}")
            store = AttentionStore("maps", None, None, None, maps[None], 0.0)  # rows(): float32, exact, both ways
            got = store.rows(0, rows)
            assert got.dtype == np.float32 and np.array_equal(got, exact[:, rows].astype(np.float32))


def test_only_reached_rows_are_rebuilt(monkeypatch):
    """A class query reads one row of the last layer; after a layer without discard every row is
    reached; the per-row discard keeps the reached set small; the whole-matrix rule builds whole layers."""
    layout = make_layout(True, 0, 0, grid_h=6, grid_w=6)  # N = 37
    store = _random_store(2, layout.num_tokens, 8, depth=3)
    built = []
    real = AttentionStore._half_rows
    monkeypatch.setattr(AttentionStore, "_half_rows", lambda self, layer, index, keys: built.append(
        (layer, len(index))) or real(self, layer, index, keys))
    rollout(store, layout, query="class")
    assert built == [(2, 1), (1, 37), (0, 37)]
    built.clear()
    rollout(store, layout, query=(2, 3), start_layer=1)
    assert built == [(2, 1), (1, 37)]
    built.clear()
    rollout(store, layout, query="mean")
    assert built == [(2, 36), (1, 37), (0, 37)]  # every patch row, then the class row too
    built.clear()
    rollout(store, layout, query="class", discard_ratio=0.9)
    # floor(0.9 * 37) = 33 of 37 dropped per row: row 0 keeps itself and 3 keys, 4 rows reached next
    assert [b[0] for b in built] == [2, 1, 0] and built[0][1] == 1 and built[1][1] == 4 and built[2][1] <= 4 * 4
    built.clear()
    rollout(store, layout, query="class", discard_ratio=0.9, discard="matrix")
    assert built == [(2, 37), (1, 37), (0, 37)]


# Uniform attention (q = 0) over class + 2x2 patches: every entry of every row is float16(0.2), all tied.
UNIFORM_LAYOUT = make_layout(True, 0, 0, grid_h=2, grid_w=2)
UNIFORM = AttentionStore("qk16", np.zeros((1, 1, 5, 1), np.float16), np.ones((1, 1, 5, 1), np.float16),
                         np.ones(1), None, 0.0)
F = float(np.float16(0.2))


def test_row_discard_breaks_ties_by_position_by_hand():
    # floor(0.5 * 5) = 2 of each row go: the two earliest non-class columns (1, 2), never the class column.
    # Class row with the residual: (0.5 [F, 0, 0, F, F] + 0.5 e_0) / (1.5 F + 0.5)
    total = 1.5 * F + 0.5
    np.testing.assert_allclose(rollout(UNIFORM, UNIFORM_LAYOUT, discard_ratio=0.5), [[0, 0], [0.5 * F / total] * 2],
                               rtol=1e-12)
    # patch (0, 0) is token 1: its own column went, the residual puts it back: (0.5 F, .., 0.5 + 0, ..)
    np.testing.assert_allclose(rollout(UNIFORM, UNIFORM_LAYOUT, discard_ratio=0.5, query=(0, 0)),
                               [[0.5 / total, 0], [0.5 * F / total] * 2], rtol=1e-12)


def test_matrix_discard_breaks_ties_in_row_major_order_by_hand():
    # floor(0.5 * 25) = 12 of the 25 tied entries go: rows 0 and 1 and row 2's columns 0, 1; (0, 0) stays.
    np.testing.assert_allclose(rollout(UNIFORM, UNIFORM_LAYOUT, discard_ratio=0.5, discard="matrix", query=(0, 0)),
                               [[1, 0], [0, 0]], rtol=1e-12)  # row 1 is empty: only the residual is left
    total = 2.5 * F + 0.5  # row 3 (patch (1, 0)) keeps every entry
    np.testing.assert_allclose(rollout(UNIFORM, UNIFORM_LAYOUT, discard_ratio=0.5, discard="matrix", query=(1, 0)),
                               [[0.5 * F / total] * 2, [(0.5 * F + 0.5) / total, 0.5 * F / total]], rtol=1e-12)


def test_an_empty_row_is_an_error_only_where_the_query_reaches_it():
    """Without the residual, a per-row discard of every patch key empties a row whose class-token
    attention underflowed in float16; the reference (every row) refuses, the store only if the row is read."""
    q = np.zeros((1, 1, 5, 1), np.float16)
    q[0, 0, 3] = 100.0  # token 3 (patch (1, 0)): logits -100 to the class token, 0 to the patches
    k = np.array([-1, 0, 0, 0, 0], np.float16).reshape(1, 1, 5, 1)
    store = AttentionStore("qk16", q, k, np.ones(1), None, 0.0)
    options = dict(discard_ratio=0.9, residual=False)  # floor(4.5) = 4: every patch key goes
    with pytest.raises(ValueError, match="no attention left"):
        reference_rollout(store.stack(), UNIFORM_LAYOUT, **options)
    with pytest.raises(ValueError, match="layer 0 has a query row with no attention left"):
        rollout(store, UNIFORM_LAYOUT, query=(1, 0), **options)
    np.testing.assert_array_equal(rollout(store, UNIFORM_LAYOUT, query="class", **options), [[0, 0], [0, 0]])
    with pytest.raises(ValueError, match="no attention left"):  # the whole-matrix rule checks every row, as before
        rollout(store, UNIFORM_LAYOUT, query="class", discard_ratio=0.9, discard="matrix", residual=False)


def test_chunked_rollout_equals_one_chunk(monkeypatch):
    """Rows rebuilt in several chunks (a small CHUNK_BYTES) give the same map as one chunk (to the float64
    rounding of the summed chunk products)."""
    layout = make_layout(True, 0, 4, grid_h=5, grid_w=5)
    store = _random_store(3, layout.num_tokens, 8, depth=3)
    options = [dict(), dict(head_fusion="max", discard_ratio=0.5), dict(query="mean", discard_ratio=0.9, discard="matrix")]
    whole = [rollout(store, layout, **o) for o in options]
    monkeypatch.setattr(attention_store, "CHUNK_BYTES", 4 * 3 * layout.num_tokens * 7)  # 7 rows per chunk
    for o, expected in zip(options, whole):
        # chunks change which float32 products rebuild the maps (2e-8 relative on this machine's MKL), which the
        # rollout's product over depth carries on (1.3e-5 seen)
        np.testing.assert_allclose(rollout(store, layout, **o), expected, rtol=1e-4)


def test_lowest_equals_a_stable_argsort():
    """The discards' selection (`_lowest`: a partition, then ties by position) against its definition,
    the first ``count`` of a stable argsort, on small integer values so that ties are everywhere."""
    from vit_inspect.analysis.rollout import _lowest

    rng = np.random.default_rng(0)
    for trial in range(600):
        shape = [(7,), (5, 9), (3, 4, 6), (30,)][trial % 4]
        values = rng.integers(0, rng.integers(1, 5), size=shape).astype(np.float64)
        width = shape[-1]
        skip = None if trial % 3 == 0 else int(rng.integers(0, width))
        count = int(rng.integers(1, width if skip is not None else width + 1))
        ranking = values.copy()
        if skip is not None:
            ranking[..., skip] = np.inf
        expected = np.zeros(shape, bool)
        np.put_along_axis(expected, np.argsort(ranking, axis=-1, kind="stable")[..., :count], True, axis=-1)
        np.testing.assert_array_equal(_lowest(values, count, skip), expected, err_msg=f"{values}, {count}, {skip}")
