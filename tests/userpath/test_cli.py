"""The command line on three photos, as a user runs it after the README's install: `vit-inspect analyze`,
`evaluate` (faithfulness over a labelled folder) and `sanity --json` with its robustness metrics, which need captum.
`model` runs in test_documents.py, as the README writes it. Progress goes to stderr a line per update (not a
terminal here), after which stdout holds only the results."""
from __future__ import annotations

import csv
import json
import math
import shutil

import pytest
from support import REPO
from support.user import run

from vit_inspect.studies.faithfulness import METHODS

PHOTOS = {"chelsea.png": 285, "coffee.png": 967, "china.jpg": 698}  # each photo's top class: Egyptian cat,
# espresso, palace


@pytest.fixture
def photos(work):
    folder = work / "photos"
    folder.mkdir()
    for name in PHOTOS:
        shutil.copy(REPO / "assets" / name, folder / name)
    (folder / "labels.csv").write_text("filename,class_index\n" + "".join(f"{n},{c}\n" for n, c in PHOTOS.items()))
    return folder


def progress_lines(total: int, unit: str = "images", prefix: str = "") -> str:
    return "".join(f"{prefix}{done}/{total} {unit}\n" for done in range(1, total + 1))


def test_analyze_three_photos(work, photos):
    done = run(["vit-inspect", "analyze", "photos/", "--out", "out/"], cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == progress_lines(3)
    records = {record["image"]: record for record in map(json.loads, done.stdout.splitlines())}
    assert {image: record["topk"][0]["index"] for image, record in records.items()} == {
        f"photos/{name}": top for name, top in PHOTOS.items()}
    for name in PHOTOS:
        stem = name.rsplit(".", 1)[0]
        assert (work / "out" / f"{stem}_maps.png").stat().st_size > 10_000


def test_evaluate_three_photos(work, photos):
    done = run(["vit-inspect", "evaluate", "photos/", "--labels", "photos/labels.csv", "--out", "out/"], cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == progress_lines(3)
    assert done.stdout.startswith("3 images, clean top-1 100.0 %\n")
    table = json.loads((work / "out" / "table.json").read_text())
    assert table["images"] == 3 and table["skipped"] == []
    scores = [cell[stat] for method in table["methods"].values() for cell in method.values() for stat in ("mean", "se")]
    assert set(table["methods"]) == set(METHODS) and all(math.isfinite(s) for s in scores)
    with open(work / "out" / "per_image.csv") as rows:
        assert {row["image"] for row in csv.DictReader(rows)} == set(PHOTOS)


def test_sanity_json_has_its_robustness_metrics(work, photos):
    done = run(["vit-inspect", "sanity", "photos/chelsea.png", "--json"], cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    passes = done.stderr.count("\n")
    assert passes > 10 and done.stderr == progress_lines(passes, "passes", "chelsea.png: ")
    [record] = [json.loads(line) for line in done.stdout.splitlines()]
    assert record["target"]["index"] == 285 and record["settings"]["robustness"]["sensitivity_samples"] == 10
    for method, entry in record["methods"].items():
        for metric in ("max_sensitivity", "infidelity"):
            assert isinstance(entry[metric], float) and math.isfinite(entry[metric]) and entry[metric] >= 0, \
                (method, metric, entry[metric])
        assert entry["cascading"] and entry["independent"] and entry["random_logit"]["spearman"] is not None
