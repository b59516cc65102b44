"""The app's Heads tab: its handlers called directly with the real DeiT-Ti weights on an example photo,
each number checked against the library call it shows (ablation effect, head importance, lens), plus
bad head specs, cancellation, heatmap clicks and the lens of a model without a head."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

import numpy as np
import pytest
from support import REPO, tiny_handle

gr = pytest.importorskip("gradio")
from vit_inspect.analysis.rank_correlation import spearman  # noqa: E402
from vit_inspect.core.errors import VitInspectError  # noqa: E402
from vit_inspect.core.geometry import InputGeometry  # noqa: E402
from vit_inspect.passes.pipeline import analyze_image  # noqa: E402
from vit_inspect.passes.result import ROLLOUT_CACHE
from vit_inspect.plots import distance as distance_plots
from vit_inspect.plots.canvas import COLORBAR_PIXELS
from vit_inspect.studies.ablation import (  # noqa: E402
    ablation_effect,
    analyze_ablated,
    head_importance,
)
from vit_inspect.ui.common import says_refusals, shown_model, shows_errors, upload_folders
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.demo import build_demo
from vit_inspect.ui.inspector import (
    FIRST_PANELS,
    FIRST_TAB,
    LATER_PANELS,
    Inspector,
    Session,
)
from vit_inspect.ui.model_cache import ModelCache  # noqa: E402
from vit_inspect.ui.panels import IMAGE_PANELS
from vit_inspect.ui.session_store import DROPPED, Detached  # noqa: E402
from vit_inspect.ui.tabs.heads import (
    HeadsTab,
    cell_at,
    heatmap,
    importance_of_crop,
    parse_head_spec,
    result_key,
)
from vit_inspect.ui.lens_table import lens_table, lens_widths  # noqa: E402
from vit_inspect.ui.untrusted import NOT_AVAILABLE  # noqa: E402
from vit_inspect.ui.view import READOUT, View
from vit_inspect.ui.zerogpu import gpu_pass  # noqa: E402

WEIGHTS = REPO / "checkpoints" / "deit_tiny_patch16_224.safetensors"
CHELSEA = REPO / "assets" / "chelsea.png"
CONTROLS = dict(layer=11, head=0, mean_heads=False, query=READOUT, row=0, col=0, head_fusion="mean",
                discard_ratio=0.0, first_layer=0, last_layer=11, gradcam_layer=11)

pytestmark = [pytest.mark.slow,  # served app, ablations and head importance
              pytest.mark.skipif(not WEIGHTS.is_file(), reason=f"real DeiT-Ti weights not found at {WEIGHTS}")]


@dataclass(frozen=True)
class Request:
    session_hash: str


class Progress:
    """gr.Progress stand-in; `then` runs on the first call (e.g. pressing Cancel mid-run)."""

    def __init__(self, then=None):
        self.calls, self.then = 0, then

    def __call__(self, *args, **kwargs) -> None:
        self.calls += 1
        if self.then is not None and self.calls == 1:
            self.then()


@pytest.fixture(scope="module")
def served():
    """(Inspector, its DeiT-Ti handle, a Session on chelsea.png, the Heads tab)."""
    inspector = Inspector(AppConfig(weights=str(WEIGHTS), device="cpu"), ModelCache(1))
    handle = inspector.handle(inspector.default_key)
    geometry = InputGeometry()
    result = inspector._pass(handle, str(CHELSEA), geometry)
    session = Session(model=inspector.default_key, source=str(CHELSEA), name="chelsea.png",
                          slot=inspector.store.put({(result.target, None): result}, result.nbytes()),
                          target=(result.target, None),
                          distance=distance_plots.attention_distance_panel(result.mean_distance, image_width=224, title="t"),
                          labels=handle.labels, model_label=shown_model(handle), geometry=geometry)
    with gr.Blocks():
        tab = HeadsTab(inspector, (CHELSEA, REPO / "assets" / "coffee.png"), upload_folders,
                       View.from_controls)
    return inspector, handle, session, tab


def test_ablating_a_layer_shows_the_library_effect(served):
    inspector, handle, session, tab = served
    state, words, rows, *maps = tab.ablate(session, None, "3:0, 3:1, 3:2", "zero", None, progress=Progress(),
                                           **CONTROLS)
    result = session.result
    expected = analyze_ablated(handle, CHELSEA, [(3, 0), (3, 1), (3, 2)], "zero", target=result.target,
                               geometry=InputGeometry())
    effect = ablation_effect(result, expected)
    np.testing.assert_allclose(state.ablated.probs, expected.probs, atol=1e-6)
    assert f"{effect.prob_before:.4f} → {effect.prob_after:.4f} (Δ {effect.delta_prob:+.4f})" in words
    assert f"(Δ {effect.delta_logit:+.3f})" in words
    assert state.ablated_heads == ((3, 0), (3, 1), (3, 2))
    assert state.ablated_words == "ablated: heads 3:0, 3:1, 3:2, mode zero"
    assert len(rows) == 5 and [r[0] for r in rows] == [1, 2, 3, 4, 5]
    for row in rows:
        for cell, prob in ((row[1], row[2]), (row[3], row[4])):
            name, index = cell.rsplit(" (#", 1)
            assert handle.labels[int(index[:-1])] == name and 0 <= prob <= 1
    assert rows[0][1] == f"{handle.label(effect.top_before[0][0])} (#{effect.top_before[0][0]})"
    assert rows[0][3] == f"{handle.label(effect.top_after[0][0])} (#{effect.top_after[0][0]})"
    assert len(maps) == 3 and all(m.ndim == 3 and m.shape[2] == 3 for m in maps)
    # at the crop's own size, as the first view's: three side by side fit the page at 1366 pixels
    assert {m.shape[1] for m in maps} == {result.layout.input_size[1] + COLORBAR_PIXELS}


def test_redraws_come_from_the_cached_ablated_pass(served):
    inspector, handle, session, tab = served
    state = tab.ablate(session, None, "11:1", "uniform", None, progress=Progress(), **CONTROLS)[0]
    forwards = []
    hook = handle.model.register_forward_pre_hook(lambda m, a: forwards.append(1))
    try:
        first = tab.redraw(session, state, **CONTROLS)
        other = tab.redraw(session, state, **(CONTROLS | dict(layer=2, head=1)))
    finally:
        hook.remove()
    assert forwards == []
    assert not np.array_equal(first[0], other[0])  # another layer's attention
    np.testing.assert_array_equal(first[1], other[1])  # the same rollout
    assert first[3] is None  # no importance run yet; the first-order heatmap is drawn
    assert first[4].ndim == 3
    stale = replace(session, target=(5, None), slot=Detached({(5, None): session.result}))
    assert tab.redraw(stale, state, **CONTROLS) == [gr.skip()] * 5  # results of another class are not shown


@pytest.mark.parametrize("spec, words", [("99:0", "does not exist"), ("0:3", "does not exist"), ("a:b", "could not read"),
                                         (float("nan"), "could not read"), ("", "No heads given"),
                                         (["3:1"], "must be text"), ("3:1\x00", "printable")])
def test_bad_head_specs_are_sentences(served, spec, words):
    """As wired: the sentence in the ablation's line, and every other output of the tab left as it was."""
    inspector, handle, session, tab = served
    outputs = says_refusals(tab.ablate, "effect")(session, None, spec, "zero", None, progress=Progress(), **CONTROLS)
    assert list(outputs) == ["effect"] and outputs["effect"].startswith("⚠️ ") and words in outputs["effect"]
    assert "Traceback" not in outputs["effect"]


@pytest.mark.parametrize("mode", ["bogus", None, 3, float("inf")])
def test_bad_modes_are_sentences(served, mode):
    inspector, handle, session, tab = served
    refused = says_refusals(tab.ablate, "effect")(session, None, "3:1", mode, None, progress=Progress(), **CONTROLS)
    assert "ablation mode must be one of zero, mean, uniform" in refused["effect"]
    with pytest.raises(VitInspectError, match="ablation mode must be one of"):
        tab.rank(session, None, mode, None, Request("s0"), progress=Progress(), **CONTROLS)


@pytest.mark.parametrize("files", [["/etc/passwd"], [str(CHELSEA)], [{"path": str(CHELSEA), "meta": {}}]])
def test_reference_files_outside_the_upload_folder_are_refused(served, files):
    inspector, handle, session, tab = served
    with pytest.raises(VitInspectError, match=re.escape(NOT_AVAILABLE)):
        tab.ablate(session, None, "3:1", "mean", files, progress=Progress(), **CONTROLS)


def test_head_specs_parse_negative_and_duplicate_heads():
    assert parse_head_spec(" 3:1, 5:0 ,3:1", 12, 3) == ((3, 1), (5, 0))
    assert parse_head_spec("-1:-1", 12, 3) == ((11, 2),)
    with pytest.raises(VitInspectError, match="does not exist"):
        parse_head_spec("12:0", 12, 3)


def test_mean_ablation_names_its_reference_set(served):
    inspector, handle, session, tab = served
    state, words, *_ = tab.ablate(session, None, "11:0", "mean", None, progress=Progress(), **CONTROLS)
    assert state.means[1].num_images == 2
    assert "mode mean (mean over 2 of the app's example photos)" in words
    again = tab.ablate(session, state, "11:1", "mean", None, progress=Progress(), **CONTROLS)[0]
    assert again.means[1] is state.means[1]  # the same reference set is averaged once per session


def test_importance_equals_the_library_and_a_click_selects_its_cell(served):
    inspector, handle, session, tab = served
    result = session.result
    state, importance, first, note, geometry = tab.rank(session, None, "zero", None, Request("s1"),
                                                        progress=Progress(), **CONTROLS)
    pixels = handle.preprocess.normalize(result.rgb)
    expected = head_importance(handle, pixels, target=result.target)
    assert state.importance.logit_drop.shape == (12, 3)
    np.testing.assert_allclose(state.importance.logit_drop, expected.logit_drop, atol=1e-4)
    assert f"**{spearman(result.heads.first_order, expected.logit_drop):.3f}**" in note
    assert importance.ndim == 3 and first.ndim == 3 and tab.cancels.running == {}

    boxes = dict(state.boxes)
    # what the page gets to turn a click into a cell itself (PICK_CELL_JS): the same boxes, the model's grid
    assert geometry == {name: {"box": list(boxes[name]), "grid": [12, 3]} for name in ("importance", "first_order")}
    assert json.loads(json.dumps(geometry)) == geometry
    for which in ("importance", "first_order"):
        x0, y0, x1, y1 = boxes[which]
        centre = (x0 + (2 + 0.5) * (x1 - x0) / 3, y0 + (7 + 0.5) * (y1 - y0) / 12)  # head 2, layer 7
        pick = tab.pick(which)
        assert pick(gr.SelectData(None, {"index": list(centre), "value": None}), session, state) == (7, 2, False)
        assert pick(gr.SelectData(None, {"index": [1, 1], "value": None}), session, state) == (gr.skip(),) * 3
        with pytest.raises(gr.Error, match="must be a number"):
            shows_errors(pick)(gr.SelectData(None, {"index": ["x", 3], "value": None}), session, state)


def test_a_heatmap_click_lands_on_the_drawn_cell():
    """Independent of the box: the one red cell of a drawn heatmap is found in the pixels, and a click
    on its centre maps back to it."""
    values = np.zeros((12, 3))
    values[4, 1] = 1.0
    values[0, 0] = -1.0
    image, box = heatmap(values, "one red cell", "logits", None)
    red = (image[..., 0] > 90) & (image[..., 1] < 15) & (image[..., 2] < 50)  # RdBu_r at +max: (103, 0, 31)
    x0, y0, x1, y1 = box
    red[:, int(x1):] = False  # the colour bar is red at its top too
    ys, xs = np.nonzero(red)
    assert cell_at(box, (12, 3), xs.mean(), ys.mean()) == (4, 1)
    assert cell_at(box, (12, 3), xs.min() + 1, ys.min() + 1) == (4, 1)
    assert cell_at(box, (12, 3), x1 + 5, ys.mean()) is None


def test_cancel_stops_importance_before_its_next_batch(served):
    inspector, handle, session, tab = served
    request = Request("s2")
    assert "Nothing to cancel" in tab.cancel(request)
    forwards = []
    hook = handle.model.register_forward_pre_hook(lambda m, a: forwards.append(a[0].shape[0]))
    try:
        state, importance, first, note, geometry = tab.rank(
            session, None, "zero", None, request, progress=Progress(then=lambda: tab.cancel(request)), **CONTROLS)
    finally:
        hook.remove()
    assert forwards == [16]  # one batch of 16 rows of the 37, then stopped
    assert "cancelled after 16 of 37 rows" in note
    assert state.importance is None and importance == gr.skip() and geometry == gr.skip() and tab.cancels.running == {}


def test_lens_table_has_a_row_per_block(served):
    inspector, handle, session, tab = served
    headers, rows, note = lens_table(handle, session.result)
    assert len(rows) == 12 and [r[0] for r in rows] == list(range(12))
    assert headers[1:4] == ["readout: rank of final class", "readout: its prob", "readout: top-5"]
    assert len(lens_widths(headers)) == 4 and sum(float(w[:-1]) for w in lens_widths(headers)) == 100
    final = int(np.argmax(session.result.probs))
    assert rows[-1][1] == 1 and rows[-1][2] == pytest.approx(float(session.result.probs[final]), abs=1e-4)
    assert rows[-1][3].startswith(handle.labels[final])
    assert f"Final class: {handle.labels[final]} (#{final})" in note
    settled = next(block for block in range(12) if all(row[1] == 1 for row in rows[block:]))
    assert f"readout from block {settled} on (blocks 0 to 11)" in note  # a block by its index, never a count


def test_overview_draws_from_the_pass_and_clears_another_class(served):
    inspector, handle, session, tab = served
    state = tab.ablate(session, None, "0:0", "zero", None, progress=Progress(), **CONTROLS)[0]
    outputs = tab.overview(session, state, **CONTROLS)
    assert outputs[0].ablated is state.ablated and outputs[2].ndim == 3 and outputs[4].ndim == 3
    other = replace(session, target=(5, None), slot=Detached({(5, None): session.result}))
    cleared = tab.overview(other, state, **CONTROLS)
    assert cleared[0].ablated is None and cleared[1] is None and cleared[-1] is None
    # the lines are the stale-result check's to write (what changed, what to press): kept, and so is the basis
    assert cleared[3] == cleared[8] == gr.skip() and cleared[0].basis == state.basis
    assert outputs[9] == {"first_order": {"box": list(dict(outputs[0].boxes)["first_order"]), "grid": [12, 3]}}
    assert cleared[9] == {"first_order": {"box": list(dict(cleared[0].boxes)["first_order"]), "grid": [12, 3]}}


def test_a_new_images_figures_and_heads_overview_wait_for_their_tab(served):
    """After a new image (or class) the page asks for these; they draw only while their tab is shown, and
    the tab draws them when it opens (its own select event)."""
    inspector, handle, session, tab = served
    assert set(LATER_PANELS) | set(FIRST_PANELS) == set(IMAGE_PANELS)
    for name, label in LATER_PANELS.items():
        shown_only = inspector.redraw_if_shown(name, label)
        assert shown_only(session, FIRST_TAB, **CONTROLS) == gr.skip()
        assert shown_only(session, ["not", "a", "tab"], **CONTROLS) == gr.skip()  # a client's word, compared only
        np.testing.assert_array_equal(shown_only(session, label, **CONTROLS), inspector.redraw(name)(session, **CONTROLS))

    state = tab.ablate(session, None, "0:0", "zero", None, progress=Progress(), **CONTROLS)[0]
    other = replace(session, target=(5, None), slot=Detached({(5, None): session.result}))
    outputs = len(tab.overview(session, state, **CONTROLS))
    if_shown = tab.overview_if_shown("Ablate & rank", outputs)
    hidden = if_shown(other, state, FIRST_TAB, **CONTROLS)
    # out of view: the lens and the first-order heatmap (and where its cells lie) cleared; the ablation and the
    # importance are the page's stale-result check's to clear (`ui.stale`), with the state
    cleared = {2: None, 4: None, 5: None, 6: "", 9: None}
    assert len(hidden) == outputs
    assert all(hidden[i] == cleared.get(i, gr.skip()) for i in range(outputs))
    reset = tab.reset(state, other)  # what the stale-result check keeps of the state
    assert reset.key == result_key(other) and reset.ablated is None and state.ablated_slot.dropped  # let go at once
    assert tab.reset(state, None) is None
    shown = if_shown(other, reset, "Ablate & rank", **CONTROLS)
    assert shown[2].ndim == 3 and shown[9] == {"first_order": {"box": list(dict(shown[0].boxes)["first_order"]),
                                                                "grid": [12, 3]}}


def test_a_cell_click_redraws_the_attention_map_and_the_distance_scatter_only_in_its_tab(served):
    """After a click on a Heads cell the page asks for the panels showing layer and head: each drawn only
    while its view is shown (its opening draws it otherwise)."""
    inspector, handle, session, tab = served
    demo = build_demo(AppConfig(), ModelCache(loader=lambda *a, **k: None))
    shown = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "shown-tab")
    inputs = {dep["api_name"]: dep["inputs"] for dep in demo.config["dependencies"]}
    handlers = {fn.api_name: fn.fn for fn in demo.fns.values()}
    for which in ("importance", "first_order"):
        for name in ("attention", "distance"):
            api = f"pick_head_{which}_{name}"
            assert inputs[api][1] == shown._id  # the page's record of the tab it shows
            follow, drawn = handlers[api], inspector.redraw(name)(session, **CONTROLS)
            np.testing.assert_array_equal(follow(session, LATER_PANELS[name], **CONTROLS), drawn)
            assert follow(session, "Ablate & rank", **CONTROLS) == gr.skip()


def test_a_layer_or_head_change_redraws_the_heads_tab_only_while_it_is_shown(served):
    """The heatmaps (two matplotlib figures, ≈ 0.3 s each) and the ablated maps follow the layer and head
    sliders only on the Heads tab; its opening draws them (`overview`) for the sliders' values then."""
    inspector, handle, session, tab = served
    state = tab.ablate(session, None, "0:0", "zero", None, progress=Progress(), **CONTROLS)[0]
    moved = dict(CONTROLS, layer=3, head=1)
    gated = tab.redraw_if_shown("Heads")
    hidden = gated(session, state, "Attention", **moved)
    assert len(hidden) == len(tab.redraw(session, state, **moved)) and all(out == gr.skip() for out in hidden)
    redrawn, opened = tab.redraw(session, state, **moved), tab.overview(session, state, **moved)
    drawn = gated(session, state, "Heads", **moved)
    assert len(drawn) == len(redrawn) and redrawn[-1].ndim == 3 and redrawn[0].ndim == 3  # first-order, ablated map
    for shown_now, direct in zip(drawn, redrawn):
        np.testing.assert_array_equal(shown_now, direct)
    for direct, at_opening in zip(redrawn, [*opened[10:], opened[1], opened[2]]):  # the opening draws the same
        np.testing.assert_array_equal(direct, at_opening)
    assert not np.array_equal(redrawn[-1], tab.redraw(session, state, **CONTROLS)[-1])  # another cell outlined
    demo = build_demo(AppConfig(), ModelCache(loader=lambda *a, **k: None))
    shown = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "shown-tab")
    [redraw] = [dep for dep in demo.config["dependencies"] if dep["api_name"] == "heads_redraw"]
    assert redraw["inputs"][2] == shown._id


def test_distilled_and_headless_lens():
    from PIL import Image

    picture = Image.new("RGB", (32, 32), (120, 30, 200))
    distilled = tiny_handle("distilled")
    headers, rows, _ = lens_table(distilled, analyze_image(distilled, picture))
    assert len(rows) == 2 and "distillation: rank of final class" in headers and "class: top-5" in headers
    assert lens_widths(headers) == []  # ten columns at their own widths, scrolled with the first pinned
    from timm.models.vision_transformer import VisionTransformer

    from vit_inspect.core.timm_models import handle_from_timm

    headless = handle_from_timm(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                                                  num_classes=0).eval(), device="cpu")
    headers, rows, note = lens_table(headless, analyze_image(headless, picture))
    assert headers == ["note"] and "no classification head" in note


def test_the_ablated_pass_and_means_count_in_the_byte_budget(served):
    """The Heads tab's ablated pass and reference means sit in the app's byte-bounded store: they are
    counted, an eviction is told as a sentence on the next redraw, and a new class releases the old pass."""
    inspector, handle, session, tab = served
    before = inspector.store.held
    state = tab.ablate(session, None, "2:1", "mean", None, progress=Progress(), **CONTROLS)[0]
    ablated, means = state.ablated, state.means[1]
    grids = ROLLOUT_CACHE * ablated.layout.grid_h * ablated.layout.grid_w * 8  # rollouts cached after counting
    assert 0 <= before + ablated.nbytes() + means.values.nbytes - inspector.store.held <= grids
    again = tab.ablate(session, state, "2:2", "zero", None, progress=Progress(), **CONTROLS)[0]
    assert again.ablated_slot is state.ablated_slot  # one slot per session: the old pass is replaced
    assert 0 <= before + again.ablated.nbytes() + means.values.nbytes - inspector.store.held <= grids
    inspector.store.drop(again.ablated_slot)  # what an eviction does to make room for other visitors
    with pytest.raises(VitInspectError, match="dropped to make room"):
        tab.redraw(session, again, **CONTROLS)
    overview = tab.overview(session, again, **CONTROLS)
    assert overview[8] == DROPPED and overview[7] is None  # the effect says why; the stale top-5 is cleared
    other = replace(session, target=(5, None), slot=Detached({(5, None): session.result}))
    third = tab.ablate(session, again, "1:0", "zero", None, progress=Progress(), **CONTROLS)[0]
    tab.overview(other, third, **CONTROLS)  # another class: the ablated pass is released, the means kept
    assert third.ablated_slot.dropped and not third.means_slot.dropped
    assert inspector.store.held == before + means.values.nbytes
    inspector.store.drop(third.means_slot)
    assert inspector.store.held == before


def test_ablation_and_importance_run_under_zerogpu(monkeypatch, served):
    """On a ZeroGPU Space (a `spaces.GPU` stand-in here) both Heads passes run inside the decorator."""
    import sys
    import types

    from support.app import StandIn

    inspector, handle, session, _ = served
    stand_in = StandIn()
    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=stand_in))
    with gr.Blocks():
        tab = HeadsTab(inspector, (CHELSEA,), upload_folders, View.from_controls)
    assert stand_in.decorated == ["on_gpu", "on_gpu"]
    assert tab.run_ablated.__wrapped__ is analyze_ablated and tab.run_importance.__wrapped__ is importance_of_crop
    on_cpu = gpu_pass(importance_of_crop, decorator=stand_in, device="cpu")  # "cpu" stands in for the lent GPU
    ranked = on_cpu(handle, session.result.rgb, target=session.result.target, mode="zero", batch_size=16)
    pixels = handle.preprocess.normalize(session.result.rgb)
    expected = head_importance(handle, pixels, target=session.result.target, mode="zero", batch_size=16)
    assert stand_in.calls == 1
    np.testing.assert_allclose(ranked.logit_drop, expected.logit_drop, atol=1e-5)
