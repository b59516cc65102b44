"""Head-fused attention spilled to local disk (vit_inspect.passes.spill): the folder's byte budget, the files'
lifetime, and rollout redraws that read the model's own maps fused instead of rebuilding every head from q and k."""
from __future__ import annotations

import dataclasses
import gc
import pickle
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from support import REPO

from vit_inspect.analysis import attention_map as reference_attention_map
from vit_inspect.analysis import rollout as reference_rollout
from vit_inspect.core.images import load_image
from vit_inspect.core.load import load_model
from vit_inspect.passes import pipeline
from vit_inspect.passes.attention_store import TOLERANCE, attention_map, rollout
from vit_inspect.passes.capture import capture_attention
from vit_inspect.passes.pipeline import analyze_image, readout_query
from vit_inspect.passes.spill import PLANE_BYTES, PLANES, SPILL_MIN_SHARE, SpillFolder, worth_spilling
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.inspector import Inspector

SHAPE = (2, 2, 2)  # (depth, N, N): 2 layers of 4 entries, 8 bytes each over the planes: 64 bytes
LARGE = (448, 448)  # DeiT-Ti at 448 px: N = 785, 3 x 785 >= 0.015 x 192^2, so it spills


def planes(value: float, shape=SHAPE[1:]) -> dict[str, np.ndarray]:
    return {name: np.full(shape, value, np.float32) for name, _ in PLANES}


def filled(folder: SpillFolder, value: float):
    spill = folder.reserve(SHAPE)
    for layer in range(SHAPE[0]):
        spill.write(layer, planes(value))
    assert spill.finish()
    return spill


def test_the_folder_keeps_spills_within_its_budget_least_recently_read_first(tmp_path):
    folder = SpillFolder(3 * 64, root=tmp_path)
    assert stat.S_IMODE(folder.path.stat().st_mode) == 0o700  # private to this process's user
    a, b, c = (filled(folder, v) for v in (0.25, 0.5, 0.75))
    assert folder.used == 192 and len(folder) == 3
    assert PLANE_BYTES == 8 and a.nbytes == 64
    assert a.layer(1, "sum")[1, 0] == 0.25  # reading `a` makes `b` the least recently read
    d = filled(folder, 1.0)
    assert not b.alive and b.layer(0, "sum") is None and not b.path.exists()
    assert a.alive and c.alive and d.alive and folder.used == 192
    assert sorted(p.name for p in folder.path.iterdir()) == sorted(s.path.name for s in (a, c, d))
    assert folder.reserve((2, 4, 4)) is None  # 256 bytes: more than the whole budget
    assert SpillFolder(0, root=tmp_path).reserve(SHAPE) is None
    with pytest.raises(ValueError, match="at least 0"):
        SpillFolder(-1, root=tmp_path)
    folder.close()
    assert not folder.path.exists() and folder.used == 0 and not a.alive


def test_a_spill_is_served_only_when_every_layer_was_written(tmp_path):
    folder = SpillFolder(10 ** 6, root=tmp_path)
    spill = folder.reserve(SHAPE)
    spill.write(0, planes(1.0))
    assert spill.layer(0, "max") is None  # not before `finish`
    assert not spill.finish()  # layer 1 is missing: dropped, never half-served
    assert not spill.alive and folder.used == 0 and not spill.path.exists()
    # dropped by the folder while its pass still writes (another session needed the room): the writer
    # stops, closes its file and the spill is never served
    spill = folder.reserve(SHAPE)
    spill.write(0, planes(1.0))
    folder.drop(spill)
    assert spill._fd is not None  # the writer's descriptor is not closed under it
    spill.write(1, planes(1.0))
    assert spill._fd is None and not spill.finish() and spill.layer(0, "min") is None and folder.used == 0


def _rss_file_bytes() -> int:
    """File-backed resident memory of this process (mapped page-cache pages), from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile line")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc/self/status")
def test_reads_leave_nothing_mapped_and_take_the_rows_asked_for(tmp_path):
    """Rows are read into arrays of their own, in runs of consecutive rows: no page of the file stays in the
    process's resident memory (a mapping of the whole file, kept for the spill's life, held every page ever
    read), and any set of rows comes back as the file holds it."""
    shape = (4, 1024, 1024)  # 4 layers of 8 MiB over the three planes
    folder = SpillFolder(2 ** 30, root=tmp_path)
    spill = folder.reserve(shape)
    rng = np.random.default_rng(0)
    values = [{name: rng.random(shape[1:]).astype(dtype) for name, dtype in PLANES} for _ in range(shape[0])]
    for layer in range(shape[0]):
        spill.write(layer, values[layer])
    assert spill.finish()
    before = _rss_file_bytes()
    for layer in range(shape[0]):
        for name, dtype in PLANES:
            read = spill.layer(layer, name)
            assert read.dtype == dtype
            np.testing.assert_array_equal(read, values[layer][name])
    assert _rss_file_bytes() - before < 2 ** 20  # 32 MiB read, none of it mapped
    for index in ([5], [0, 1, 2, 900, 901, 7], list(range(1000, 1024)), [], [1023, 0]):
        for name, _ in PLANES:
            np.testing.assert_array_equal(spill.rows(3, index, name), values[3][name][index])
    with pytest.raises(IndexError):
        spill.rows(0, [1024], "sum")
    with pytest.raises(ValueError, match="unknown plane"):
        spill.rows(0, [1], "mean")
    folder.drop(spill)
    assert spill.rows(0, [1], "sum") is None and spill.layer(0, "max") is None


def test_a_released_spills_file_is_kept_for_the_next_spill_of_its_size(tmp_path):
    """The last reference gone, the file stays (renamed) and counts toward the budget; the next spill of the
    same size overwrites it in place and serves only what its own pass wrote; a half-written one is never
    served; files kept for reuse go first when room is needed, and with the folder."""
    folder = SpillFolder(4 * 64, root=tmp_path)
    spill = filled(folder, 0.5)
    path = spill.path
    inode = path.stat().st_ino
    with pytest.raises(TypeError, match="does not pickle"):
        pickle.dumps(spill)
    del spill
    gc.collect()
    assert not path.exists() and len(folder) == 0 and folder.used == folder.reusable == 64
    assert [p.name for p in folder.path.iterdir()] == ["free-0.planes"]

    again = folder.reserve(SHAPE)  # the same file, overwritten
    assert again.path.stat().st_ino == inode and folder.reusable == 0 and folder.used == 64
    assert again.layer(0, "sum") is None  # the earlier image's bytes are there, but not served
    again.write(0, planes(0.25))
    again.write(1, planes(0.75))
    assert again.finish()
    assert again.layer(0, "sum")[0, 0] == 0.25 and again.layer(1, "min")[1, 1] == 0.75
    assert [p.name for p in folder.path.iterdir()] == [again.path.name]

    half = folder.reserve(SHAPE)  # released half-written: kept for reuse too, never served
    half.write(0, planes(1.0))
    del half
    gc.collect()
    assert folder.reusable == 64 and len(folder) == 1
    other = folder.reserve((2, 3, 3))  # another size, 144 bytes: 64 + 64 + 144 > 256, the kept file goes first
    assert other is not None and again.alive and folder.reusable == 0 and folder.used == 64 + 144
    folder.close()
    assert not folder.path.exists() and folder.used == 0


def test_a_spill_collected_while_its_folder_is_locked_is_released_later_without_waiting(tmp_path):
    """A garbage collection can run a spill's finalizer inside the folder's own locked section (the same
    thread): the release must not wait for the lock, and is done the next time the folder is used."""
    folder = SpillFolder(10 ** 6, root=tmp_path)
    spill = filled(folder, 0.5)
    key = spill.key
    with folder._lock:  # as inside `reserve`, when an allocation triggers a collection
        del spill
        gc.collect()  # the finalizer ran here, and returned at once
        assert len(folder._spills) == 1 and list(folder._released) == [key]
    assert len(folder) == 0 and folder.reusable == 64 and folder.used == 64
    assert [p.name for p in folder.path.iterdir()] == [f"free-{key}.planes"]
    folder.close()


def test_which_models_spill():
    """heads * N >= 0.015 D^2: where a first redraw rebuilt from q/k was measured above 0.25 of a forward
    (with 2 threads), the maps spill; where it stayed well under, they do not."""
    assert SPILL_MIN_SHARE == 0.015
    assert worth_spilling(1374, 384, 6)  # DINOv2-S/14 at 518: rebuilding cost 0.46 of a forward
    assert worth_spilling(1374, 1024, 16)  # DINOv2-L/14 at 518: 0.23 with 1 thread
    assert worth_spilling(197, 192, 3)  # DeiT-Ti at 224: 0.22 with 1 thread, 0.31 with 2
    assert not worth_spilling(577, 768, 12)  # ViT-B/16 at 384: 0.14
    assert not worth_spilling(197, 768, 12)  # ViT-B/16 at 224: 0.05
    assert not worth_spilling(577, 1024, 16)  # ViT-L/16 at 384: share 0.009
    assert not worth_spilling(50, 192, 3)  # DeiT-Ti at 112: 3 x 50 = 150 < 0.015 x 192^2 = 553
    assert worth_spilling(185, 192, 3) and not worth_spilling(184, 192, 3)  # the boundary: 555 >= 552.96 > 552


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_model("deit_tiny_patch16_224", pretrained=False)


@pytest.fixture(scope="module")
def picture():
    return load_image(REPO / "assets" / "chelsea.png")


@pytest.mark.slow  # a 448-px DeiT-Ti pass and rollouts over every layer
def test_the_pass_spills_the_model_s_own_maps_fused_and_redraws_read_them(tiny, picture, tmp_path):
    folder = SpillFolder(2 ** 30, root=tmp_path)
    result = analyze_image(tiny, picture, input_size=LARGE, relevance=False, spill=folder)
    store, layout = result.attention_store, result.layout
    n = layout.num_tokens
    assert store.mode == "qk16" and store.spill is not None and store.spill.alive
    assert folder.used == tiny.depth * n * n * 8 == store.spill.nbytes  # float32 sum, float16 max and min
    assert store.nbytes() < store.spill.nbytes / 3  # the spill is on disk, not in the result

    # the planes are the model's own maps fused: the float32 sum over heads, the maximum and minimum rounded once
    # as the pass ran it: with gradients (a forward without them sends this model's large linear layers through
    # oneDNN, `core.linear`: the same product, rounded differently, which float16 rounding can tell apart)
    pixels, _ = tiny.preprocess.apply(picture, LARGE)
    with capture_attention(tiny) as rec:
        tiny.forward(pixels.requires_grad_(True))
    real = rec.attention[0].detach().numpy()  # (depth, heads, N, N) float32
    for layer in (0, 5, 11):
        np.testing.assert_allclose(store.spill.layer(layer, "sum"), real[layer].sum(0), rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(store.spill.layer(layer, "max"), real[layer].max(0).astype(np.float16))
        np.testing.assert_array_equal(store.spill.layer(layer, "min"), real[layer].min(0).astype(np.float16))

    # a rollout redraw reads them: the first release's rollout on the model's maps, every option; max and min
    # equal it on the float16-rounded maps (rounding is monotonic), the mean on the float32 maps to float32's
    # sums. A discard ranks the mean's entries: one a few float32 units from the threshold may fall on either
    # side, which moves the map by at most the share of such entries (here 2e-3 of its largest value)
    query = readout_query(tiny)
    half = real.astype(np.float16).astype(np.float32)
    for options in (dict(), dict(head_fusion="max", discard_ratio=0.9), dict(head_fusion="min", residual=False,
                    start_layer=6), dict(head_fusion="max", discard_ratio=0.9, discard="matrix"),
                    dict(discard_ratio=0.9, discard="matrix"), dict(discard_ratio=0.5)):
        mean = options.get("head_fusion", "mean") == "mean"
        ours = rollout(store, layout, query=query, **options)
        theirs = reference_rollout(real if mean else half, layout, query=query, **options)
        if mean and options.get("discard_ratio"):
            np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-3 * theirs.max())
            assert np.corrcoef(ours.ravel(), theirs.ravel())[0, 1] > 0.9999
        else:
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-9)
    # the mean of heads from a query reads the sum plane; one head's rows are rebuilt from q and k
    np.testing.assert_allclose(attention_map(store, layout, 11, None, "mean"),
                               reference_attention_map(real, layout, 11, None, "mean"), rtol=1e-5, atol=1e-8)
    assert np.abs(store.rows(5, [0, 3, 700]) - real[5][:, [0, 3, 700]]).max() <= TOLERANCE
    assert np.abs(attention_map(store, layout, 11, 2, (3, 4))
                  - layout.to_grid(layout.patches(real[11, 2, layout.token_index(3, 4)]))).max() <= TOLERANCE

    # the same store without the spill rebuilds from q and k, within the store's tolerance
    rebuilt = dataclasses.replace(store, spill=None)
    copy = pickle.loads(pickle.dumps(store))
    assert copy.spill is None and copy.mode == "qk16"
    np.testing.assert_array_equal(rollout(copy, layout, query=query), rollout(rebuilt, layout, query=query))
    np.testing.assert_allclose(rollout(rebuilt, layout, query=query), rollout(store, layout, query=query),
                               atol=TOLERANCE)

    # dropped (the budget, another session): the next redraw rebuilds, no error
    folder.drop(store.spill)
    assert not store.spill.alive and folder.used == 0
    np.testing.assert_array_equal(rollout(store, layout, query=query, discard_ratio=0.5),
                                  rollout(rebuilt, layout, query=query, discard_ratio=0.5))
    del result, store, copy
    gc.collect()
    assert list(folder.path.iterdir()) == []


def test_no_spill_where_rebuilding_is_cheap_or_maps_are_kept(tiny, picture, tmp_path, monkeypatch):
    folder = SpillFolder(2 ** 30, root=tmp_path)
    small = analyze_image(tiny, picture, input_size=(112, 112), relevance=False, spill=folder)  # N = 50: cheap
    assert small.attention_store.spill is None and folder.used == 0
    monkeypatch.setattr(pipeline, "TOLERANCE", -1.0)  # no layer passes the q/k check: the maps are kept
    kept = analyze_image(tiny, picture, input_size=LARGE, relevance=False, gradients=False, spill=folder)
    assert kept.attention_store.mode == "maps" and kept.attention_store.spill is None
    assert folder.used == 0 and list(folder.path.iterdir()) == []


def test_the_app_spills_under_its_own_budget(monkeypatch):
    import app
    from vit_inspect.ui.model_cache import ModelCache

    assert AppConfig().spill_budget == 4 * 2 ** 30
    assert app.parse_args(["--spill-budget", "0.5"])[0].spill_budget == 2 ** 29
    assert app.parse_args(["--spill-budget", "-3"])[0].spill_budget == 0
    off = Inspector(AppConfig(spill_budget=0), ModelCache(loader=lambda *a, **k: None))
    assert off.spill is None
    on = Inspector(AppConfig(spill_budget=2 ** 20), ModelCache(loader=lambda *a, **k: None))
    assert on.spill.budget == 2 ** 20 and on.spill.path.is_dir()
