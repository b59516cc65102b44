"""LeGrad and AttnLRP on demand in the app: the default pass is one forward and one backward, the All
maps toggle adds the two maps (equal to a one-pass ``analyze_image(relevance=True)``), later passes of a
ticked session compute them, the downloads and the Faithfulness tab say whether they were computed, the
Heads and Compare tabs never compute them, and the toggle runs under the ZeroGPU wrapper. Handlers are
called directly with the real DeiT-Ti weights (one model, the tiny one where only wiring is checked)."""
from __future__ import annotations

import base64
import io
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from support import REPO, tiny_handle

gr = pytest.importorskip("gradio")
from vit_inspect.core.geometry import InputGeometry  # noqa: E402
from vit_inspect.core.images import ImageLimits  # noqa: E402
from vit_inspect.methods import added  # noqa: E402
from vit_inspect.passes.options import PassOptions  # noqa: E402
from vit_inspect.passes.pipeline import add_relevance, analyze_image  # noqa: E402
from vit_inspect.studies.faithfulness import faithfulness_methods  # noqa: E402
from vit_inspect.ui.common import upload_folders
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.inspector import Inspector, Session, results_nbytes
from vit_inspect.ui.model_cache import ModelCache  # noqa: E402
from vit_inspect.ui.panels import draw_panels
from vit_inspect.ui.relevance import computed, dear_methods, relevance_words, toggle_label  # noqa: E402
from vit_inspect.ui.session_store import DROPPED, SessionStore  # noqa: E402
from vit_inspect.ui.tabs.compare import CompareTab as Compare  # noqa: E402
from vit_inspect.ui.tabs.faithfulness import FaithfulnessTab  # noqa: E402
from vit_inspect.ui.tabs.heads import HeadsTab  # noqa: E402
from vit_inspect.ui.view import READOUT, View
from vit_inspect.ui.zerogpu import gpu_pass  # noqa: E402

OWN = sum(m.forwards for m in dear_methods().values())  # forwards of the installed plugins' own, per pass

pytestmark = pytest.mark.slow  # served app, many passes with relevance

WEIGHTS = REPO / "checkpoints" / "deit_tiny_patch16_224.safetensors"
CHELSEA = REPO / "assets" / "chelsea.png"
CONTROLS = dict(layer=11, head=0, mean_heads=False, query=READOUT, row=0, col=0, head_fusion="mean",
                discard_ratio=0.0, first_layer=0, last_layer=11, gradcam_layer=11)
TABBY, TIGER = 281, 282

real = pytest.mark.skipif(not WEIGHTS.is_file(), reason=f"real DeiT-Ti weights not found at {WEIGHTS}")


def progress(*args, **kwargs) -> None:
    """gr.Progress stand-in."""


def data_url(path: Path) -> dict:
    """An upload as a client may send it: a base64 data URL (no file on this server)."""
    return {"url": "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode(), "orig_name": path.name}


class Calls:
    """Counts the model's forwards and every autograd backward (`backward` and `grad`) while active."""

    def __init__(self, handle, monkeypatch):
        self.forwards = self.backwards = 0
        handle.model.register_forward_pre_hook(self._forward)
        for name in ("backward", "grad"):
            original = getattr(torch.autograd, name)
            monkeypatch.setattr(torch.autograd, name, self._counted(original))

    def _forward(self, module, args) -> None:
        self.forwards += 1

    def _counted(self, original):
        def counted(*args, **kwargs):
            self.backwards += 1
            return original(*args, **kwargs)
        return counted

    def reset(self) -> None:
        self.forwards = self.backwards = 0


@pytest.fixture
def served(monkeypatch):
    """(Inspector on DeiT-Ti, its handle, call counts, a new session on chelsea.png from `analyze`)."""
    inspector = Inspector(AppConfig(weights=str(WEIGHTS), device="cpu"), ModelCache(1))
    handle = inspector.handle(inspector.default_key)
    calls = Calls(handle, monkeypatch)
    session, *_ = inspector.analyze(data_url(CHELSEA), inspector.default_key, None, None, progress=progress,
                                    **CONTROLS)
    return inspector, handle, calls, session


@real
def test_the_default_pass_is_one_forward_and_one_backward_without_relevance(served):
    inspector, handle, calls, session = served
    assert (calls.forwards, calls.backwards) == (1, 1)  # no LeGrad block backwards, no AttnLRP backward
    result = session.result
    assert result.legrad is None and result.attnlrp is None and result.chefer is not None
    assert not session.relevance and not computed(session)
    assert relevance_words(session) == f"AttnLRP and LeGrad: not computed; tick '{toggle_label()}' to add them"
    ticked, *_ = inspector.analyze(data_url(CHELSEA), inspector.default_key, None, None, progress=progress,
                                   **CONTROLS, relevance=True)
    assert ticked.relevance and ticked.result.attnlrp is not None and relevance_words(ticked) == ""
    with pytest.raises(gr.Error, match="must be true or false"):
        inspector.analyze(data_url(CHELSEA), inspector.default_key, None, None, progress=progress, **CONTROLS,
                          relevance="yes")


@real
def test_ticking_adds_the_one_pass_maps_and_keeps_them_for_later_passes(served):
    inspector, handle, calls, session = served
    plain = draw_panels(("compare",), session, View.from_controls(session.result, **CONTROLS))[0]
    calls.reset()
    ticked, figure = inspector.set_relevance(session, True, progress=progress, **CONTROLS)
    assert calls.forwards == 1 + OWN and ticked.relevance and computed(ticked)
    one_pass = analyze_image(handle, CHELSEA, geometry=InputGeometry(), relevance=True)
    np.testing.assert_array_equal(ticked.result.legrad, one_pass.legrad)
    np.testing.assert_array_equal(ticked.result.attnlrp, one_pass.attnlrp)
    assert ticked.result.target == one_pass.target == 285
    assert figure.shape[1] == plain.shape[1] and not np.array_equal(figure, plain)  # LeGrad and AttnLRP drawn too
    assert inspector.store.held == ticked.slot.nbytes == results_nbytes(ticked.results)
    assert session.result.attnlrp is not None  # one slot per session: the stored pass now holds them
    calls.reset()
    inspector.set_relevance(ticked, True, progress=progress, **CONTROLS)
    assert calls.forwards == 0  # already computed
    # a class change while ticked: one pass, which computes them in its own forward
    calls.reset()
    tabby, *_ = inspector.set_target(ticked, str(TABBY), "", progress=progress, **CONTROLS)
    assert calls.forwards == 1 + OWN and tabby.relevance and tabby.target == (TABBY, None)
    np.testing.assert_array_equal(tabby.result.attnlrp, analyze_image(
        handle, CHELSEA, target=TABBY, geometry=InputGeometry(), relevance=True).attnlrp)
    # unticked: later passes leave them out and the figure says so; maps computed before stay
    calls.reset()
    unticked, _ = inspector.set_relevance(tabby, False, progress=progress, **CONTROLS)
    assert calls.forwards == 0 and not unticked.relevance and unticked.result.attnlrp is not None
    tiger, *_ = inspector.set_target(unticked, str(TIGER), "", progress=progress, **CONTROLS)
    assert calls.backwards == 1 and tiger.result.attnlrp is None and "not computed" in relevance_words(tiger)
    back, *_ = inspector.set_target(tiger, str(TABBY), "", progress=progress, **CONTROLS)
    assert calls.forwards == 1 and back.result.attnlrp is not None  # the cached pass keeps its maps
    # ticked again on a cached pass without them: added once
    calls.reset()
    retick, _ = inspector.set_relevance(tiger, True, progress=progress, **CONTROLS)
    assert calls.forwards == 1 + OWN and retick.result.legrad is not None


def drawn_all_maps(session, monkeypatch) -> dict:
    """The All maps figure's title and panel names, as `draw_panels` hands them to the plotting code."""
    from vit_inspect.plots import maps as map_plots

    seen = {}
    real_figure = map_plots.maps_panel

    def recording(rgb, maps, **kwargs):
        seen.update(title=kwargs["title"], names=list(maps))
        return real_figure(rgb, maps, **kwargs)

    monkeypatch.setattr(map_plots, "maps_panel", recording)
    draw_panels(("compare",), session, View.from_controls(session.result, **CONTROLS))
    return seen


@real
def test_the_all_maps_title_says_when_the_two_maps_are_absent(served, monkeypatch):
    inspector, handle, calls, session = served
    plain = drawn_all_maps(session, monkeypatch)
    assert plain["title"].endswith(f"\nAttnLRP and LeGrad: not computed; tick '{toggle_label()}' to add them")
    assert not {"LeGrad", "AttnLRP"} & set(plain["names"])
    ticked, _ = inspector.set_relevance(session, True, progress=progress, **CONTROLS)
    full = drawn_all_maps(ticked, monkeypatch)
    built_in = [name for name in full["names"] if name not in added()]  # the plugins' maps follow
    assert "AttnLRP" not in full["title"] and built_in[-2:] == ["LeGrad", "AttnLRP"]
    versus, *_ = inspector.set_target(ticked, "285", str(TABBY), progress=progress, **CONTROLS)
    assert versus.target == (285, TABBY) and versus.result.contrast == TABBY
    # LeGrad and AttnLRP explain the class alone (no contrast): equal to the class's own maps, and titled so
    np.testing.assert_array_equal(versus.result.attnlrp, ticked.result.attnlrp)
    names = [name for name in drawn_all_maps(versus, monkeypatch)["names"] if name not in added()]
    assert names[-1] == "AttnLRP, class Egyptian cat (#285) alone"


@real
def test_downloads_record_whether_the_two_maps_were_computed(served):
    inspector, handle, calls, session = served

    def record(current):
        files = {Path(p).suffix: Path(p) for p in inspector.downloads(current, **CONTROLS)[1]}  # basis, files, note
        with np.load(files[".npz"]) as arrays:
            return json.loads(files[".json"].read_text()), dict(arrays)

    plain, arrays = record(session)
    assert plain["settings"]["relevance"] is False and plain["legrad"] is None and plain["attnlrp"] is None
    assert "legrad" not in arrays and "attnlrp" not in arrays and arrays["chefer"].shape == (14, 14)
    assert json.loads(str(arrays["settings_json"]))["relevance"] is False
    ticked, _ = inspector.set_relevance(session, True, progress=progress, **CONTROLS)
    full, arrays = record(ticked)
    assert full["settings"]["relevance"] is True and np.asarray(full["attnlrp"]).shape == (14, 14)
    np.testing.assert_array_equal(arrays["legrad"], ticked.result.legrad)
    np.testing.assert_array_equal(arrays["attnlrp"], ticked.result.attnlrp)


@real
def test_an_evicted_result_is_a_sentence_and_bad_values_are_refused(served):
    inspector, handle, calls, session = served
    with pytest.raises(gr.Error, match="must be true or false"):
        inspector.set_relevance(session, "abc", progress=progress, **CONTROLS)
    with pytest.raises(gr.Error, match="must be true or false"):
        inspector.set_relevance(session, [1], progress=progress, **CONTROLS)
    assert inspector.set_relevance(None, True, progress=progress, **CONTROLS) == (gr.skip(), gr.skip())
    session.slot.release()  # as the store does when other visitors need the room
    calls.reset()
    with pytest.raises(gr.Error) as error:
        inspector.set_relevance(session, True, progress=progress, **CONTROLS)
    assert error.value.message == DROPPED and calls.forwards == 0


# ----------------------------------------------------------------- wiring, on a tiny model


def tiny_inspector():
    handle = tiny_handle("cls")
    inspector = Inspector(AppConfig(device="cpu"), ModelCache(loader=lambda *a, **k: handle))
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 40, 3), dtype=np.uint8))
    key = inspector.default_key
    result = inspector._pass(handle, picture, InputGeometry())
    session = Session(model=key, source=picture, name="noise.png", target=(result.target, None),
                          slot=inspector.store.put({(result.target, None): result}, result.nbytes()),
                          distance=None, labels=handle.labels, model_label="tiny")
    return inspector, handle, picture, session


def test_faithfulness_adds_the_two_maps_before_scoring():
    inspector, handle, picture, session = tiny_inspector()
    assert session.result.attnlrp is None
    scored, _, rows, note = FaithfulnessTab._score(lambda key: handle, session, None, progress, {},
                                                   inspector.with_relevance)
    scored_names = list(faithfulness_methods())  # the random floor, the built-ins and the installed plugins
    assert {"legrad", "attnlrp"} <= set(scored.curves) and len(rows) == len(scored_names)
    assert "Not scored" not in note
    expected = add_relevance(handle, session.result, picture, geometry=InputGeometry())
    np.testing.assert_array_equal(session.result.attnlrp, expected.attnlrp)  # kept in the session's slot
    # without the on-demand path the note names the two maps it could not score
    bare, _, rows, note = FaithfulnessTab._score(lambda key: handle, replace_result(session), None, progress, {})
    assert "legrad" not in bare.curves and len(rows) == len(scored_names) - 2
    assert "Not scored: LeGrad (Bousselham et al. 2025); AttnLRP (Achtibat et al. 2024) (not computed" in note


def replace_result(session):
    """A session whose pass lacks LeGrad and AttnLRP (a fresh slot of the same store)."""
    from dataclasses import replace as dc_replace

    result = dc_replace(session.result, legrad=None, attnlrp=None)
    return dc_replace(session, slot=SessionStore(10 ** 9).put({session.target: result}, 1), relevance_for=frozenset())


def test_the_toggle_runs_under_the_zerogpu_wrapper(monkeypatch):
    from support.app import StandIn

    inspector, handle, picture, session = tiny_inspector()
    stand_in = StandIn()
    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=stand_in))
    on_space = Inspector(AppConfig(device="cpu"), ModelCache(loader=lambda *a, **k: handle))
    assert on_space.run_relevance.__wrapped__ is add_relevance and getattr(on_space.run_relevance, "on_gpu", False)
    assert stand_in.decorated == ["on_gpu", "on_gpu"]  # the pass and the relevance pass
    inspector.run_relevance = gpu_pass(add_relevance, decorator=stand_in, device="cpu")  # cpu stands in for the GPU
    calls = stand_in.calls
    controls = dict(CONTROLS, layer=1, last_layer=1, gradcam_layer=1)
    ticked, figure = inspector.set_relevance(session, True, progress=progress, **controls)
    assert stand_in.calls == calls + 1 and ticked.result.attnlrp is not None and figure.ndim == 3


def test_heads_and_compare_passes_leave_the_two_maps_out():
    inspector, handle, picture, session = tiny_inspector()
    seen = []

    def recording(fn):
        def run(*args, **kwargs):  # whether this pass computes them: its `PassOptions`, or a keyword override
            options = kwargs.get("options") or next((a for a in args if isinstance(a, PassOptions)), None)
            seen.append(kwargs.get("relevance", getattr(options, "relevance", None)))
            return fn(*args, **kwargs)
        return run

    with gr.Blocks():
        tab = HeadsTab(inspector, (CHELSEA,), upload_folders, View.from_controls)
    from vit_inspect.studies.ablation import analyze_ablated

    tab.run_ablated = recording(analyze_ablated)
    controls = dict(CONTROLS, layer=1, last_layer=1, gradcam_layer=1)
    state, *_ = tab.ablate(session, None, "0:0", "zero", None, progress=progress, **controls)
    assert seen == [False] and state.ablated.attnlrp is None and state.ablated.legrad is None

    handles = {"a": tiny_handle("cls"), "b": tiny_handle("reg4")}
    seen.clear()
    compare_app = SimpleNamespace(store=SessionStore(10 ** 9), run_pass=recording(analyze_image),
                                  handle=handles.__getitem__, config=SimpleNamespace(limits=ImageLimits()))
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    slot = Compare(compare_app, upload_source=lambda image, max_bytes: (image, "p.png")).run(
        buffer.getvalue(), "a", "b", "", 0.6, False, 0.5, progress=progress)[1]  # its basis, then its slot
    assert seen == [False, False] and slot.get().comparison.a.attnlrp is None
