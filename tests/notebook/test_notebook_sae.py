"""The notebook's SAE features: `Analysis.features` against the codes computed here, labels from the index beside
the SAE file, and `show_feature`'s map, colour bar, gallery and title."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from support import tiny_handle

import vit_inspect as vi
from vit_inspect.core.errors import InputError, WeightsError
from vit_inspect.core.images import find_images
from vit_inspect.core.sae_file import SAEInfo, SparseAutoencoder, save_sae
from vit_inspect.core.sae_index import index_path, save_index
from vit_inspect.jobs.sae_index import build_index
from vit_inspect.passes.sae import patch_codes
from vit_inspect.plots.sae import UNIT


def random_sae(handle, seed: int) -> SparseAutoencoder:
    torch.manual_seed(seed)
    d = handle.embed_dim
    info = SAEInfo(model=handle.name, layer=1, k=3, features=6, width=d)
    return SparseAutoencoder(torch.randn(d, 6), torch.randn(6), torch.randn(6, d), torch.zeros(d), info)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sae")
    for seed in range(3):
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
            folder / f"noise{seed}.png")
    handle = tiny_handle("cls", seed=2)
    sae = random_sae(handle, 0)
    sae_path = folder / "sae.safetensors"
    save_sae(sae, sae_path)
    index = build_index(handle, sae, sae_path, find_images([folder]), top=2, crop=12)
    save_index(index, index_path(sae_path))
    return handle, sae, sae_path, index, vi.analyze(folder / "noise0.png", model=handle)


def test_features_are_the_codes_summed_over_the_patches_with_the_index_labels(setup):
    handle, sae, sae_path, index, r = setup
    codes, _ = patch_codes(handle, sae, handle.preprocess.normalize(r.result.rgb))
    totals = codes[0].sum(0)  # (F,)
    expected = [int(f) for f in torch.argsort(-totals)[:3] if totals[f] > 0]
    table = r.features(sae_path, top=3)
    assert [row["feature"] for row in table.rows] == expected
    assert [row["activation"] for row in table.rows] == pytest.approx([float(totals[f]) for f in expected], rel=1e-5)
    assert [row["label"] for row in table.rows] == [index.label(f) for f in expected] and table.rows[0]["label"]
    assert "tiny-cls · noise0.png · block 1 output · sae.safetensors" in table.title
    assert "<table>" in table._repr_html_()
    loaded = r.features(sae, top=3)  # a loaded SAE: no index beside it, no labels
    assert [row["feature"] for row in loaded.rows] == expected and all(row["label"] == "" for row in loaded.rows)
    at = codes[0, 5]  # patch (1, 1) of the 4x4 grid
    assert r.features(sae_path, top=1, patch=(1, 1)).rows[0]["activation"] == pytest.approx(float(at.max()), rel=1e-5)


def test_show_feature_names_everything_and_shows_the_gallery(setup):
    handle, sae, sae_path, index, r = setup
    feature = int(np.flatnonzero(index.image[:, 0] >= 0)[0])
    fig = r.show_feature(sae_path, feature)
    title = fig._suptitle.get_text().replace("\n", " ")
    for part in ("tiny-cls", "noise0.png", "block 1", "sae.safetensors", f"feature {feature}", index.label(feature)):
        assert part in title, part
    bars = [ax.get_ylabel() for ax in fig.get_axes() if ax.get_label() == "<colorbar>"]
    assert bars == [UNIT]
    crops = [ax for ax in fig.get_axes() if ax.get_title().startswith("z=")]
    assert len(crops) == len(index.feature(feature).activations) > 0
    plain = r.show_feature(sae, feature)  # no index: the map alone
    assert not [ax for ax in plain.get_axes() if ax.get_title().startswith("z=")]
    with pytest.raises(InputError, match="features 0 to 5"):
        r.show_feature(sae_path, 6)
    with pytest.raises(WeightsError, match="another SAE"):
        r.features(random_sae(handle, 1), index=index)
