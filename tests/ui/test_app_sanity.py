"""The sanity checks in the app: the handler on a tiny model (what it returns and keeps, Cancel, the weights
restored), the verdict column of the faithfulness table, the events on the model-pass queue, and the checks
through the served app on the real weights (the stale-result check clears them: tests/ui/test_stale.py)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from support import tiny_handle
from support.app import APP_MARKS

from vit_inspect.core.errors import Cancelled
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.plots.faithfulness import paper_name
from vit_inspect.studies.sanity import PASS_THRESHOLD, SANITY_METHODS, ImageSanity

gr = pytest.importorskip("gradio")
from vit_inspect.ui import sanity  # noqa: E402
from vit_inspect.ui.panels import FIGURE_PIXELS  # noqa: E402
from vit_inspect.ui.session_store import SessionStore  # noqa: E402
from vit_inspect.ui.stale import result_key  # noqa: E402
from vit_inspect.ui.tabs.faithfulness import Scored, table_of, with_verdicts  # noqa: E402


def _session(handle, seed: int = 0):
    """What the handler reads of the page's session (`inspector.Session`), for a random 32 x 32 image."""
    picture = Image.fromarray(np.random.default_rng(seed).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    result = analyze_image(handle, picture)
    return SimpleNamespace(model="tiny", result=result, model_label="tiny", digest=f"image {seed}",
                           image_words=f"image{seed}.png (crop)", target=(result.target, None),
                           target_words=lambda: f"#{result.target}")


def _state(handle):
    return {k: v.detach().clone() for k, v in handle.model.state_dict().items()}


class Progress:
    def __init__(self, on_pass=None):
        self.passes, self.on_pass = [], on_pass

    def __call__(self, value, desc=None, unit=None):
        if isinstance(value, tuple):
            self.passes.append(value)
            if self.on_pass is not None:
                self.on_pass(len(self.passes))


def test_the_buttons_count_is_the_passes_run_for_any_depth():
    """The button promises a fixed count plus some per block; a model of 2 blocks runs exactly that many."""
    import re

    fixed, per_block = map(int, re.fullmatch(r"Run the sanity checks \((\d+) analysis passes \+ (\d+) per block\)",
                                             sanity.press_label()).groups())
    assert (fixed, per_block) == (13, 1) and fixed + 12 * per_block == sanity.passes_of(12) == 25
    handle = tiny_handle("cls")
    progress = Progress()
    sanity.SanityChecks(lambda key: handle, SessionStore(budget=2 ** 30)).run(_session(handle), None, None, None,
                                                                             progress)
    assert handle.depth == 2 and progress.passes[-1] == (fixed + 2 * per_block,) * 2


def test_the_handler_runs_keeps_and_restores():
    handle = tiny_handle("cls")
    store = SessionStore(budget=2 ** 30)
    checks = sanity.SanityChecks(lambda key: handle, store)
    current = _session(handle)
    before = _state(handle)
    progress = Progress()
    made, strip, curves, rows, note = checks.run(current, None, None, None, progress)
    total = sanity.passes_of(handle.depth)
    assert total == 1 + 2 + 1 + 1 + 10 and progress.passes[-1] == (total, total)
    assert all(torch.equal(v, before[k]) for k, v in handle.model.state_dict().items())  # restored
    held = made.slot.get()
    assert isinstance(held, ImageSanity) and store.held == made.slot.nbytes > 0
    assert [row[0] for row in rows] == [paper_name(m) for m in SANITY_METHODS] and len(rows[0]) == len(sanity.HEADERS)
    for row, method in zip(rows, SANITY_METHODS):  # the verdict cell is the result's own verdict
        spearman = held.cascading[method][-1].spearman
        assert row[1] == f"{spearman:.2f}" and row[2] == sanity.verdict_cell(spearman < PASS_THRESHOLD, spearman)
        assert row[3] == f"{held.random_logit[method].spearman:.2f}"
        assert row[4] == f"{held.max_sensitivity[method]:.2f}"
    assert made.verdicts == {row[0]: row[2] for row in rows}
    assert made.key == result_key(current) and made.basis.image == "image 0"
    assert strip.ndim == 3 and curves.ndim == 3 and strip.dtype == np.uint8
    assert f"below {PASS_THRESHOLD}" in note and "image0.png" in note and "restored" in note
    again, *_ = checks.run(current, made, None, None, Progress())  # the session's slot is reused
    assert again.slot is made.slot and len(store) == 1


def test_cancel_stops_before_the_next_pass_and_leaves_the_weights():
    handle = tiny_handle("reg4")
    checks = sanity.SanityChecks(lambda key: handle, SessionStore(budget=2 ** 30))
    request = SimpleNamespace(session_hash="visitor")
    assert checks.cancel(request).startswith("Nothing to cancel")
    before = _state(handle)
    progress = Progress(on_pass=lambda done: done == 3 and checks.cancel(request))
    with pytest.raises(Cancelled, match="after 3 of"):
        checks.run(_session(handle), None, None, request, progress)
    assert all(torch.equal(v, before[k]) for k, v in handle.model.state_dict().items())
    assert checks.cancels.running == {}  # the flag is gone with its run
    handler = checks.handler(lambda scored, checked: "table")
    progress = Progress(on_pass=lambda done: done == 2 and checks.cancel(request))
    outputs = handler(_session(handle), None, None, None, request, progress)
    assert outputs[4].startswith("The sanity checks were cancelled after 2 of") and "Nothing was changed" in outputs[4]
    assert all(value.get("__type__") == "update" for i, value in enumerate(outputs) if i != 4)  # left as they were


def test_errors_are_sentences():
    handle = tiny_handle("cls")
    handler = sanity.SanityChecks(lambda key: handle, SessionStore(budget=2 ** 30)).handler(lambda *a: None)
    with pytest.raises(gr.Error, match="Analyse an image first"):
        handler(None, None, None)
    prompted = _session(handle)
    prompted.result = SimpleNamespace(target=3, prompt="a photo of a cat", versus="a photo of a dog")
    with pytest.raises(gr.Error, match="one prompt, not one versus another"):
        handler(prompted, None, None)
    headless = tiny_handle("gap")
    current = _session(handle)
    current.result = SimpleNamespace(target=None)
    with pytest.raises(gr.Error, match="no classification head"):
        sanity.SanityChecks(lambda key: headless, SessionStore(budget=2 ** 30)).handler(lambda *a: None)(
            current, None, None)


def test_the_verdict_column_of_the_faithfulness_table():
    rows = [[paper_name("chefer"), "1.00"], [paper_name("random"), "2.00"], ["Grad-CAM, block 0 (signed)", "3.00"],
            [paper_name("attention"), "4.00"]]
    key = ("tiny", "digest", 3)
    checked = sanity.Checked(key=key, slot=None, rows=[], verdicts={paper_name("chefer"): "passes (ρ 0.10)",
                                                                     paper_name("attention"): "fails (ρ 0.90)"})
    assert [row[-1] for row in with_verdicts(rows, key, checked)] == ["passes (ρ 0.10)", "–", "–", "fails (ρ 0.90)"]
    assert [row[-1] for row in with_verdicts(rows, key, None)] == ["not run", "–", "–", "not run"]
    other = ("tiny", "digest", 4)  # another class: its verdicts are not this table's
    assert [row[-1] for row in with_verdicts(rows, other, checked)] == ["not run", "–", "–", "not run"]
    assert table_of(None, checked).get("__type__") == "update"  # nothing scored: the table is left alone
    assert sanity.verdict_cell(True, 0.123) == "passes (ρ 0.12)" and sanity.verdict_cell(False, 0.8) == "fails (ρ 0.80)"
    assert sanity.verdict_cell(None, float("nan")) == "undefined (a constant map)"
    scored = Scored(key=key, curves={})
    assert table_of(scored, checked) == []  # no curves: no rows


def test_every_event_that_reads_the_models_weights_runs_on_the_model_pass_queue():
    from vit_inspect.ui.config import AppConfig
    from vit_inspect.ui.demo import build_demo
    from vit_inspect.ui.model_cache import ModelCache

    demo = build_demo(AppConfig(), ModelCache(loader=lambda *a, **k: None))
    fns = demo.fns.values() if isinstance(demo.fns, dict) else demo.fns
    queue = {fn.api_name: fn.concurrency_id for fn in fns if fn.api_name}
    for api_name in ("sanity_checks", "analyze", "faithfulness", "model_figures", "pos_similarity", "model_downloads",
                     "ablate_heads", "head_importance", "compare_models", "dataset_distance", "relevance"):
        assert queue[api_name] == "model_pass", api_name
    assert queue["cancel_sanity_checks"] != "model_pass"  # Cancel must not wait behind the run it cancels


@pytest.mark.slow
@APP_MARKS[0]  # the real weights
@APP_MARKS[1]
def test_the_checks_through_the_served_app(client):
    from support.app import analyze

    analyze(client)
    table = client.predict(api_name="/faithfulness")[1]
    assert table["headers"][-1] == sanity.VERDICT_HEADER
    assert {row[-1] for row in table["data"] if row[0] == paper_name("chefer")} == {"not run"}
    strip, curves, rows, note, faithfulness = client.predict(api_name="/sanity_checks")
    assert strip and curves and "Egyptian cat" in note and f"below {PASS_THRESHOLD}" in note
    for picture in (strip, curves):  # DeiT-Ti's 12 blocks: drawn to be shown at their own size at 1366 pixels
        with Image.open(picture) as image:
            assert 900 < image.width <= FIGURE_PIXELS
    verdicts = {row[0]: row[2] for row in rows["data"]}
    assert set(verdicts) == {paper_name(m) for m in SANITY_METHODS}
    assert verdicts[paper_name("gradcam")].startswith("passes")
    column = {row[0]: row[-1] for row in faithfulness["data"]}
    assert all(column[name] == verdict for name, verdict in verdicts.items())  # beside the scores
    assert column[paper_name("random")] == "–"
    again = client.predict(api_name="/faithfulness")[1]  # scored again: the verdicts stay beside the scores
    assert {row[0]: row[-1] for row in again["data"]} == column
    assert client.predict(api_name="/cancel_sanity_checks").startswith("Nothing to cancel")


def test_a_prompt_s_checks_name_the_prompt_and_its_random_zero_shot_label():
    pytest.importorskip("open_clip")
    from support import PHOTOS
    from support.clip import clip_handle

    from vit_inspect.core.images import load_image

    handle = clip_handle(seed=8)
    before = _state(handle)
    picture = load_image(PHOTOS / "chelsea.png")
    result = analyze_image(handle, picture, target="a photo of a cat")
    current = SimpleNamespace(model="clip", result=result, model_label="clip", digest="chelsea",
                              image_words="chelsea.png (crop)", target=(result.target, None),
                              target_words=lambda: "prompt 'a photo of a cat'")
    checks = sanity.SanityChecks(lambda key: handle, SessionStore(budget=2 ** 30))
    made, strip, curves, rows, note = checks.run(current, None, None, None, Progress())
    kept = made.slot.get()
    assert kept.prompt == "a photo of a cat" and kept.target == len(handle.labels)
    assert 0 <= kept.random_class < len(handle.labels)
    label = handle.label(kept.random_class)
    assert note.startswith(f"Ran {sanity.passes_of(handle.depth)} analysis passes for prompt 'a photo of a cat' of "
                           "chelsea.png (crop).")
    assert f"the map for zero-shot label {label!r} (#{kept.random_class})" in note and "ignores the prompt" in note
    assert [row[0] for row in rows] == [paper_name(m) for m in SANITY_METHODS]
    assert made.key == result_key(current)
    assert all(torch.equal(v, before[k]) for k, v in handle.model.state_dict().items())
