"""`evaluate` on the engine interface: the accumulator as engine sums, the job on the local engine
(same numbers as the per-image loop, unreadable files skipped and listed, per-image curves written),
and the CLI on both engines printing the same table (Ray: a local Ray of 2 CPUs, DeiT-Ti, shared photos)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from support import DEIT_WEIGHTS, IMAGENET, cli_on_both_engines, tiny_handle, write_folder

from vit_inspect.core.images import find_images
from vit_inspect.jobs.engine import EngineOptions, Sums
from vit_inspect.jobs.evaluate import (
    EvaluateJob,
    EvaluateWorker,
    evaluate_folder,
    read_labels,
    select_files,
)
from vit_inspect.jobs.run import run_job
from vit_inspect.studies.faithfulness import FaithfulnessAccumulator, evaluate_image

METHODS = ("random", "attention", "gradcam")


def test_accumulator_sums_round_trip_and_add_like_merge(tmp_path):
    handle = tiny_handle("cls")
    labels = read_labels(write_folder(tmp_path, 3))
    results = [evaluate_image(handle, p, labels[p.name], METHODS) for p in select_files(str(tmp_path), labels)]
    a, b = FaithfulnessAccumulator(), FaithfulnessAccumulator()
    a.add(results[0])
    for r in results[1:]:
        b.add(r)
    sums = Sums.from_json(json.loads(json.dumps((Sums(*a.state()) + Sums(*b.state())).to_json())))  # as a shard stores it
    merged, back = a.merge(b), FaithfulnessAccumulator.from_state(sums.arrays, sums.count)
    assert back.images == merged.images == 3 and back.correct == merged.correct and back.count == merged.count
    assert back.table() == merged.table()
    hand = np.mean([r.curves["attention"].auc("ins") for r in results])  # the mean by hand
    assert back.table()["attention"]["ins"][0] == pytest.approx(hand, rel=1e-12)
    assert FaithfulnessAccumulator.from_state({}, 0).table() == {}


def test_job_on_the_local_engine_equals_the_loop_skips_and_writes_curves(tmp_path):
    handle = tiny_handle("cls")
    labels = read_labels(write_folder(tmp_path, 3))
    (tmp_path / "broken.png").write_bytes(b"\x89PNG not an image")
    labels["broken.png"] = 1
    files = sorted(select_files(str(tmp_path), labels))
    assert [p.name for p in files] == ["broken.png", "img0.png", "img1.png", "img2.png"]
    loop = evaluate_folder(handle, files[1:], labels, METHODS)
    job = EvaluateJob("unused", None, "cpu", None, tuple(sorted(labels.items())), METHODS,
                      curves_dir=str(tmp_path / "curves"))
    progress = []
    result, info = run_job(job, files, "local", EngineOptions(batch_size=2, shard_size=3),
                           progress=lambda d, t: progress.append(d), worker=EvaluateWorker(handle, job))
    for m in METHODS:
        for c in ("pos", "neg", "del", "ins"):
            assert result.accumulator.table()[m][c] == pytest.approx(loop.table()[m][c], rel=1e-9)
    assert result.accumulator.images == 3 and info.shards == 2 and progress[-1] == 4
    assert [name for name, _ in result.skipped] == ["broken.png"] and "image" in result.skipped[0][1].lower()
    assert not (tmp_path / "curves" / "broken.png.npz").exists()
    expected = evaluate_image(handle, files[2], labels["img1.png"], METHODS)
    with np.load(tmp_path / "curves" / "img1.png.npz") as saved:
        np.testing.assert_allclose(saved["del/gradcam"], expected.curves["gradcam"].deletion, rtol=1e-6)
        assert int(saved["label"]) == 1 and int(saved["target"]) == expected.target
        np.testing.assert_allclose(saved["auc/attention"], list(expected.curves["attention"].aucs().values()))


def _shared_folder(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    all_labels = read_labels(IMAGENET / "labels.csv")
    chosen = [p for p in find_images([IMAGENET]) if p.name in all_labels][::250][:3]
    for path in chosen:
        shutil.copy(path, folder / path.name)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    lines = ["filename,class_index"] + [f"{p.name},{all_labels[p.name]}" for p in chosen] + ["broken.jpg,0"]
    (folder / "labels.csv").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.ray
@pytest.mark.slow
def test_cli_local_and_ray_print_the_same_table(tmp_path, capsys):
    pytest.importorskip("ray", reason="Ray Data is an optional extra: pip install -r requirements-ray.txt")
    if not DEIT_WEIGHTS.is_file():
        pytest.skip(f"real weights not found at {DEIT_WEIGHTS}")
    folder = _shared_folder(tmp_path)
    outputs = cli_on_both_engines(capsys, lambda engine: [
        "evaluate", str(folder), "--labels", str(folder / "labels.csv"), "--methods", "random,attention", "--engine",
        engine, "--images-per-batch", "2", "--shard-size", "2", "--weights", str(DEIT_WEIGHTS), "--device", "cpu",
        "--out", str(tmp_path / engine)])
    assert [code for code, _, _ in outputs.values()] == [0, 0]
    (_, local_out, local_err), (_, ray_out, ray_err) = outputs["local"], outputs["ray"]
    assert local_out == ray_out and local_out.startswith("3 images, clean top-1")
    assert "| attention |" in local_out and "| random |" in local_out
    skipped = [line for line in local_err.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == 1 and skipped[0].startswith("skipped broken.jpg: ")
    assert skipped == [line for line in ray_err.splitlines() if line.startswith("skipped ")]
    tables = {e: json.loads((tmp_path / e / "table.json").read_text()) for e in outputs}
    assert tables["ray"]["skipped"] == tables["local"]["skipped"] == ["broken.jpg"]
    for method, curves in tables["local"]["methods"].items():
        for curve, value in curves.items():
            assert tables["ray"]["methods"][method][curve]["mean"] == pytest.approx(value["mean"], rel=1e-5, abs=1e-9)
    with np.load(tmp_path / "local" / "curves.npz") as a, np.load(tmp_path / "ray" / "curves.npz") as b:
        assert sorted(a.files) == sorted(b.files) and len(a.files) == 3 * 4 * 2
        for key in a.files:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-7)
