"""`evaluate --sanity` on the engine interface: the accumulator as engine sums (NaN left out, counted), the
job on the local engine equal to the per-image loop, the table's files, and the local and Ray engines giving
the same numbers (Ray: a local Ray of 2 CPUs, DeiT-Ti, shared photos)."""
from __future__ import annotations

import csv
import json
import math
import shutil

import numpy as np
import pytest
from support import DEIT_WEIGHTS, IMAGENET, cli_on_both_engines, tiny_handle, write_folder

from vit_inspect.core.images import find_images
from vit_inspect.jobs.engine import EngineOptions, Sums
from vit_inspect.jobs.run import run_job
from vit_inspect.jobs.sanity import (FolderSanity, SanityJob, SanityWorker, format_sanity_table, format_steps_table,
                                    table_record)
from vit_inspect.studies.sanity import (ImageSanity, SanityAccumulator, SanitySettings, Similarity, sanity_check,
                                        steps_of)

METHODS = ("attention", "gradcam")
SETTINGS = SanitySettings(robustness=None)


def _fake(spearmans: list[float], logit: float) -> ImageSanity:
    """One image's result with hand-set numbers (SSIM and overlap derived from the Spearman)."""
    steps = tuple(Similarity(s, s / 2, 0.5) for s in spearmans)
    return ImageSanity(target=0, random_class=1, steps=steps_of(1), cascading={"m": steps},
                       independent={"m": steps[1:2]}, random_logit={"m": Similarity(logit, 0.0, 1.0)}, maps={},
                       max_sensitivity={"m": 0.25}, infidelity={})


def test_accumulator_by_hand_with_an_undefined_value():
    accumulator = SanityAccumulator()
    accumulator.add(_fake([1.0, 0.6, 0.2], 0.5))
    accumulator.add(_fake([1.0, 0.2, math.nan], 0.1))  # the last step's map was constant: no Spearman
    accumulator.add(_fake([1.0, 0.4, 0.8], 0.3))
    table = accumulator.table()
    mean, se, n = table["cascading"]["m"]
    assert mean.shape == (3, 3) and n[:, 0].tolist() == [3, 3, 2] and n[:, 1].tolist() == [3, 3, 2]
    assert mean[1, 0] == pytest.approx(0.4) and se[1, 0] == pytest.approx(0.2 / math.sqrt(3))  # sd of .6 .2 .4
    assert mean[2, 0] == pytest.approx(0.5) and se[2, 0] == pytest.approx(0.3)  # (.2 + .8) / 2, sd .424 / sqrt 2
    assert se[0, 0] == 0.0
    assert table["random_logit"]["m"][0][0] == pytest.approx(0.3)
    assert table["max_sensitivity"]["m"][0][0] == pytest.approx(0.25)
    assert "infidelity" not in table
    passes = table["passes"]["m"]  # .2 < .5 passes, NaN undefined, .8 fails
    assert passes[0][0] == pytest.approx(0.5) and passes[2][0] == 2
    arrays, images = accumulator.state()
    back = SanityAccumulator.from_state(Sums.from_json(json.loads(json.dumps(Sums(arrays, images).to_json()))).arrays,
                                        images)
    assert back.images == 3
    np.testing.assert_array_equal(back.table()["cascading"]["m"][0], mean)


def test_tables_by_hand():
    accumulator = SanityAccumulator()
    for spearmans, logit in (([1.0, 0.6, 0.2], 0.5), ([1.0, 0.2, 0.4], 0.1)):
        accumulator.add(_fake(spearmans, logit))
    record = table_record(FolderSanity(accumulator, (), depth=1))
    assert record["methods"]["m"]["max_sensitivity"] == {"mean": 0.25, "se": 0.0, "n": 2}
    summary = format_sanity_table(record).splitlines()
    assert summary[0].startswith("2 images;") and "| max-sensitivity | infidelity |" in summary[1]
    # every layer random: Spearman (.2 + .4) / 2 = .3, s.e. = sd .1414 / sqrt 2 = .1; SSIM half of it; both pass
    assert summary[3] == ("| m | 0.30 ± 0.10 | 0.15 ± 0.05 | 0.50 ± 0.00 | 0.30 ± 0.20 | 0.00 ± 0.00 | 1.00 ± 0.00 "
                          "| 0.25 ± 0 | – | 100 % |")
    steps = format_steps_table(record).splitlines()
    assert steps[0] == "| method | trained | from 0 | + embedding |"
    assert steps[2] == "| m | 1.00 ± 0.00 | 0.40 ± 0.20 | 0.30 ± 0.10 |"
    assert format_steps_table(record, "ssim").splitlines()[2] == "| m | 0.50 ± 0.00 | 0.20 ± 0.10 | 0.15 ± 0.05 |"
    with pytest.raises(ValueError, match="unknown similarity"):
        format_steps_table(record, "pearson")


def test_sums_of_two_halves_equal_one_accumulator():
    results = [_fake([1.0, 0.1 * i, 0.05 * i], 0.1) for i in range(5)]
    whole, first, second = SanityAccumulator(), SanityAccumulator(), SanityAccumulator()
    for i, result in enumerate(results):
        whole.add(result)
        (first if i < 2 else second).add(result)
    sums = Sums(*first.state()) + Sums(*second.state())
    merged = SanityAccumulator.from_state(sums.arrays, sums.count).table()
    for kind, methods in whole.table().items():
        for array, expected in zip(merged[kind]["m"], methods["m"]):
            np.testing.assert_allclose(array, expected, rtol=1e-12)


def test_job_on_the_local_engine_equals_the_loop(tmp_path):
    handle = tiny_handle("cls")
    write_folder(tmp_path, 3)
    (tmp_path / "broken.png").write_bytes(b"\x89PNG not an image")
    files = sorted(find_images([tmp_path]))
    job = SanityJob("unused", None, "cpu", None, METHODS, handle.depth, SETTINGS)
    result, info = run_job(job, files, "local", EngineOptions(batch_size=2, shard_size=2),
                           worker=SanityWorker(handle, job))
    assert isinstance(result, FolderSanity) and result.accumulator.images == 3 and info.shards == 2
    assert [name for name, _ in result.skipped] == ["broken.png"]
    loop = SanityAccumulator()
    for path in files[1:]:
        loop.add(sanity_check(handle, path, METHODS, settings=SETTINGS))
    for kind, methods in loop.table().items():
        for method, arrays in methods.items():
            for got, expected in zip(result.accumulator.table()[kind][method], arrays):
                np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12, equal_nan=True)
    record = table_record(result)
    assert [e["randomised_from_block"] for e in record["methods"]["gradcam"]["cascading"]] == [None, 1, 0,
                                                                                                "embedding"]
    assert record["methods"]["gradcam"]["cascading"][0]["spearman"] == {"mean": 1.0, "se": 0.0, "n": 3}
    assert [e["block"] for e in record["methods"]["attention"]["independent"]] == [0, 1]
    text = format_sanity_table(record)
    assert text.startswith("3 images;") and "| gradcam |" in text and "| attention |" in text


def _shared_folder(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for path in sorted(find_images([IMAGENET]))[::500][:2]:
        shutil.copy(path, folder / path.name)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    return folder


@pytest.mark.ray
@pytest.mark.slow
def test_cli_local_and_ray_give_the_same_numbers(tmp_path, capsys):
    pytest.importorskip("ray", reason="Ray Data is an optional extra: pip install -r requirements-ray.txt")
    if not DEIT_WEIGHTS.is_file():
        pytest.skip(f"real weights not found at {DEIT_WEIGHTS}")
    folder = _shared_folder(tmp_path)
    outputs = cli_on_both_engines(capsys, lambda engine: [
        "evaluate", str(folder), "--sanity", "--methods", "attention,gradcam", "--no-independent", "--robustness",
        "--samples", "2", "--removals", "4", "--engine", engine,
        "--images-per-batch", "1", "--shard-size", "1", "--weights", str(DEIT_WEIGHTS), "--device", "cpu",
        "--out", str(tmp_path / engine)])
    assert [code for code, _, _ in outputs.values()] == [0, 0]
    assert outputs["local"][1] == outputs["ray"][1] and outputs["local"][1].startswith("2 images;")
    tables = {e: json.loads((tmp_path / e / "sanity.json").read_text()) for e in outputs}
    assert tables["ray"]["skipped"] == tables["local"]["skipped"] == ["broken.jpg"]
    for method, entry in tables["local"]["methods"].items():
        other = tables["ray"]["methods"][method]
        for step, step_ray in zip(entry["cascading"], other["cascading"]):
            for name in ("spearman", "ssim", "top10_overlap"):
                assert step_ray[name]["mean"] == pytest.approx(step[name]["mean"], abs=1e-9)
        assert other["random_logit"] == entry["random_logit"]
        for kind in ("max_sensitivity", "infidelity"):
            # the table keeps 6 decimals; a Ray worker's BLAS threads may move the float32 sums across a rounding
            # step, so one unit of the last decimal is allowed (seen: 0.045329 against 0.04533)
            assert entry[kind]["n"] == 2
            assert other[kind]["mean"] == pytest.approx(entry[kind]["mean"], rel=1e-9, abs=1.01e-6)
    assert tables["local"]["settings"]["robustness"] == {"radius": 0.02, "sensitivity_samples": 2,
                                                         "infidelity_samples": 4, "removal_probability": 0.1,
                                                         "batch_size": 8, "seed": 0}
    with (tmp_path / "local" / "sanity.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["test"] for r in rows} == {"cascading", "random_logit", "max_sensitivity", "infidelity",
                                       "passes_randomisation"}
    assert len([r for r in rows if r["method"] == "gradcam" and r["test"] == "cascading"]) == 14
