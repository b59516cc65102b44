"""`vit-inspect heads`: JSON keys, consistency between its parts, clear one-line errors (real DeiT-Ti)."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from support import PHOTOS, run_cli

pytestmark = pytest.mark.slow  # each test runs whole commands: tens of seconds


def test_heads_everything_on_chelsea(capsys, tmp_path, deit_args):
    code, out, err = run_cli(capsys, "heads", str(PHOTOS / "chelsea.png"), "--ablate", "3:1,5:0", "--importance",
                          "--lens", "--out", str(tmp_path), *deit_args)
    assert code == 0, err
    record = json.loads(out)
    assert {"statistics", "ablation", "importance", "lens"} <= set(record)
    stats = record["statistics"]
    assert np.array(stats["attention_entropy_nats"]).shape == (12, 3)
    assert stats["max_entropy_nats"] == pytest.approx(math.log(197), abs=1e-4)
    assert np.all(np.array(stats["attention_entropy_nats"]) <= math.log(197) + 1e-3)
    assert np.array(stats["token_norms_last_block"]["patches"]).shape == (14, 14)
    ablation, importance = record["ablation"], record["importance"]
    assert ablation["heads"] == [[3, 1], [5, 0]] and ablation["mode"] == "zero"
    assert ablation["logit_before"] == pytest.approx(importance["logit"], abs=1e-3)
    assert ablation["delta_logit"] == pytest.approx(ablation["logit_after"] - ablation["logit_before"], abs=1e-4)
    assert ablation["top_before"][0]["label"] == record["target_label"]
    drops = np.array(importance["logit_drop"])
    assert drops.shape == (12, 3) and np.abs(drops).max() > 0.05
    lens = record["lens"]
    last = lens["readout"]["layers"][-1]
    assert last["rank"] == 1 and last["top"][0]["index"] == record["target"] == lens["final_class"]
    assert last["prob"] == pytest.approx(record["topk"][0]["prob"], abs=1e-4)
    ranks, settled = [layer["rank"] for layer in lens["readout"]["layers"]], lens["readout"]["settled_at_block"]
    assert set(ranks[settled:]) == {1} and (settled == 0 or ranks[settled - 1] != 1)  # a 0-based block
    assert "head importance: 37/37 rows" in err
    figures = {p.name for p in tmp_path.glob("*.png")}
    assert figures == {f"chelsea_{n}.png" for n in ("entropy", "prefix_share", "token_norms", "first_order",
                                                      "importance", "lens")}


def test_heads_mean_mode_needs_and_uses_a_reference(capsys, tmp_path, deit_args):
    code, _, err = run_cli(capsys, "heads", str(PHOTOS / "coffee.png"), "--ablate", "0:0", "--mode", "mean", *deit_args)
    assert code == 1 and "--reference" in err and "Traceback" not in err
    for name in ("chelsea.png", "astronaut.png"):
        shutil.copy(PHOTOS / name, tmp_path / name)
    code, out, err = run_cli(capsys, "heads", str(PHOTOS / "coffee.png"), "--ablate=-1:2,11:0,-1:1,11:2", "--mode", "mean",
                          "--reference", str(tmp_path), *deit_args)
    assert code == 0, err
    ablation = json.loads(out)["ablation"]
    assert ablation["reference_images"] == 2 and abs(ablation["delta_logit"]) > 1e-3
    assert ablation["heads"] == [[11, 0], [11, 1], [11, 2]]  # counted from the end, sorted, -1:2 and 11:2 once
    assert "mean head outputs: 2/2 reference images\n" in err.replace("\r", "\n")


@pytest.mark.parametrize("heads, message", [("12:0", "does not exist"), ("3-1", "layer:head"), ("0:3", "does not exist")])
def test_heads_bad_head_sets_are_one_line_errors(capsys, deit_args, heads, message):
    code, out, err = run_cli(capsys, "heads", str(PHOTOS / "chelsea.png"), "--ablate", heads, *deit_args)
    assert code == 1 and out == "" and message in err and len(err.strip().splitlines()) == 1
