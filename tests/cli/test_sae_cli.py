"""`vit-inspect sae train` and `sae eval` on the real DeiT-Ti and a few ImageNet photos, on both engines."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from support import IMAGENET, cli_on_both_engines, run_cli, write_folder

from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.sae_index import index_path, read_index
from vit_inspect.core.sae_load import load_sae

PHOTOS = ("n01440764_tench.JPEG", "n01443537_goldfish.JPEG", "n02123045_tabby.JPEG", "n02106662_German_shepherd.JPEG",
          "n07920052_espresso.JPEG", "n03888257_parachute.JPEG")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    for name in PHOTOS:
        if not (IMAGENET / name).is_file():
            pytest.skip(f"{name} not found in {IMAGENET}")
        os.symlink(IMAGENET / name, folder / name)
    return folder


def _train(photos, out, deit_args, *more):
    return ["sae", "train", str(photos), *deit_args, "--layer", "3", "--features", "96", "--k", "4",
            "--epochs", "2", "--holdout", "2", "--out", str(out), *more]


def test_the_held_out_images_are_the_last_by_name_or_a_seeded_draw(tmp_path):
    from argparse import Namespace

    from vit_inspect.cli.sae import _held_out_words, _split

    write_folder(tmp_path, count=10)
    files = sorted(tmp_path.glob("*.png"))
    train, held = _split(Namespace(folder=str(tmp_path), holdout=3, holdout_seed=None))
    assert (train, held) == (files[:7], files[7:])
    assert _held_out_words(Namespace(holdout=3, holdout_seed=None)) == "the last 3 by file name"
    drawn = sorted(np.random.default_rng(4).permutation(10)[:3].tolist())  # by hand: the first 3 of a permutation
    train, held = _split(Namespace(folder=str(tmp_path), holdout=3, holdout_seed=4))
    assert held == [files[i] for i in drawn] and train == [f for i, f in enumerate(files) if i not in drawn]
    assert held != files[7:] and _split(Namespace(folder=str(tmp_path), holdout=3, holdout_seed=4))[1] == held
    assert _held_out_words(Namespace(holdout=3, holdout_seed=4)) == "3 drawn at random with seed 4"
    with pytest.raises(VitInspectError, match="--holdout-seed must be 0 or more"):
        _split(Namespace(folder=str(tmp_path), holdout=3, holdout_seed=-1))


def test_an_out_file_in_a_missing_folder_is_a_sentence_before_any_work(tmp_path, capsys):
    write_folder(tmp_path, count=3)
    missing = tmp_path / "no such folder" / "sae.safetensors"
    code, _, stderr = run_cli(capsys, "sae", "train", str(tmp_path), "--model", "no_such_model_loaded_first",
                              "--layer", "0", "--features", "8", "--k", "2", "--out", str(missing))
    assert code == 1 and len(stderr.strip().splitlines()) == 1
    assert "--out: the folder" in stderr and "does not exist; create it first" in stderr
    code, _, stderr = run_cli(capsys, "sae", "index", str(tmp_path), "--sae", str(tmp_path / "x.safetensors"),
                              "--out", str(missing))
    assert code == 1 and "does not exist; create it first" in stderr


@pytest.mark.parametrize(("flags", "words"), [
    (["--buffer-mib", "nan"], "--buffer-mib must be a positive number of MiB; got nan."),
    (["--buffer-mib", "inf"], "--buffer-mib must be a positive number of MiB; got inf."),
    (["--buffer-mib", "-1"], "--buffer-mib must be a positive number of MiB; got -1."),
    (["--kl-steps", "1", "--kl-images", "4"], "--kl-images (4) is more than the 3 training images."),
])
def test_sizes_out_of_range_are_sentences_before_the_model_loads(tmp_path, capsys, flags, words):
    write_folder(tmp_path, count=3)
    code, _, stderr = run_cli(capsys, "sae", "train", str(tmp_path), "--model", "no_such_model_loaded_first",
                              "--layer", "0", "--features", "8", "--k", "2", "--out",
                              str(tmp_path / "sae.safetensors"), *flags)
    assert code == 1 and stderr.strip() == f"error: {words}"


@pytest.mark.slow
def test_train_then_eval(photos, tmp_path, capsys, deit_args):
    out = tmp_path / "sae.safetensors"
    code, stdout, stderr = run_cli(capsys, *_train(photos, out, deit_args, "--seed", "1", "--kl-steps", "2",
                                                   "--kl-images", "2", "--kl-lr", "2e-4"))
    assert code == 0, stderr
    info = json.loads(stdout)
    tuned = info["training"]["kl_fine_tune"]
    assert (tuned["steps"], tuned["lr"], tuned["images_per_step"], tuned["seed"]) == (2, 2e-4, 2, 1)
    assert "2/2 fine-tune steps" in stderr
    assert (info["layer"], info["k"], info["F"], info["d"], info["tokens"]) == (3, 4, 96, 192, "all")
    assert info["training_tokens"] == 2 * 4 * 197  # 2 epochs over 4 images of 197 tokens
    assert info["training"]["mirrored"] is False and info["training"]["crops"] == 0
    assert info["training"]["prefix_weight"] == 1.0
    assert info["metrics"]["held_out"]["images"] == 2
    assert info["metrics"]["held_out"]["selection"] == "the last 2 by file name"
    index = read_index(index_path(out), load_sae(out))  # built by default, over the training images
    assert index.built_from == {"images": 4, "patches": 4 * 196} and index.features == 96 and index.top == 8
    code, stdout, stderr = run_cli(capsys, "sae", "eval", str(photos), *deit_args, "--sae", str(out), "--holdout", "2",
                                   "--json")
    assert code == 0, stderr
    quality = json.loads(stdout)
    assert quality["images"] == 2 and quality["l0"] <= 4
    for key in ("variance_explained", "dead_fraction", "top1_agreement", "kl"):
        assert quality[key] == pytest.approx(info["metrics"]["held_out"][key], abs=1e-9), key


@pytest.mark.slow
def test_an_sae_for_another_layer_count_or_a_pickle_is_one_line(photos, tmp_path, capsys, deit_args):
    (tmp_path / "prisma.pt").write_bytes(b"\x80\x04K\x01.")
    code, _, stderr = run_cli(capsys, "sae", "eval", str(photos), *deit_args, "--sae", str(tmp_path / "prisma.pt"))
    assert code == 1 and "pickled checkpoint" in stderr and len(stderr.strip().splitlines()) == 1
    code, _, stderr = run_cli(capsys, *_train(photos, tmp_path / "x.safetensors", deit_args)[:-2], "--layer", "12",
                              "--out", str(tmp_path / "x.safetensors"))
    assert code == 1 and "--layer must be a block" in stderr


@pytest.mark.slow
@pytest.mark.ray
def test_ray_trains_the_same_sae(photos, tmp_path, capsys, deit_args):
    """The activation pass on Ray yields the same tokens, mirrored images and seeded crops included; with the same
    batches, the same SAE (the class token weighted by its place in each spilled file)."""
    pytest.importorskip("ray")
    runs = cli_on_both_engines(capsys, lambda engine: _train(photos, tmp_path / f"{engine}.safetensors", deit_args,
                                                              "--engine", engine, "--batch-size", "1",
                                                              "--mirror", "--crops", "1",
                                                              "--prefix-weight", "30"))
    for engine, (code, _, stderr) in runs.items():
        assert code == 0, (engine, stderr)
    local, ray = (json.loads(runs[e][1]) for e in ("local", "ray"))
    assert local["training"]["mirrored"] and ray["training"]["mirrored"]
    assert local["training"]["crops"] == ray["training"]["crops"] == 1
    assert local["training"]["prefix_weight"] == ray["training"]["prefix_weight"] == 30
    assert local["training_tokens"] == ray["training_tokens"] == 2 * 3 * 4 * 197  # 2 epochs, 4 images in 3 views
    assert ray["training"]["epoch_loss"] == pytest.approx(local["training"]["epoch_loss"], rel=1e-4)
    indexes = [read_index(index_path(tmp_path / f"{engine}.safetensors")) for engine in ("local", "ray")]
    assert indexes[0].built_from == indexes[1].built_from == {"images": 4, "patches": 4 * 196}
    live = indexes[0].image[:, 0] >= 0
    assert live.sum() > 0 and np.array_equal(indexes[0].image[:, 0] >= 0, indexes[1].image[:, 0] >= 0)
    assert np.allclose(indexes[0].activation[live, 0], indexes[1].activation[live, 0], rtol=1e-2)
