"""A session's overlapping draws of one panel: the newest begun keeps the panel (vit_inspect.ui.ordering
and the app's handlers). Overlap is made deterministic with events, never with sleeps."""
from __future__ import annotations

import io
import threading
import types

import numpy as np
import pytest
from PIL import Image
from support import tiny_handle

from vit_inspect.core.geometry import InputGeometry
from vit_inspect.plots import distance as distance_plots
from vit_inspect.ui import inspector as inspector_module
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.demo import build_demo
from vit_inspect.ui.inspector import CLASS_PANELS, Inspector, Session
from vit_inspect.ui.model_cache import ModelCache
from vit_inspect.ui.ordering import DrawOrder, session_hash
from vit_inspect.ui.panels import IMAGE_PANELS
from vit_inspect.ui.view import PATCH, READOUT

pytestmark = pytest.mark.filterwarnings("ignore::Warning:gradio.queueing")  # Gradio's own pandas deprecations

CONTROLS = dict(layer=1, head=0, mean_heads=False, query=READOUT, row=0, col=0, head_fusion="mean",
                discard_ratio=0.0, first_layer=0, last_layer=1, gradcam_layer=1)


def request(session: str | None):
    return types.SimpleNamespace(session_hash=session)


def is_skip(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1


def test_the_newest_begun_draw_is_the_latest():
    order = DrawOrder()
    first = order.begin("a", "attention")
    second = order.begin("a", "attention")
    assert (first, second) == (1, 2)
    assert not order.is_latest("a", "attention", first) and order.is_latest("a", "attention", second)
    other_panel = order.begin("a", "rollout")
    other_session = order.begin("b", "attention")
    assert order.is_latest("a", "rollout", other_panel) and order.is_latest("b", "attention", other_session)
    assert order.is_latest("a", "attention", second), "another panel or session made this draw stale"
    order.supersede("a", ["attention", "rollout"])
    assert not order.is_latest("a", "attention", second) and not order.is_latest("a", "rollout", other_panel)
    assert order.is_latest("b", "attention", other_session)


def test_without_a_session_nothing_is_ever_stale():
    order = DrawOrder()
    ticket = order.begin(None, "attention")
    order.begin(None, "attention")
    assert ticket == 0 and order.is_latest(None, "attention", ticket) and len(order) == 0
    assert session_hash(None) is None and session_hash(request(7)) is None  # a forged non-string id is no id
    assert session_hash(request("abc")) == "abc"


def test_the_pairs_remembered_are_bounded_least_recent_first():
    order = DrawOrder(max_keys=2)
    old = order.begin("a", "attention")
    order.begin("b", "attention")
    order.begin("a", "attention")  # "a" is the most recent again
    order.begin("c", "attention")  # evicts "b"
    assert len(order) == 2
    assert order.is_latest("b", "attention", 1), "a forgotten pair shows its picture"
    assert not order.is_latest("a", "attention", old)
    with pytest.raises(ValueError):
        DrawOrder(max_keys=0)


def test_a_long_session_id_is_kept_as_a_digest():
    """A client chooses its session id: a megabyte of it costs the order 16 bytes, and ids differing
    only at their end stay apart."""
    order = DrawOrder()
    long, other = "x" * 2 ** 20 + "a", "x" * 2 ** 20 + "b"
    first = order.begin(long, "attention")
    second = order.begin(other, "attention")
    assert order.is_latest(long, "attention", first) and order.is_latest(other, "attention", second)
    assert {len(key[0]) for key in order._latest} == {16}
    order.begin("\ud800", "attention")  # a lone surrogate (JSON can carry one) is an id like any other
    assert len(order) == 3


@pytest.fixture(scope="module")
def served():
    handle = tiny_handle("cls")
    inspector = Inspector(AppConfig(spill_budget=0), ModelCache(loader=lambda *a, **k: handle))
    png = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(png, "PNG")
    result = inspector._pass(handle, png.getvalue(), InputGeometry())
    session = Session(model=inspector.default_key, source=png.getvalue(), name="noise.png",
                          slot=inspector.store.put({(result.target, None): result}, result.nbytes()),
                          target=(result.target, None),
                          distance=distance_plots.attention_distance_panel(result.mean_distance, image_width=32, title="t"),
                          labels=handle.labels, model_label="tiny", geometry=InputGeometry())
    return inspector, session


class Held:
    """draw_panels, with the first call held until `release` (after the caller's ticket was taken)."""

    def __init__(self):
        self.inside, self.release, self.calls = threading.Event(), threading.Event(), 0

    def __call__(self, names, session, view):
        self.calls += 1
        if self.calls == 1:
            self.inside.set()
            assert self.release.wait(30)
        return [f"{names[0]} at layer {view.layer}, {view.patch}" for _ in names]


def overtaken(monkeypatch, older, newer):
    """Run `older` until it draws, run `newer` to the end, then let `older` finish: (older's, newer's)."""
    held = Held()
    monkeypatch.setattr(inspector_module, "draw_panels", held)
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("older", older()))
    thread.start()
    assert held.inside.wait(30)
    out["newer"] = newer()
    held.release.set()
    thread.join(30)
    return out["older"], out["newer"]


def test_a_redraw_overtaken_by_a_newer_one_leaves_the_panel(served, monkeypatch):
    inspector, session = served
    draw = inspector.redraw("attention")
    older, newer = overtaken(monkeypatch, lambda: draw(session, request("s1"), **(CONTROLS | dict(layer=0))),
                             lambda: draw(session, request("s1"), **CONTROLS))
    assert is_skip(older) and newer == "attention at layer 1, None"
    # another session's draw does not make this one stale
    older, newer = overtaken(monkeypatch, lambda: draw(session, request("s1"), **(CONTROLS | dict(layer=0))),
                             lambda: draw(session, request("s2"), **CONTROLS))
    assert older == "attention at layer 0, None" and newer == "attention at layer 1, None"


def test_a_slider_redraw_overtaken_by_a_typed_patch_leaves_the_patch(served, monkeypatch):
    inspector, session = served
    draw = inspector.redraw("attention")
    older, newer = overtaken(monkeypatch, lambda: draw(session, request("s1"), **CONTROLS),
                             lambda: inspector.type_patch(session, request("s1"), **(CONTROLS | dict(row=1, col=2))))
    assert is_skip(older) and newer == (PATCH, "attention at layer 1, (1, 2)")
    # and the other way round: the typed patch's draw overtaken by a slider's redraw keeps its query switch only
    older, newer = overtaken(monkeypatch,
                             lambda: inspector.type_patch(session, request("s1"), **(CONTROLS | dict(row=1, col=2))),
                             lambda: draw(session, request("s1"), **(CONTROLS | dict(query=PATCH, row=1, col=3))))
    assert older[0] == PATCH and is_skip(older[1]) and newer == "attention at layer 1, (1, 3)"


def test_a_click_overtaken_by_a_newer_draw_changes_nothing(served, monkeypatch):
    inspector, session = served
    draw = inspector.redraw("attention")
    scale = 14  # a 32-pixel input's map is drawn 14 times as large, 448 pixels (`panels.main_scale`)
    click = types.SimpleNamespace(index=[20 * scale, 4 * scale])  # input pixel (y 4, x 20) -> patch (0, 2)
    older, newer = overtaken(monkeypatch, lambda: inspector.pick_patch(click, session, request("s1"), **CONTROLS),
                             lambda: draw(session, request("s1"), **CONTROLS))
    assert all(is_skip(value) for value in older) and len(older) == 4
    older, newer = overtaken(monkeypatch, lambda: draw(session, request("s1"), **CONTROLS),
                             lambda: inspector.pick_patch(click, session, request("s1"), **CONTROLS))
    assert is_skip(older) and newer == (0, 2, PATCH, "attention at layer 1, (0, 2)")


def test_direct_calls_are_never_skipped(served, monkeypatch):
    inspector, session = served
    draw = inspector.redraw("attention")
    older, newer = overtaken(monkeypatch, lambda: draw(session, **(CONTROLS | dict(layer=0))),
                             lambda: draw(session, **CONTROLS))
    assert older == "attention at layer 0, None" and newer == "attention at layer 1, None"


class Progress:
    def __call__(self, *args, **kwargs):
        pass


def test_a_redraw_of_the_previous_class_loses_to_the_new_class(served, monkeypatch):
    inspector, session = served
    draw = inspector.redraw("rollout")
    other = str((session.target[0] + 1) % 10)
    older, newer = overtaken(monkeypatch, lambda: draw(session, request("s1"), **CONTROLS),
                             lambda: inspector.set_target(session, other, "", Progress(), request("s1"), **CONTROLS))
    assert is_skip(older)
    assert newer[0].target == (int(other), None)
    assert newer[2:] == (f"{CLASS_PANELS[0]} at layer 1, None",) * len(CLASS_PANELS)  # one draw of them all


def test_the_served_app_orders_each_web_session_by_its_id(monkeypatch, tmp_path):
    """Gradio hands the handlers its Request (so draws are ordered per session), analyze included."""
    gradio_client = pytest.importorskip("gradio_client")
    from support.app import launch

    begun = []

    class Recording(DrawOrder):
        def begin(self, session, panel):
            begun.append((session, panel))
            return super().begin(session, panel)

    monkeypatch.setattr(inspector_module, "DrawOrder", Recording)
    handle = tiny_handle("cls")
    demo = build_demo(AppConfig(spill_budget=0), ModelCache(loader=lambda *a, **k: handle))
    try:
        client = gradio_client.Client(launch(demo), verbose=False)
        photo = tmp_path / "noise.png"
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(photo)
        client.predict(gradio_client.handle_file(str(photo)), api_name="/analyze")
        assert set(begun) == {(client.session_hash, name) for name in IMAGE_PANELS}
        begun.clear()
        client.predict(layer=0, api_name="/attention")
        client.predict(row=1, col=1, api_name="/type_patch")
        assert begun == [(client.session_hash, "attention")] * 2
    finally:
        demo.close()
