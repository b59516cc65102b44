"""A text prompt in the app, for an OpenCLIP model the operator serves (`python app.py --model open_clip:NAME`):
the prompt box replaces the class search, drives every gradient map, caption, download and the faithfulness
table, is part of the stale-result record, and a hostile prompt gets a sentence. Handlers are called
directly on a tiny random OpenCLIP model (the CLIP tokenizer ships in the wheel), loaded through the app's own
flags."""
from __future__ import annotations

import base64
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from support import REPO
from support.clip import TINY_CLIP, make_clip, register_tiny_configs, save_clip

gr = pytest.importorskip("gradio")
open_clip = pytest.importorskip("open_clip")
import app as app_module  # noqa: E402

from vit_inspect.core.images import load_image  # noqa: E402
from vit_inspect.passes.pipeline import analyze_image  # noqa: E402
from vit_inspect.ui import inputs  # noqa: E402
from vit_inspect.ui.common import says_refusals  # noqa: E402
from vit_inspect.ui.inspector import Inspector  # noqa: E402
from vit_inspect.ui.model_cache import CacheKey, ModelCache  # noqa: E402
from vit_inspect.ui.panels import caption, draw_panels, unit  # noqa: E402
from vit_inspect.ui.stale import Basis, Tracked, cleared_sentence  # noqa: E402
from vit_inspect.ui.tabs.faithfulness import FaithfulnessTab, table_label  # noqa: E402
from vit_inspect.ui.view import READOUT, View  # noqa: E402

CHELSEA = REPO / "assets" / "chelsea.png"
CONTROLS = dict(layer=1, head=0, mean_heads=False, query=READOUT, row=0, col=0, head_fusion="mean",
                discard_ratio=0.0, first_layer=0, last_layer=1, gradcam_layer=1)  # the tiny tower: 2 blocks
CAT, DOG = "a photo of a cat", "a photo of a dog"


def progress(*args, **kwargs) -> None:
    """gr.Progress stand-in."""


def upload(name: str = "chelsea.png") -> dict:
    """An upload as a client may send it: a base64 data URL."""
    return {"url": "data:image/png;base64," + base64.b64encode((REPO / "assets" / name).read_bytes()).decode(),
            "orig_name": name}


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    register_tiny_configs()
    return save_clip(make_clip(seed=3), tmp_path_factory.mktemp("clip") / "tiny_clip.safetensors")


@pytest.fixture(scope="module")
def app(weights):
    """The app's `Inspector` for `app.py --model open_clip:ViT-Tiny-8-test --weights FILE --zero-shot ...`."""
    config, _ = app_module.parse_args(["--model", f"open_clip:{TINY_CLIP}", "--weights", str(weights), "--device",
                                       "cpu", "--zero-shot", "cat,dog,coffee"])
    return Inspector(config, ModelCache(1))


def refusal_of(handler, *args, **kwargs) -> str:
    """As wired (`common.says_refusals`): the sentence a refused request writes into the page's notice line, the
    only output it writes."""
    answer = says_refusals(handler, "notice", appended="")(*args, **kwargs)
    assert isinstance(answer, dict) and list(answer) == ["notice"], answer
    return answer["notice"]


@pytest.fixture
def session(app):
    return app.analyze(upload(), app.default_key, None, None, progress=progress, **CONTROLS)[0]


def test_the_flags_serve_an_openclip_model_with_its_zero_shot_list(app, weights):
    assert (app.config.zero_shot, app.config.templates) == (("cat", "dog", "coffee"), ("a photo of a {}.",))
    handle = app.handle(app.default_key)
    assert handle.clip is not None and handle.labels == ("cat", "dog", "coffee")
    with pytest.raises(SystemExit):  # a classifier has no text tower
        app_module.parse_args(["--model", "deit_tiny_patch16_224", "--zero-shot", "cat,dog"])
    with pytest.raises(SystemExit):  # a label with a control character, refused before the server starts
        app_module.parse_args(["--model", f"open_clip:{TINY_CLIP}", "--weights", str(weights), "--zero-shot",
                               "cat,d\x07og"])


def test_the_prompt_box_replaces_the_class_search_for_openclip_models_only(app):
    search, prompt, versus, target, top5 = inputs.input_mode(app.default_key)
    assert (search["visible"], prompt["visible"]) == (False, True)
    assert versus["label"] == inputs.VERSUS["prompt"][0] and versus["value"] == ""
    assert target["label"] == inputs.TARGET_LABEL["prompt"] and top5["label"] == "Top-5 zero-shot labels"
    search, prompt, versus, target, top5 = inputs.input_mode(CacheKey("deit_tiny_patch16_224", None, "cpu"))
    assert (search["visible"], prompt["visible"]) == (True, False) and top5["label"] == "Top-5 classes"


def test_a_prompt_drives_every_gradient_map_and_names_itself_everywhere(app, session):
    assert session.prompts and session.target == (int(np.argmax(session.result.probs)), None)  # the top label
    shown, listed, *panels = app.set_prompt(session, f"  {CAT} ", DOG, progress=progress, **CONTROLS)
    assert shown.target == (CAT, DOG) and listed["value"] is None  # the prompt is no entry of the zero-shot list
    result = shown.result
    assert (result.prompt.text, result.versus.text, result.score) == (CAT, DOG, "cosine")
    expected = analyze_image(app.handle(app.default_key), load_image(CHELSEA), target=CAT, contrast=DOG)
    np.testing.assert_allclose(result.gradcam, expected.gradcam, rtol=1e-5, atol=1e-9)  # the library's maps
    np.testing.assert_allclose(result.chefer, expected.chefer, rtol=1e-5, atol=1e-9)
    assert all(isinstance(p, np.ndarray) for p in panels)  # the first view's relevance, Grad-CAM, ..., All maps
    view = View.from_controls(result, **CONTROLS)
    for name in ("gradcam", "chefer"):
        assert f"prompt '{CAT}' versus prompt '{DOG}'" in caption(shown, view, name, "")
    assert unit(result, "chefer") == "relevance (cosine units)" and unit(session.result, "chefer") == (
        "relevance (cosine units)")  # a zero-shot label of a CLIP model is explained by its similarity too
    assert "label " in session.target_words() and shown.target_words() == f"prompt '{CAT}' versus prompt '{DOG}'"
    again, *_ = app.set_target(shown, "", "a photo of a sofa", progress=progress, **CONTROLS)
    assert again.target == (CAT, "a photo of a sofa")  # a new versus prompt, with no label picked
    label, *_ = app.set_target(shown, "1", DOG, progress=progress, **CONTROLS)
    assert label.target == (1, DOG) and label.target_words() == f"label dog (#1) versus prompt '{DOG}'"


def test_downloads_name_the_prompt_in_the_record_the_settings_and_the_note(app, session):
    shown = app.set_prompt(session, CAT, "", progress=progress, **CONTROLS)[0]
    basis, files, note = app.downloads(shown, app.default_key, **CONTROLS)
    record = json.loads(next(open(f).read() for f in files if f.endswith(".json")))
    assert record["target"] == {"prompt": CAT} and record["contrast"] is None and record["score"] == "cosine"
    assert record["settings"]["class"] == {"prompt": CAT}
    assert f"prompt '{CAT}'" in note and basis.target == (CAT, None)
    with np.load(next(f for f in files if f.endswith(".npz"))) as arrays:
        np.testing.assert_array_equal(arrays["gradcam"], shown.result.gradcam)


def test_faithfulness_scores_the_prompts_similarity_and_its_table_names_it(app, session):
    shown = app.set_prompt(session, CAT, DOG, progress=progress, **CONTROLS)[0]
    scored, figure, table, note, *verdicts = FaithfulnessTab(app.handle, app.with_relevance).score(
        shown, None, app.default_key, progress=progress, **CONTROLS)
    assert scored.words == f"prompt '{CAT}' versus prompt '{DOG}'" and table[0][0]  # rows, best first
    assert table_label(scored)["label"].startswith(f"Areas under the curves for prompt '{CAT}' versus prompt '{DOG}'")
    assert f"for prompt '{CAT}' versus prompt '{DOG}'" in note and "similarity" in note
    assert set(scored.curves) >= {"random", "gradcam", "chefer", "legrad", "attnlrp"}
    # every curve starts from the clean image's explained score: cos(f, t_cat) - cos(f, t_dog), by hand
    model = make_clip(seed=3)
    pixels, _ = app.handle(app.default_key).preprocess.apply(load_image(CHELSEA))
    with torch.no_grad():
        image = torch.nn.functional.normalize(model.encode_image(pixels), dim=-1)[0]
        text = model.encode_text(open_clip.get_tokenizer(TINY_CLIP)([CAT, DOG]), normalize=True)
    clean = float(image @ text[0] - image @ text[1])
    for curves in scored.curves.values():
        assert curves.deletion[0] == pytest.approx(clean, abs=1e-5) and curves.pos[0] == pytest.approx(clean, abs=1e-5)


def test_a_new_image_keeps_the_prompt_and_a_new_prompt_clears_what_was_scored(app, session):
    shown = app.set_prompt(session, CAT, "", progress=progress, **CONTROLS)[0]
    answer = app.analyze(upload("coffee.png"), app.default_key, None, None, progress=progress, current=shown,
                         prompt=CAT, versus_prompt="", **CONTROLS)
    assert answer[0].target == (CAT, None) and answer[0].result.prompt.text == CAT and answer[3]["value"] is None
    scores = Tracked("faithfulness", made_from=None, outputs=(), cleared=(), level="class", press="**Score**")
    before, other = Basis.of(shown, app.default_key), app.set_prompt(shown, DOG, "", progress=progress,
                                                                     **CONTROLS)[0]
    now = Basis.of(other, app.default_key)
    assert before.key("class") != now.key("class")
    assert cleared_sentence(scores, before, now) == (
        f"*Cleared: the class to explain changed. Press **Score** to compute them for {other.image_words}, "
        f"prompt '{DOG}'.*")


@pytest.mark.parametrize("prompt, says", [
    ("x" * 102_400, "The prompt has 102,400 characters; at most 300 are read"),
    ("a cat\x1b[2J", "control or invisible characters (U+001B)"), ("a\u200bcat", "U+200B"),
    ("", "The prompt is empty"), ("   ", "The prompt is empty"), (["a cat"], "must be text"),
    ("a " * 80, "tokens long; this text tower reads at most 77"),
], ids=["100-kB", "escape", "zero-width-space", "empty", "blank", "a-list", "over-77-tokens"])
def test_a_hostile_prompt_or_versus_prompt_gets_a_sentence_and_changes_nothing(app, session, prompt, says):
    refused = refusal_of(app.set_prompt, session, prompt, "", progress=progress, **CONTROLS)
    assert says in refused and len(refused) < 200
    if prompt and not isinstance(prompt, list) and prompt.strip():
        refused = refusal_of(app.set_prompt, session, CAT, prompt, progress=progress, **CONTROLS)
        assert says.replace("The prompt", "The versus prompt") in refused
    if isinstance(prompt, str) and prompt.strip():  # typed before a new image: its pass is refused the same way
        with pytest.raises(gr.Error) as caught:
            app.analyze(upload("coffee.png"), app.default_key, None, None, progress=progress, current=session,
                        prompt=prompt, versus_prompt="", **CONTROLS)
        assert says in caught.value.message
    assert session.target == (int(np.argmax(session.result.probs)), None)  # the session is as it was


def test_a_classifier_and_a_heads_ablation_refuse_a_prompt_with_a_sentence(app, session):
    classifier = replace(session, prompts=False)
    assert "no text tower" in refusal_of(app.set_prompt, classifier, CAT, "", progress=progress, **CONTROLS)
    from vit_inspect.ui.tabs.heads import HeadsTab

    shown = app.set_prompt(session, CAT, "", progress=progress, **CONTROLS)[0]
    tab = HeadsTab(app, (), lambda: [], View.from_controls)
    with pytest.raises(Exception, match="not on a prompt"):
        tab._handle_with_head(shown, "the ablation runs on it", "no head")
    assert draw_panels(("heads",), shown, View.from_controls(shown.result, **CONTROLS))[0] is not None
