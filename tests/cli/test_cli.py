"""The command line: JSON keys and shapes, figures, clear one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from safetensors.torch import save_file
from support import IMAGENET, PHOTOS, REPO, make_tiny_timm, run_cli

from vit_inspect.methods import methods

pytestmark = pytest.mark.slow  # each test runs whole commands: tens of seconds

ANALYZE_KEYS = {"image", "model", "weights", "input_geometry", "target", "contrast", "score", "input_size", "patch_size",
                "grid", "num_prefix_tokens", "topk", "mean_attention_distance", "rollout", "gradcam", "chefer",
                "legrad", "attnlrp"} | {name for name, m in methods().items() if m.record}  # and installed plugins'


def test_analyze_chelsea_json_and_figures(capsys, tmp_path, deit_args):
    code, out, _ = run_cli(capsys, "analyze", str(PHOTOS / "chelsea.png"), "--out", str(tmp_path), *deit_args)
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert set(record) == ANALYZE_KEYS
    assert record["input_size"] == [224, 224] and record["patch_size"] == [16, 16]
    assert record["grid"] == [14, 14] and record["num_prefix_tokens"] == 1
    assert len(record["topk"]) == 5 and set(record["topk"][0]) == {"index", "label", "prob"}
    assert record["topk"][0]["label"].split(",")[0] in {"Egyptian cat", "tabby", "tiger cat"}
    assert record["target"] == {"index": record["topk"][0]["index"], "label": record["topk"][0]["label"]}
    assert record["contrast"] is None and record["input_geometry"] == "crop"
    assert np.array(record["mean_attention_distance"]).shape == (12, 3)
    for key in ("rollout", "gradcam", "chefer", "legrad", "attnlrp"):
        assert np.array(record[key]).shape == (14, 14), key
    assert abs(np.sum(record["rollout"]) - 1) < 0.2  # class row of a row-stochastic matrix, minus prefix keys
    for name in ("chelsea_maps.png", "chelsea_distance.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_analyze_without_relevance(capsys, deit_args):
    code, out, _ = run_cli(capsys, "analyze", str(PHOTOS / "chelsea.png"), "--no-relevance", *deit_args)
    fast = json.loads(out)
    code_full, out_full, _ = run_cli(capsys, "analyze", str(PHOTOS / "chelsea.png"), *deit_args)
    full = json.loads(out_full)
    assert code == code_full == 0 and set(fast) == ANALYZE_KEYS
    assert fast["legrad"] is None and fast["attnlrp"] is None and np.array(full["attnlrp"]).shape == (14, 14)
    assert {k: v for k, v in fast.items() if k not in ("legrad", "attnlrp")} == \
        {k: v for k, v in full.items() if k not in ("legrad", "attnlrp")}


def test_analyze_target_and_nonsquare(capsys, deit_args):
    code, out, _ = run_cli(capsys, "analyze", str(PHOTOS / "coffee.png"), "--target", "967", "--input-size", "224x320",
                        *deit_args)
    record = json.loads(out)
    assert code == 0 and record["grid"] == [14, 20] and np.array(record["chefer"]).shape == (14, 20)


def test_model_command_with_images(capsys, tmp_path, deit_args):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for path in sorted(IMAGENET.glob("*.JPEG"))[:4]:
        (folder / path.name).write_bytes(path.read_bytes())
    code, out, err = run_cli(capsys, "model", "--images", str(folder), "--out", str(tmp_path), *deit_args)
    assert code == 0
    record = json.loads(out)
    assert np.array(record["filter_pca"]["components"]).shape == (28, 16, 16, 3)
    assert len(record["filter_pca"]["explained_variance_ratio"]) == 28
    assert np.array(record["pos_embed_similarity"]).shape == (14, 14, 14, 14)
    assert np.array(record["dataset_mean_attention_distance"]).shape == (12, 3) and record["num_images"] == 4
    assert "4/4 images" in err
    for name in ("filter_pca.png", "pos_embed_similarity.png", "mean_attention_distance.png"):
        assert (tmp_path / name).is_file()


def test_model_figures_name_the_model(tmp_path, deit_args, monkeypatch):
    from vit_inspect.cli import main
    from vit_inspect.plots import distance as distance_plots
    from vit_inspect.plots import model as model_plots

    titles = []
    for module, name in ((model_plots, "filter_pca_figure"), (model_plots, "pos_similarity_figure"),
                         (distance_plots, "attention_distance_figure")):
        real = getattr(module, name)

        def spy(*args, _real=real, **kwargs):
            fig = _real(*args, **kwargs)
            titles.append(fig.get_suptitle() or " ".join(ax.get_title() for ax in fig.axes if ax.get_title()))
            return fig
        monkeypatch.setattr(module, name, spy)
    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "chelsea.png").write_bytes((PHOTOS / "chelsea.png").read_bytes())
    assert main.main(["model", "--images", str(folder), "--out", str(tmp_path), *deit_args]) == 0
    assert titles == ["deit_tiny_patch16_224\nRGB embedding filters (first 28 principal components)",
                      "deit_tiny_patch16_224: position embedding similarity, 14×14 grid",
                      "mean attention distance: deit_tiny_patch16_224, over 1 image"]


def test_tiny_model_from_weights_file(capsys, tmp_path):
    path = tmp_path / "tiny.safetensors"
    save_file(make_tiny_timm("cls").state_dict(), str(path))
    code, out, err = run_cli(capsys, "analyze", str(PHOTOS / "rocket.jpg"), "--model", "deit_tiny_patch16_224",
                          "--weights", str(path))
    assert code == 1 and out == ""
    assert err.startswith("error: The weights in 'tiny.safetensors' do not fit") and err.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["analyze", "missing.png", "--model", "no_such_model"], "Unknown model 'no_such_model'"),
    (["analyze", "nothing_here/", "--model", "deit_tiny_patch16_224", "--weights", "nope.safetensors"],
     "No weights file"),
])
def test_errors_are_one_line(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 1 and out == "" and message in err and err.count("\n") == 1


def test_bad_image_is_one_line(capsys, tmp_path, deit_args):
    bad = tmp_path / "bad.jpg"
    bad.write_text("<html></html>")
    code, out, err = run_cli(capsys, "analyze", str(bad), *deit_args)
    assert code == 1 and "not an image format" in err and err.count("\n") == 1


def test_a_tiny_image_is_analysed_with_one_warning_line(capsys, tmp_path, deit_args):
    """5x5 pixels against DeiT's 16-pixel patches: analysed (a JSON line), and one "warning:" line on stderr for
    each such image (the same sentence twice: every one is said), and none for the large one."""
    Image.new("RGB", (5, 5), (200, 30, 30)).save(tmp_path / "tiny.png")
    Image.new("RGB", (5, 5), (30, 200, 30)).save(tmp_path / "tiny2.png")
    code, out, err = run_cli(capsys, "analyze", str(tmp_path / "tiny.png"), str(tmp_path / "tiny2.png"),
                             str(PHOTOS / "chelsea.png"), *deit_args)
    assert code == 0 and len(out.splitlines()) == 3
    assert err.count("warning: ") == 2 and err.count(
        "warning: This image is 5×5 pixels, under 4 of the model's 16×16-pixel patches on a side (64 pixels): the "
        "model sees it enlarged, as a blur, so its predictions and maps say little about the picture. Use a larger "
        "image where you have one.\n") == 2


def test_python_dash_m_entry_point():
    done = subprocess.run([sys.executable, "-m", "vit_inspect", "--help"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and "analyze" in done.stdout and "model" in done.stdout


def test_analyze_target_contrast_and_geometry_are_recorded(capsys, deit_args):
    code, out, _ = run_cli(capsys, "analyze", str(PHOTOS / "chelsea.png"), "--target", "285", "--contrast", "281",
                        "--geometry", "keep", "--shorter-side", "112", *deit_args)
    assert code == 0
    record = json.loads(out.strip().splitlines()[0])
    assert record["target"] == {"index": 285, "label": "Egyptian cat"}
    assert record["contrast"] == {"index": 281, "label": "tabby, tabby cat"}
    assert record["input_geometry"] == "keep" and record["grid"] == [7, 11]  # chelsea is 451x300: 112x176 pixels


@pytest.mark.parametrize("extra, message", [
    (["--input-size", "230x230"], "not a whole number of 16x16 patches"),
    (["--input-size=4000x4000"], "gives 62501 tokens, whose attention maps (12 layers x 3 heads x 62501^2 x 4 bytes"),
    (["--input-size", "224x320", "--geometry", "keep"], "cannot be combined with the 'keep' geometry"),
    (["--shorter-side", "300"], "--shorter-side applies only with --geometry keep"),
    (["--shorter-side", "300", "--geometry", "squash"], "--shorter-side applies only with --geometry keep"),
])
def test_sizes_the_model_cannot_take_are_one_line(capsys, extra, message, deit_args):
    # before this check timm stopped with an AssertionError, and 4000x4000 asked the allocator for 47 GB at once
    code, out, err = run_cli(capsys, "analyze", str(PHOTOS / "chelsea.png"), *extra, *deit_args)
    assert code == 1 and out == "" and message in err and err.count("\n") == 1


def test_input_size_with_squash_is_honoured(capsys, deit_args):
    code, out, _ = run_cli(capsys, "analyze", str(PHOTOS / "chelsea.png"), "--input-size", "224x320",
                        "--geometry", "squash", "--no-relevance", *deit_args)
    record = json.loads(out)
    assert code == 0 and record["input_geometry"] == "squash" and record["input_size"] == [224, 320]
    assert record["grid"] == [14, 20]


def test_figure_stems_never_repeat():
    from pathlib import Path

    from vit_inspect.cli.common import figure_stems

    files = [Path("a/chelsea.png"), Path("b/chelsea.png"), Path("b/chelsea_2.jpg"), Path("c/chelsea.jpg"), Path("x.png")]
    # the third file's own stem is taken by the second's renaming, so it moves on to _2's next free number
    assert figure_stems(files) == ["chelsea", "chelsea_2", "chelsea_2_2", "chelsea_3", "x"]


def test_two_images_with_one_stem_keep_both_figures(capsys, tmp_path, deit_args):
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "chelsea.png").write_bytes((PHOTOS / "coffee.png").read_bytes())
    code, out, _ = run_cli(capsys, "analyze", str(PHOTOS / "chelsea.png"), str(other / "chelsea.png"), "--no-relevance",
                        "--out", str(tmp_path / "out"), *deit_args)
    labels = [json.loads(line)["target"]["label"] for line in out.strip().splitlines()]
    assert code == 0 and labels[0] == "Egyptian cat" and labels[1].startswith("espresso")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "chelsea_2_distance.png", "chelsea_2_maps.png", "chelsea_distance.png", "chelsea_maps.png"]
