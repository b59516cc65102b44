"""SAE feature index: the top-N merge, crops and labels by hand, a build on a tiny model checked against a brute
force over every patch, the file's round trip, and refusals (hostile headers, another SAE, oversize)."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from PIL import Image
from support import tiny_handle

from vit_inspect.core.errors import WeightsError
from vit_inspect.core.images import find_images
from vit_inspect.core.sae_file import SAEInfo, SparseAutoencoder, save_sae
from vit_inspect.core.sae_index import (INDEX_KEY, MAX_INDEX_BYTES, check_sizes, index_bytes, index_path,
                                        read_index, save_index)
from vit_inspect.jobs.engine import EngineOptions
from vit_inspect.jobs.sae_index import build_index, feature_labels, merge_top, patch_crop
from vit_inspect.passes.sae import patch_codes


def tiny_sae(handle, seed: int = 0, features: int = 6, k: int = 3) -> SparseAutoencoder:
    torch.manual_seed(seed)
    d = handle.embed_dim
    info = SAEInfo(model=handle.name, layer=1, k=k, features=features, width=d)
    return SparseAutoencoder(torch.randn(d, features), torch.randn(features), torch.randn(features, d),
                             torch.zeros(d), info, torch.zeros(d), torch.tensor(1.0))


def test_merge_top_keeps_the_largest_with_ties_to_the_smaller_key():
    values = np.array([[0.5, 2.0, 2.0, -1.0], [-1.0, -1.0, -1.0, 3.0]])
    keys = np.array([[7.0, 9.0, 4.0, -1.0], [-1.0, -1.0, -1.0, 11.0]])
    top_values, top_keys = merge_top(values, keys, 3)
    assert top_values.tolist() == [[2.0, 2.0, 0.5], [3.0, -1.0, -1.0]]
    assert top_keys.tolist() == [[4.0, 9.0, 7.0], [11.0, -1.0, -1.0]]
    padded_values, padded_keys = merge_top(values[:, :1], keys[:, :1], 2)
    assert padded_values.tolist() == [[0.5, -1.0], [-1.0, -1.0]] and padded_keys.tolist() == [[7.0, -1.0], [-1.0, -1.0]]


def test_a_crop_is_centred_on_its_patch_and_black_outside_the_image():
    rgb = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    inner = patch_crop(rgb, 1, 1, (4, 4), 4)  # patch (1, 1) covers rows 4-7; centre 6, window 4-7
    assert np.array_equal(inner, rgb[4:8, 4:8])
    corner = patch_crop(rgb, 0, 0, (4, 4), 6)  # centre 2, window -1..4
    assert np.array_equal(corner[1:, 1:], rgb[0:5, 0:5]) and not corner[0].any() and not corner[:, 0].any()


def test_labels_are_the_classes_with_most_activation():
    weight = np.array([[1.0, 3.0, 0.0, 4.0], [0.0, 0.0, 0.0, 0.0], [2.0, 2.0, 0.0, 0.0]])
    classes, shares = feature_labels(weight, 3)
    assert classes.tolist() == [[3, 1, 0], [-1, -1, -1], [0, 1, -1]]
    assert np.allclose(shares, [[0.5, 0.375, 0.125], [0, 0, 0], [0.5, 0.5, 0]])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
    handle = tiny_handle("cls")
    sae = tiny_sae(handle)
    save_sae(sae, folder / "sae.safetensors")
    files = find_images([folder])
    index = build_index(handle, sae, folder / "sae.safetensors", files, top=3, crop=12, labels=2,
                        engine_options=EngineOptions(batch_size=3))  # batches of 3 and 1: the merge runs
    return handle, sae, files, index, folder


def test_the_index_matches_a_brute_force_over_every_patch(built):
    handle, sae, files, index, _ = built
    pixels = torch.cat([handle.preprocess.apply(Image.open(f).convert("RGB"))[0] for f in files])
    codes, logits = patch_codes(handle, sae, pixels, logits=True)  # (4, 16, 6)
    grid_w, patches = handle.layout().grid_w, codes.shape[1]
    for f in range(sae.info.features):
        column = codes[..., f].reshape(-1).double()
        order = sorted(range(len(column)), key=lambda i: (-float(column[i]), i))[:3]
        live = [i for i in order if column[i] > 0]
        entry = index.feature(f)
        assert np.allclose(entry.activations, [float(column[i]) for i in live], atol=1e-6)
        assert list(entry.images) == [files[i // patches].name for i in live]
        assert entry.patches.tolist() == [list(divmod(i % patches, grid_w)) for i in live]
        assert entry.fired == pytest.approx(float((column > 0).double().mean()), abs=1e-6)
    predicted = logits.argmax(-1)  # (4,)
    weight = torch.zeros(sae.info.features, logits.shape[-1], dtype=torch.float64)
    for image in range(4):
        weight[:, predicted[image]] += codes[image].sum(0).double()
    best = int(weight[0].argmax())
    assert index.label_class[0, 0] == best and index.classes[best] == handle.label(best)
    assert index.label_share[0, 0] == pytest.approx(float(weight[0, best] / weight[0].sum()), abs=1e-6)
    assert index.built_from == {"images": 4, "patches": 64}


def test_each_crop_is_cut_from_the_image_the_model_saw(built):
    handle, _, files, index, _ = built
    entry = index.feature(2)
    row, col = entry.patches[0]
    rgb = handle.preprocess.apply(Image.open(files[[f.name for f in files].index(entry.images[0])]).convert("RGB"))[1]
    # 8 px patches, 12 px crops: the window starts 2 px before the patch
    top, left = row * 8 - 2, col * 8 - 2
    expected = np.zeros((12, 12, 3), np.uint8)
    y0, x0 = max(top, 0), max(left, 0)
    expected[y0 - top:min(top + 12, 32) - top, x0 - left:min(left + 12, 32) - left] = \
        rgb[y0:min(top + 12, 32), x0:min(left + 12, 32)]
    assert np.array_equal(entry.crops[0], expected)


def test_the_file_round_trips_and_refuses_another_sae(built):
    handle, sae, _, index, folder = built
    path = index_path(folder / "sae.safetensors")
    assert path.name == "sae.index.safetensors"
    save_index(index, path)
    back = read_index(path, sae)
    for name in ("activation", "image", "patch", "crops", "label_class", "label_share", "fired"):
        assert np.array_equal(getattr(back, name), getattr(index, name)), name
    assert back.images == index.images and back.classes == index.classes and back.label(0) == index.label(0)
    tensors = sum(getattr(index, name).nbytes for name in ("activation", "image", "patch", "crops", "label_class",
                                                            "label_share", "fired"))
    assert index_bytes(6, 3, 12, 2) == tensors and 0 < path.stat().st_size - tensors < 4096  # and a header
    with pytest.raises(WeightsError, match="another SAE of the same size"):
        read_index(path, tiny_sae(handle, seed=5))
    with pytest.raises(WeightsError, match="indexes an SAE of 6 features on block 1, but this SAE has 8"):
        read_index(path, tiny_sae(handle, features=8))


def _rewrite_header(path, out, change) -> None:
    raw = path.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + length])
    change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    out.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length:])


def test_hostile_headers_are_refused_before_any_tensor_is_read(built, tmp_path):
    _, sae, _, index, folder = built
    path = tmp_path / "good.index.safetensors"
    save_index(index, path)

    def meta(header):
        return json.loads(header["__metadata__"][INDEX_KEY])

    def set_meta(header, **changes):
        header["__metadata__"][INDEX_KEY] = json.dumps({**meta(header), **changes})

    cases = {
        "dtype": (lambda h: h["crops"].update(dtype="F32"), "crops should be U8"),
        "shape": (lambda h: h["activation"].update(shape=[6, 4]), "activation should be F32"),
        "huge": (lambda h: set_meta(h, top=64, crop=96, sae={**meta(h)["sae"], "F": 10 ** 6}), "more than"),
        "extra": (lambda h: h.update(extra={"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}), "holds tensors"),
        "images": (lambda h: set_meta(h, images=[]), "outside its list of images"),
        "grid": (lambda h: set_meta(h, grid=[1, 1]), "outside the grid"),
        "not an index": (lambda h: h.update(__metadata__={}), "not an SAE feature index"),
        "layer": (lambda h: set_meta(h, sae={**meta(h)["sae"], "layer": "six"}), "lacks top, crop"),
    }
    for name, (change, message) in cases.items():
        bad = tmp_path / f"{name}.index.safetensors"
        _rewrite_header(path, bad, change)
        with pytest.raises(WeightsError, match=message):
            read_index(bad)
    (tmp_path / "pickle.index.safetensors").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(WeightsError, match="not a valid safetensors file"):
        read_index(tmp_path / "pickle.index.safetensors")


def test_sizes_over_the_bound_are_refused_before_building():
    check_sizes(1536, 8, 32, 3)
    assert index_bytes(1536, 8, 32, 3) == 1536 * 8 * (3 * 32 * 32 + 16) + 1536 * 28 < MAX_INDEX_BYTES
    with pytest.raises(WeightsError, match="more than 134,217,728"):
        check_sizes(16384, 8, 32, 3)
    with pytest.raises(WeightsError, match="1 to 64 patches"):
        check_sizes(10, 0, 32, 3)
