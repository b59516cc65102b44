"""`vit-inspect sanity`: the JSON record exactly as specified, the table, the figures, one-line errors."""
from __future__ import annotations

import json

import pytest
from support import PHOTOS, run_cli

SIMILARITY_KEYS = {"spearman", "ssim", "top10_overlap"}


@pytest.mark.slow
def test_json_record_without_the_optional_tests(capsys, deit_args):
    code, out, _ = run_cli(capsys, "sanity", str(PHOTOS / "chelsea.png"), "--methods", "gradcam", "--json",
                        "--target", "285", "--random-class", "281", "--no-independent", "--no-robustness", *deit_args)
    assert code == 0
    record = json.loads(out)
    assert record["target"] == {"index": 285, "label": "Egyptian cat"}
    assert record["random_class"] == {"index": 281, "label": "tabby, tabby cat"}
    assert record["settings"]["robustness"] is None and record["settings"]["pass_threshold"] == 0.5
    gradcam = record["methods"]["gradcam"]
    assert [s["randomised_from_block"] for s in gradcam["cascading"]] == [None, *range(11, -1, -1), "embedding"]
    assert gradcam["cascading"][0] == {"randomised_from_block": None, "spearman": 1.0, "ssim": 1.0,
                                       "top10_overlap": 1.0}
    assert gradcam["independent"] == [] and gradcam["max_sensitivity"] is None and gradcam["infidelity"] is None
    assert set(gradcam["random_logit"]) == SIMILARITY_KEYS
    assert gradcam["passes_randomisation"] is (gradcam["cascading"][-1]["spearman"] < 0.5)


@pytest.mark.slow
def test_full_record_table_and_figures(capsys, tmp_path, deit_args):
    image = str(PHOTOS / "coffee.png")
    code, out, err = run_cli(capsys, "sanity", image, "--methods", "attention,gradcam", "--json", "--samples", "3",
                          "--removals", "8", "--out", str(tmp_path), *deit_args)
    assert code == 0 and "passes" in err
    record = json.loads(out)
    assert set(record) == {"image", "model", "weights", "target", "random_class", "settings", "methods", "left_out"}
    assert record["left_out"] == {}  # every method gave a map: none left out of the checks
    assert record["target"]["label"] == "espresso" and record["random_class"]["index"] != record["target"]["index"]
    assert record["settings"]["robustness"]["sensitivity_samples"] == 3
    for method in ("attention", "gradcam"):
        entry = record["methods"][method]
        assert set(entry) == {"cascading", "independent", "random_logit", "max_sensitivity", "infidelity",
                              "passes_randomisation"}
        assert len(entry["cascading"]) == 14
        assert [s["block"] for s in entry["independent"]] == list(range(12))
        assert all(set(s) == SIMILARITY_KEYS | {"block"} for s in entry["independent"])
        assert entry["max_sensitivity"] >= 0 and entry["infidelity"] >= 0
    assert record["methods"]["attention"]["random_logit"] == {"spearman": 1.0, "ssim": 1.0, "top10_overlap": 1.0}
    assert (tmp_path / "coffee_cascading.png").stat().st_size > 10_000
    assert (tmp_path / "coffee_similarity.png").stat().st_size > 10_000
    code, table, _ = run_cli(capsys, "sanity", image, "--methods", "attention", "--no-independent", "--no-robustness",
                          *deit_args)
    assert code == 0 and table.startswith("coffee.png: espresso (class 967), random logit: ")
    assert "| attention |" in table and table.count("\n| ") == 3  # header, rule, one method


def test_errors_are_one_line(capsys, deit_args):
    code, out, err = run_cli(capsys, "sanity", str(PHOTOS / "chelsea.png"), "--methods", "gradcam,edges", *deit_args)
    assert code == 1 and out == "" and err.startswith("error: Unknown method(s) edges") and err.count("\n") == 1
    code, _, err = run_cli(capsys, "sanity", str(PHOTOS / "chelsea.png"), "--methods", "gradcam", "--target", "285",
                        "--random-class", "285", "--no-independent", "--no-robustness", *deit_args)
    # the error is one line of its own, after the progress lines (one per update when stderr is not a terminal)
    *progress, last = err.splitlines()
    assert code == 1 and last.startswith("error: ") and "another class" in last and err.endswith("\n")
    assert all(line.endswith(" passes") and "error" not in line for line in progress)
    code, _, err = run_cli(capsys, "sanity", str(PHOTOS / "chelsea.png"), "--radius", "0", *deit_args)
    assert code == 1 and err.startswith("error: --radius, --samples or --removals: the radius must be > 0")
    assert err.count("\n") == 1
