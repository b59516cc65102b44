"""`vit-inspect evaluate`: labels, file selection, the folder loop, the table and the written files."""
from __future__ import annotations

import json

import numpy as np
import pytest
from support import DEIT_WEIGHTS, IMAGENET, tiny_handle, write_folder

from vit_inspect.core.errors import VitInspectError
from vit_inspect.jobs.evaluate import (
    evaluate_folder,
    format_table,
    read_labels,
    select_files,
)
from vit_inspect.studies.faithfulness import evaluate_image


def test_labels_and_selection(tmp_path):
    labels = read_labels(write_folder(tmp_path, 5))
    assert labels == {f"img{i}.png": i for i in range(5)}
    assert [p.name for p in select_files(str(tmp_path), labels, every=2, limit=2)] == ["img0.png", "img2.png"]
    bad = tmp_path / "bad.csv"
    bad.write_text("filename,class_index\nimg0.png,cat\n")
    with pytest.raises(VitInspectError, match="line 2"):
        read_labels(bad)
    bad.write_text("name,label\n")
    with pytest.raises(VitInspectError, match="header"):
        read_labels(bad)


def test_folder_loop_equals_per_image_results_and_the_table(tmp_path):
    handle = tiny_handle("cls")
    labels = read_labels(write_folder(tmp_path, 3))
    files = select_files(str(tmp_path), labels)
    methods = ("random", "gradcam", "attnlrp", "legrad")
    seen = []
    accumulator = evaluate_folder(handle, files, labels, methods, on_image=lambda p, r: seen.append((p.name, r)))
    assert accumulator.images == 3 and set(accumulator.table()) == set(methods)
    again = evaluate_image(handle, files[1], labels["img1.png"], methods)  # deterministic: seeded by the pixels
    assert again.aucs() == seen[1][1].aucs()
    mean_del = np.mean([r.curves["gradcam"].auc("del") for _, r in seen])
    assert accumulator.table()["gradcam"]["del"][0] == pytest.approx(mean_del)
    text = format_table(accumulator.table(), accumulator.images, accumulator.correct)
    assert text.splitlines()[1] == "| method | pos ↓ | neg ↑ | del ↓ | ins ↑ |" and "| attnlrp |" in text


@pytest.mark.slow
def test_cli_writes_table_and_curves(tmp_path, capsys):
    if not DEIT_WEIGHTS.is_file():
        pytest.skip("real weights not available")
    from vit_inspect.cli.main import main

    code = main(["evaluate", str(IMAGENET), "--labels", str(IMAGENET / "labels.csv"), "--methods", "random,attnlrp",
                 "--limit", "1", "--every", "5", "--weights", str(DEIT_WEIGHTS), "--device", "cpu",
                 "--out", str(tmp_path)])
    assert code == 0
    assert "| attnlrp |" in capsys.readouterr().out
    record = json.loads((tmp_path / "table.json").read_text())
    assert record["images"] == 1 and set(record["methods"]) == {"random", "attnlrp"}
    curves = np.load(tmp_path / "curves.npz")
    assert curves["n01440764_tench/del/attnlrp"].shape == (11,) and curves["n01440764_tench/pos/random"].shape == (10,)
    assert (tmp_path / "table.csv").read_text().startswith("method,pos_mean,pos_se")


def test_table_says_when_there_is_no_standard_error():
    from vit_inspect.analysis.faithfulness import CURVES
    from vit_inspect.jobs.evaluate import format_table

    one = {c: (0.25, float("nan")) for c in CURVES}
    two = {c: (12.0, 0.5) for c in CURVES}
    text = format_table({"random": one, "attnlrp": two}, images=1, correct=1)
    assert text.startswith("1 image, clean top-1 100.0 %")
    assert "nan" not in text and "0.250 (s.e. needs 2 images)" in text and "25.0" not in text
    assert "12.000 ± 0.500" in text and "12.0 ± 0.5" in text  # del/ins with 3 digits, pos/neg with 1
