"""`analyze --feature SAE_FILE:I` and `--concept LAYER:K:C[:SEED]`: the record names the target and holds the
maps the library computes, the figure is written, and a malformed spec is one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from support import PHOTOS, run_cli

from vit_inspect.core.load import load_model
from vit_inspect.core.sae_file import SAEInfo, SparseAutoencoder, save_sae
from vit_inspect.core.sae_load import load_sae
from vit_inspect.notebook import analyze
from vit_inspect.passes.targets import explain_feature

IMAGE = PHOTOS / "chelsea.png"


@pytest.fixture(scope="module")
def tiny_args(tiny_weights):
    return ["--model", "test_vit", "--weights", str(tiny_weights), "--device", "cpu"]


@pytest.fixture(scope="module")
def sae_file(tmp_path_factory):
    """A random top-4 SAE of 16 features on block 2 of timm's test_vit (64-wide tokens)."""
    generator = torch.Generator().manual_seed(0)
    info = SAEInfo(model="test_vit", layer=2, k=4, features=16, width=64)
    sae = SparseAutoencoder(torch.randn(64, 16, generator=generator), torch.zeros(16),
                            torch.randn(16, 64, generator=generator), torch.zeros(64), info)
    path = tmp_path_factory.mktemp("sae") / "tiny_l2.safetensors"
    save_sae(sae, path)
    return path


def test_analyze_explains_an_sae_feature(capsys, tmp_path, tiny_args, tiny_weights, sae_file):
    code, out, _ = run_cli(capsys, "analyze", str(IMAGE), "--feature", f"{sae_file}:3", "--out", str(tmp_path),
                           *tiny_args)
    assert code == 0
    explained = json.loads(out)["target_maps"]
    assert explained["target"] == {"kind": "sae_feature", "feature": 3, "sae": "tiny_l2.safetensors", "block": 2}
    assert explained["gradcam_block"] == 2 and explained["legrad_blocks"] == [0, 1, 2]
    handle = load_model("test_vit", weights=str(tiny_weights), device="cpu")
    expected = explain_feature(handle, IMAGE, load_sae(sae_file), 3, "legrad")
    np.testing.assert_allclose(explained["legrad"], expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())
    for key in ("gradcam", "attnlrp"):
        assert np.array(explained[key]).shape == expected.shape and np.abs(explained[key]).max() > 0
    assert (tmp_path / "chelsea_feature.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = analyze(IMAGE, handle, relevance=False)
    np.testing.assert_allclose(r.explain_feature(sae_file, 3, "legrad"), expected, rtol=1e-6)
    title = r.show_feature_maps(sae_file, 3).get_suptitle()
    assert "test_vit · chelsea.png · SAE feature 3 (tiny_l2.safetensors, block 2) · score" in title


def test_analyze_explains_a_concept_and_the_notebook_agrees(capsys, tiny_args, tiny_weights):
    code, out, _ = run_cli(capsys, "analyze", str(IMAGE), "--concept", "3:4:1:7", "--no-relevance", *tiny_args)
    assert code == 0
    record = json.loads(out)
    explained = record["target_maps"]
    assert explained["target"] == {"kind": "dff_concept", "block": 3, "k": 4, "index": 1, "seed": 7,
                                   "ordered_by_class": record["target"]["index"]}
    assert set(explained) == {"target", "score", "gradcam_block", "legrad_blocks", "gradcam"}
    r = analyze(IMAGE, load_model("test_vit", weights=str(tiny_weights), device="cpu"), relevance=False)
    maps = r.concept_maps(1, k=4, layer=3, seed=7, methods=("gradcam",))
    assert explained["score"] == pytest.approx(maps.score, rel=1e-5)
    np.testing.assert_allclose(explained["gradcam"], maps.maps["gradcam"], rtol=1e-4,
                               atol=1e-6 * np.abs(maps.maps["gradcam"]).max())
    figure = r.show_concept_maps(1, k=4, layer=3, seed=7)
    assert "DFF concept 1 of 4 (block 3, seed 7)" in figure.get_suptitle()


@pytest.mark.parametrize("flags, message", [
    (["--feature", "no_index.safetensors"], "--feature takes SAE_FILE:I"),
    (["--concept", "3:4"], "--concept takes LAYER:K:C"),
    (["--concept", "3:4:9"], "Concept 9 does not exist"),
])
def test_a_malformed_target_is_one_line(capsys, tiny_args, flags, message):
    code, _, stderr = run_cli(capsys, "analyze", str(IMAGE), *flags, "--no-relevance", *tiny_args)
    assert code == 1 and message in stderr and len(stderr.strip().splitlines()) == 1


def test_an_sae_of_another_width_is_one_line(capsys, tmp_path, tiny_args):
    info = SAEInfo(model="test_vit", layer=1, k=1, features=2, width=32)
    save_sae(SparseAutoencoder(torch.ones(32, 2), torch.zeros(2), torch.ones(2, 32), torch.zeros(32), info),
             tmp_path / "wide.safetensors")
    code, _, stderr = run_cli(capsys, "analyze", str(IMAGE), "--feature", f"{tmp_path / 'wide.safetensors'}:0",
                              *tiny_args)
    assert code == 1 and "reads 32-wide tokens" in stderr and len(stderr.strip().splitlines()) == 1
