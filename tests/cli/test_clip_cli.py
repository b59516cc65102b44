"""The command line with a prompt: analyze, evaluate and compare on a tiny random OpenCLIP model; hostile
prompts get one line on stderr and exit code 1."""
from __future__ import annotations

import json

import numpy as np
import pytest
from support import PHOTOS
from support.clip import TINY_CLIP, make_clip, register_tiny_configs, save_clip

from vit_inspect.cli.main import main
from vit_inspect.passes.records import rounded

pytestmark = pytest.mark.slow  # each test runs whole commands: tens of seconds

pytest.importorskip("open_clip")
CHELSEA, COFFEE = PHOTOS / "chelsea.png", PHOTOS / "coffee.png"


@pytest.fixture(scope="module")
def clip_args(tmp_path_factory):
    register_tiny_configs()
    weights = save_clip(make_clip(seed=3), tmp_path_factory.mktemp("clip") / "tiny.safetensors")
    return ["--model", f"open_clip:{TINY_CLIP}", "--weights", str(weights), "--device", "cpu",
            "--zero-shot", "cat,dog,coffee"]


def _run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_analyze_with_a_prompt_names_it_and_carries_every_map(capsys, tmp_path, clip_args):
    code, out, _ = _run(capsys, "analyze", str(CHELSEA), "--prompt", "a photo of a cat", "--versus",
                        "a photo of a dog", "--out", str(tmp_path), *clip_args)
    assert code == 0
    record = json.loads(out.strip().splitlines()[-1])
    assert record["target"] == {"prompt": "a photo of a cat"} and record["contrast"] == {"prompt": "a photo of a dog"}
    assert record["score"] == "cosine" and record["model"] == f"open_clip:{TINY_CLIP}"
    assert [t["label"] for t in record["topk"]] and {t["label"] for t in record["topk"]} == {"cat", "dog", "coffee"}
    for key in ("rollout", "gradcam", "chefer", "legrad", "attnlrp"):
        assert np.asarray(record[key]).shape == (4, 4) and np.any(np.asarray(record[key]) != 0), key
    assert (tmp_path / "chelsea_maps.png").is_file()


@pytest.mark.parametrize("prompt, says", [("x" * 102_400, "102,400 characters"), ("a cat\x1b[2J", "U+001B"),
                                          ("", "empty"), ("  ", "empty"), ("a " * 80, "tokens")])
def test_a_hostile_prompt_is_one_line_and_exit_1(capsys, clip_args, prompt, says):
    code, out, err = _run(capsys, "analyze", str(CHELSEA), "--prompt", prompt, *clip_args)
    assert code == 1 and out == "" and says in err and len(err.strip().splitlines()) == 1 and len(err) < 300
    code, out, err = _run(capsys, "analyze", str(CHELSEA), "--prompt", "a cat", "--versus", prompt, *clip_args)
    assert code == 1 and out == "" and says in err and len(err.strip().splitlines()) == 1


def test_prompt_flags_that_contradict_each_other(capsys, clip_args):
    assert _run(capsys, "analyze", str(CHELSEA), "--versus", "a dog", *clip_args)[0] == 1
    code, _, err = _run(capsys, "analyze", str(CHELSEA), "--prompt", "a cat", "--target", "1", *clip_args)
    assert code == 1 and "replaces --target" in err
    code, _, err = _run(capsys, "analyze", str(CHELSEA), "--prompt", "a cat", "--model", "deit_tiny_patch16_224",
                        "--device", "cpu")
    assert code == 1 and "no text tower" in err


def test_evaluate_and_compare_take_a_prompt(capsys, tmp_path, clip_args):
    folder = tmp_path / "images"
    folder.mkdir()
    for photo in (CHELSEA, COFFEE):
        (folder / photo.name).write_bytes(photo.read_bytes())
    (folder / "labels.csv").write_text("filename,class_index\nchelsea.png,0\ncoffee.png,2\n")
    code, out, err = _run(capsys, "evaluate", str(folder), "--labels", str(folder / "labels.csv"), "--prompt",
                          "a photo of a cat", "--methods", "random,gradcam,legrad", "--out", str(tmp_path / "ev"),
                          *clip_args)
    assert code == 0, err
    table = json.loads((tmp_path / "ev" / "table.json").read_text())
    assert table["target"] == {"prompt": "a photo of a cat"} and table["score"] == "cosine" and table["images"] == 2
    assert set(table["methods"]) == {"random", "gradcam", "legrad"}
    deletion = table["methods"]["gradcam"]["del"]["mean"]
    assert -1.0 <= deletion <= 1.0  # a mean cosine similarity, not a probability
    weights = clip_args[clip_args.index("--weights") + 1]
    code, out, err = _run(capsys, "compare", str(CHELSEA), "--model", f"open_clip:{TINY_CLIP}", "--model",
                          f"open_clip:{TINY_CLIP}", "--weights-a", weights, "--weights-b", weights, "--prompt",
                          "a photo of a cat", "--zero-shot", "cat,dog", "--device", "cpu", "--out", str(tmp_path / "cmp"))
    assert code == 0, err
    record = json.loads(out.strip().splitlines()[-1])
    assert record["target"] == {"prompt": "a photo of a cat"}
    assert record["maps"]["gradcam"]["spearman"] == pytest.approx(1.0)  # the same model agrees with itself


def test_records_keep_significant_digits_of_small_maps():
    assert rounded(np.array([1.23456789e-5, -2.0e-7])) == [1.23457e-05, -2e-07]
    assert rounded(np.array([12.3456789, 0.1234567])) == [12.345679, 0.123457]  # unchanged for logit-sized maps
    assert rounded(None) is None and rounded(np.zeros(2)) == [0.0, 0.0]


def test_sanity_with_a_prompt_records_it_and_names_it_in_the_figures(capsys, tmp_path, clip_args):
    code, out, _ = _run(capsys, "sanity", str(CHELSEA), "--prompt", "a photo of a cat", "--methods", "gradcam,rollout",
                        "--no-robustness", "--no-independent", "--json", "--out", str(tmp_path), *clip_args)
    assert code == 0
    record = json.loads(out.strip().splitlines()[-1])
    assert record["target"] == {"prompt": "a photo of a cat"} and record["model"] == f"open_clip:{TINY_CLIP}"
    assert record["random_class"]["label"] in {"cat", "dog", "coffee"}  # the random logit: a zero-shot label
    steps = record["methods"]["gradcam"]["cascading"]
    assert [s["randomised_from_block"] for s in steps] == [None, 1, 0, "embedding"] and steps[0]["spearman"] == 1.0
    assert (tmp_path / "chelsea_cascading.png").is_file() and (tmp_path / "chelsea_similarity.png").is_file()
    code, table, _ = _run(capsys, "sanity", str(CHELSEA), "--prompt", "a photo of a cat", "--methods", "gradcam",
                          "--no-robustness", "--no-independent", *clip_args)
    assert code == 0 and table.startswith("chelsea.png: prompt 'a photo of a cat', random logit: ")


def test_sanity_of_a_class_of_a_clip_model_records_the_class(capsys, clip_args):
    code, out, err = _run(capsys, "sanity", str(CHELSEA), "--target", "1", "--random-class", "2", "--methods",
                          "gradcam", "--no-robustness", "--no-independent", "--json", *clip_args)
    assert code == 0, err
    record = json.loads(out.strip().splitlines()[-1])
    assert record["target"] == {"index": 1, "label": "dog"} and record["random_class"] == {"index": 2, "label": "coffee"}
    code, _, err = _run(capsys, "sanity", str(CHELSEA), "--target", "1", "--prompt", "a cat", *clip_args)
    assert code == 1 and "replaces --target" in err


def test_sanity_takes_one_prompt_not_a_versus(capsys, clip_args):
    code, out, err = _run(capsys, "sanity", str(CHELSEA), "--prompt", "a cat", "--versus", "a dog", *clip_args)
    assert code == 1 and out == "" and "--versus is not supported" in err and len(err.strip().splitlines()) == 1
    code, out, err = _run(capsys, "sanity", str(CHELSEA), "--prompt", "a cat\x1b[2J", *clip_args)
    assert code == 1 and out == "" and "U+001B" in err and len(err.strip().splitlines()) == 1


def test_evaluate_sanity_takes_a_prompt_and_equals_the_per_image_checks(capsys, tmp_path, clip_args):
    from vit_inspect.core.load import load_model
    from vit_inspect.core.open_clip_models import with_zero_shot
    from vit_inspect.jobs.sanity import SanityJob
    from vit_inspect.studies.sanity import SanityAccumulator, SanitySettings, sanity_check

    folder = tmp_path / "images"
    folder.mkdir()
    for photo in (CHELSEA, COFFEE):
        (folder / photo.name).write_bytes(photo.read_bytes())
    code, out, err = _run(capsys, "evaluate", str(folder), "--sanity", "--prompt", "a photo of a cat", "--methods",
                          "attention,gradcam", "--no-independent", "--out", str(tmp_path / "ev"), *clip_args)
    assert code == 0, err
    table = json.loads((tmp_path / "ev" / "sanity.json").read_text())
    assert table["target"] == {"prompt": "a photo of a cat"} and table["images"] == 2
    assert table["settings"]["random_class"] == "drawn with the seed among the zero-shot labels"
    weights = clip_args[clip_args.index("--weights") + 1]
    handle = with_zero_shot(load_model(f"open_clip:{TINY_CLIP}", weights=weights, device="cpu"), ["cat", "dog", "coffee"])
    settings = SanitySettings(independent=False, robustness=None)
    job = SanityJob.for_handle(handle, ("attention", "gradcam"), settings, device="cpu", prompt="a photo of a cat")
    assert job.open().handle.labels == ("cat", "dog", "coffee")  # a worker rebuilds the zero-shot list
    loop = SanityAccumulator()
    for photo in (CHELSEA, COFFEE):
        loop.add(sanity_check(handle, photo, ("attention", "gradcam"), target="a photo of a cat", settings=settings))
    mean, _, _ = loop.table()["cascading"]["gradcam"]
    got = [step["spearman"]["mean"] for step in table["methods"]["gradcam"]["cascading"]]
    np.testing.assert_allclose(got, np.round(mean[:, 0], 6), atol=1e-6)
    code, _, err = _run(capsys, "evaluate", str(folder), "--sanity", "--prompt", "a cat", "--versus", "a dog",
                        *clip_args)
    assert code == 1 and "--versus is not supported" in err
