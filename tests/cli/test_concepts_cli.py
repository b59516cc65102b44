"""`vit-inspect concepts`: the JSON values, the table, the figure, and one-line errors for untrusted flags."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from support import PHOTOS, run_cli, write_folder

from vit_inspect.core.images import find_images
from vit_inspect.core.load import load_model
from vit_inspect.passes.concepts import image_concepts
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.studies.class_concepts import GALLERY, GALLERY_SIDE, class_concepts

CAT = {"Egyptian cat", "tabby", "tiger cat"}


def test_json_values_equal_the_librarys(capsys, tmp_path, deit_args, deit):
    code, out, err = run_cli(capsys, "concepts", str(PHOTOS / "chelsea.png"), "--layer", "5", "--k", "4", "--json",
                             "--out", str(tmp_path), *deit_args)
    assert code == 0, err
    record = json.loads(out)
    assert set(record) == {"model", "weights", "image", "layer", "k", "seed", "target", "reconstruction_error",
                           "iterations", "concepts"}
    assert (record["model"], record["layer"], record["k"], record["seed"]) == ("deit_tiny_patch16_224", 5, 4, 0)
    assert record["target"]["label"].split(",")[0] in CAT
    assert 0 < record["reconstruction_error"] < 1
    expected = image_concepts(deit, analyze_image(deit, PHOTOS / "chelsea.png", gradients=False, relevance=False),
                              k=4, layer=5)
    assert record["target"]["index"] == expected.target
    entries = record["concepts"]
    assert [e["concept"] for e in entries] == [1, 2, 3, 4]
    assert sum(e["area"] for e in entries) == pytest.approx(1.0)
    np.testing.assert_allclose([e["class_logit"] for e in entries], expected.class_logits(), rtol=1e-5)
    assert [e["class_logit"] for e in entries] == sorted((e["class_logit"] for e in entries), reverse=True)
    np.testing.assert_allclose([e["class_probability"] for e in entries], expected.class_probabilities(), rtol=1e-5)
    for entry, heatmap, logits in zip(entries, expected.heatmaps, expected.logits):
        np.testing.assert_allclose(entry["heatmap"], heatmap, atol=1e-6)
        assert [top["index"] for top in entry["top"]] == list(np.argsort(-logits)[:2])
    assert (tmp_path / "chelsea_concepts_block5.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_table_has_a_row_per_concept(capsys, deit_args):
    code, out, _ = run_cli(capsys, "concepts", str(PHOTOS / "coffee.png"), "--k", "3", "--target", "967", *deit_args)
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("deit_tiny_patch16_224 · coffee.png · block 11 · k=3 · class espresso (#967)")
    assert len(lines) == 3 + 3 and all(line.startswith(f"| {j} |") for j, line in enumerate(lines[3:], 1))


@pytest.mark.parametrize("flags, message", [
    (["--k", "0"], "number of concepts must be a whole number from 1 to 20, not 0"),
    (["--k", "500"], "from 1 to 20, not 500"),
    (["--layer", "12"], "Block 12 does not exist: this model has blocks 0 to 11"),
    (["--target", "1000"], "Class 1000 does not exist: the model has classes 0 to 999"),
])
def test_out_of_range_flags_are_one_line(capsys, deit_args, flags, message):
    code, out, err = run_cli(capsys, "concepts", str(PHOTOS / "chelsea.png"), *flags, *deit_args)
    assert code == 1 and out == "" and message in err and err.count("\n") == 1


def test_a_folders_class_concepts_in_json_equal_the_librarys(capsys, tmp_path, tiny_weights):
    write_folder(tmp_path, count=3)
    model = ["--model", "test_vit", "--weights", str(tiny_weights), "--device", "cpu"]
    code, out, err = run_cli(capsys, "concepts", str(tmp_path), "--class", "3", "--k", "3", "--crops", "2", "--json",
                             "--out", str(tmp_path / "out"), *model)
    assert code == 0, err
    record = json.loads(out)
    handle = load_model("test_vit", weights=tiny_weights, device="cpu")
    expected = class_concepts(handle, find_images([tmp_path]), 3, k=3, crops=2)
    assert (record["layer"], record["k"], record["crops"], record["images"]) == (handle.depth - 2, 3, 6, 3)
    assert record["target"]["index"] == 3 and record["importance_images"] == ["img0.png", "img1.png", "img2.png"]
    np.testing.assert_allclose([e["importance"] for e in record["concepts"]], expected.importance, rtol=1e-6)
    np.testing.assert_allclose([e["logit_drop"] for e in record["concepts"]], expected.logit_drop, rtol=1e-6)
    assert record["class_logit_model"] == pytest.approx(expected.logit_model)
    assert record["residual_kept"] is True  # the rebuilt patches keep the residual: the model's own logit at M = 1
    assert record["class_logit_rebuilt"] == pytest.approx(expected.logit_model, abs=1e-4)
    first = record["concepts"][0]["top_crops"][0]
    best = int(np.argmax(expected.crop_coefficients[:, 0]))
    assert [first[key] for key in ("top", "left", "side")] == expected.crop_boxes[best, 1:].tolist()
    assert first["image"] == expected.images[expected.crop_boxes[best, 0]]
    grid = np.asarray(Image.open(tmp_path / "out" / f"{tmp_path.name}_class3_concepts_block4.png"))
    assert grid.shape == (3 * GALLERY_SIDE, GALLERY * GALLERY_SIDE, 3)  # a row of top crops per concept
    np.testing.assert_array_equal(grid[:GALLERY_SIDE, GALLERY_SIDE:2 * GALLERY_SIDE], expected.galleries[0, 1])
    code, out, _ = run_cli(capsys, "concepts", str(tmp_path), "--class", "3", "--k", "3", "--crops", "2", *model)
    lines = out.strip().splitlines()
    assert code == 0 and "3 images of class" in lines[0] and len(lines) == 3 + 3


@pytest.mark.parametrize("flags, message", [
    ([], "say which class its images are of with --class C"),
    (["--class", "3", "--crops", "0"], "crops per image must be a whole number from 1 to 64, not 0"),
    (["--class", "3", "--k", "7"], "number of concepts must be a whole number from 1 to 6, not 7"),
    (["--class", "1000"], "Class 1000 does not exist"),
])
def test_a_folders_out_of_range_flags_are_one_line(capsys, tmp_path, tiny_weights, flags, message):
    write_folder(tmp_path, count=3)
    code, out, err = run_cli(capsys, "concepts", str(tmp_path), "--crops", "2", *flags, "--model", "test_vit",
                             "--weights", str(tiny_weights), "--device", "cpu")
    assert code == 1 and out == "" and message in err and err.count("\n") == 1


def test_an_empty_folder_is_one_line(capsys, tmp_path):
    code, _out, err = run_cli(capsys, "concepts", str(tmp_path), "--class", "1")
    assert code == 1 and "holds no image files" in err and err.count("\n") == 1
