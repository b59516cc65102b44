"""`vit-inspect sae index` and `sae features` on the real DeiT-Ti with a small random SAE: the JSON checked against
the codes computed here, the labels read from the index beside the SAE, and an index of another SAE noted."""
from __future__ import annotations

import json
import os

import pytest
import torch
from PIL import Image
from support import DEIT_WEIGHTS, IMAGENET, run_cli

from vit_inspect.core.sae_file import SAEInfo, SparseAutoencoder, save_sae
from vit_inspect.core.sae_index import index_bytes, index_path, read_index

pytestmark = pytest.mark.slow

PHOTOS = ("n02123045_tabby.JPEG", "n07920052_espresso.JPEG", "n03888257_parachute.JPEG")


def random_sae(seed: int, features: int = 16) -> SparseAutoencoder:
    torch.manual_seed(seed)
    info = SAEInfo(model="deit_tiny_patch16_224", layer=3, k=4, features=features, width=192)
    return SparseAutoencoder(torch.randn(192, features) / 10, torch.randn(features), torch.randn(features, 192),
                             torch.zeros(192), info, torch.zeros(192), torch.tensor(1.0))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    for name in PHOTOS:
        if not (IMAGENET / name).is_file() or not DEIT_WEIGHTS.is_file():
            pytest.skip("the real weights or photos are absent")
        os.symlink(IMAGENET / name, folder / name)
    sae_path = tmp_path_factory.mktemp("sae") / "random.safetensors"
    save_sae(random_sae(0), sae_path)
    return folder, sae_path


def _codes(sae_path, image):
    """(14, 14, F) codes of the image's patch tokens at block 3, computed here."""
    from vit_inspect.analysis.sae import encode, normalise
    from vit_inspect.core.load import load_model
    from vit_inspect.core.sae_load import load_sae
    from vit_inspect.passes.sae import block_output

    handle = load_model("deit_tiny_patch16_224", weights=str(DEIT_WEIGHTS), device="cpu")
    sae = load_sae(sae_path)
    seen = []
    with torch.no_grad(), block_output(handle, 3, seen.append):
        handle.forward(handle.preprocess.apply(Image.open(image).convert("RGB"))[0])
    tokens = seen[0][0, 1:]  # (196, 192): DeiT-Ti has one class token
    return encode(normalise(tokens, sae), sae.W_enc, sae.b_enc, sae.b_dec, 4).reshape(14, 14, -1)


def test_index_then_features_with_labels(setup, capsys):
    folder, sae_path = setup
    weights = ["--weights", str(DEIT_WEIGHTS), "--device", "cpu"]
    code, stdout, stderr = run_cli(capsys, "sae", "index", str(folder), "--sae", str(sae_path), *weights,
                                   "--index-top", "4", "--index-crop", "16")
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary == {"index": "random.index.safetensors", "features": 16, "top": 4, "crop": 16,
                       "bytes": index_bytes(16, 4, 16, 3), "live_features": summary["live_features"],
                       "images": 3, "patches": 3 * 196}
    index = read_index(index_path(sae_path))
    image = folder / PHOTOS[0]
    code, stdout, stderr = run_cli(capsys, "sae", "features", str(image), "--sae", str(sae_path), *weights,
                                   "--top", "3", "--json")
    assert code == 0, stderr
    record = json.loads(stdout)
    codes = _codes(sae_path, image)
    totals = codes.sum((0, 1))
    expected = [int(f) for f in torch.argsort(-totals)[:3] if totals[f] > 0]
    assert (record["layer"], record["features"], record["patch"], record["index"]) == \
           (3, 16, None, "random.index.safetensors")
    assert [row["feature"] for row in record["top"]] == expected
    for row in record["top"]:
        f = row["feature"]
        assert row["activation"] == pytest.approx(float(totals[f]), rel=1e-4)
        assert row["peak"] == pytest.approx(float(codes[..., f].max()), rel=1e-4)
        assert row["peak_patch"] == list(divmod(int(codes[..., f].argmax()), 14))
        assert row["label"] == index.label(f) and row["label"]
    code, stdout, stderr = run_cli(capsys, "sae", "features", str(image), "--sae", str(sae_path), *weights,
                                   "--patch", "3,4", "--top", "2", "--json")
    at = codes[3, 4]
    assert [row["feature"] for row in json.loads(stdout)["top"]] == [int(f) for f in torch.argsort(-at)[:2]
                                                                     if at[f] > 0]
    assert json.loads(stdout)["top"][0]["activation"] == pytest.approx(float(at.max()), rel=1e-4)


def test_an_index_of_another_sae_is_a_note_and_a_bad_patch_a_sentence(setup, capsys, tmp_path):
    folder, sae_path = setup
    weights = ["--weights", str(DEIT_WEIGHTS), "--device", "cpu"]
    other = tmp_path / "other.safetensors"
    save_sae(random_sae(1), other)
    run_cli(capsys, "sae", "index", str(folder), "--sae", str(sae_path), *weights, "--out",
            str(index_path(other)), "--index-top", "2", "--index-crop", "8")
    code, stdout, stderr = run_cli(capsys, "sae", "features", str(folder / PHOTOS[1]), "--sae", str(other), *weights,
                                   "--json")
    assert code == 0 and "another SAE of the same size" in stderr
    record = json.loads(stdout)
    assert record["index"] is None and all(row["label"] == "" for row in record["top"])
    code, _, stderr = run_cli(capsys, "sae", "features", str(folder / PHOTOS[1]), "--sae", str(other), *weights,
                              "--patch", "14,0")
    assert code == 1 and stderr.strip().splitlines()[-1] == \
        "error: Patch (14, 0) is outside the 14×14 grid (rows and columns count from 0)."
