"""Methods added to the registry (a plugin's, or one registered in code) in the app: the All maps view draws
them at their defaults, once per pass; one with passes of its own waits for the toggle and says so; a failing
one is a sentence in a panel of its own; the Faithfulness tab scores them, leaving a failing one out with
its reason."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gradio")
from support.all_maps import CONTROLS, drawn, session_of  # noqa: E402

from vit_inspect.methods import Method, registry  # noqa: E402
from vit_inspect.ui.tabs.faithfulness import FaithfulnessTab  # noqa: E402


class Counted:
    """A method's compute that counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, context):
        self.calls += 1
        return self.fn(context)


def first_layer_twice(context):
    return 2.0 * context.result.attention_map(0)  # (grid_h, grid_w)


def logit_per_patch(context):
    """Its own forward: the target's logit, the same in every patch (a map easy to check by hand)."""
    logits = context.handle.forward(context.model_input())
    layout = context.result.layout
    return np.full((layout.grid_h, layout.grid_w), float(logits[0, context.target]))


def broken(context):
    raise RuntimeError("/secret/path/to/weights.bin is missing")


@pytest.fixture
def added_methods():
    cheap, dear, failing = Counted(first_layer_twice), Counted(logit_per_patch), Counted(broken)
    cheap.__module__ = dear.__module__ = failing.__module__ = "their_package"  # not vit_inspect's own
    shown = [Method(name="twice_first_layer", title="first layer's attention, doubled", unit="attention weight × 2",
                    paper="a test", reads="attention", compute=cheap),
             Method(name="own_logit", title="the logit, everywhere", unit="{score}", paper="a test",
                    reads="own passes", forwards=1, compute=dear, sanity=False),
             Method(name="always_fails", title="fails", unit="value", paper="a test", reads="attention",
                    compute=failing)]
    for method in shown:
        registry.register(method)
    yield cheap, dear, failing
    for method in shown:
        registry.unregister(method.name)


def test_all_maps_draws_added_methods_once_per_pass(added_methods, monkeypatch):
    cheap, dear, failing = added_methods
    inspector, handle, session = session_of()
    first = drawn(session, monkeypatch)
    assert "twice_first_layer" in first["names"] and "own_logit" not in first["names"]
    np.testing.assert_allclose(first["maps"]["twice_first_layer"], 2.0 * session.result.attention_map(0))
    assert first["units"]["twice_first_layer"] == "attention weight × 2"
    assert first["notes"]["own_logit"].startswith("own_logit: not computed (1 forward + 0 backward of its own per "
                                                  "map); tick 'Add AttnLRP and LeGrad")
    assert first["notes"]["always_fails"] == "always_fails: always_fails raised RuntimeError."  # no path shown
    assert dear.calls == 0 and failing.calls == 1 and cheap.calls == 1
    drawn(session, monkeypatch)  # a redraw: from the pass's kept maps, nothing computed again
    assert (cheap.calls, failing.calls, dear.calls) == (1, 1, 0)
    ticked, _ = inspector.set_relevance(session, True, progress=lambda *a, **k: None, **CONTROLS)
    assert dear.calls == 1
    after = drawn(ticked, monkeypatch)
    logit = float(handle.forward(handle.preprocess.normalize(ticked.result.rgb))[0, ticked.result.target])
    np.testing.assert_allclose(after["maps"]["own_logit"], logit, rtol=1e-6)
    assert after["units"]["own_logit"] == "logit" and "own_logit" not in after["notes"]
    assert after["picture"].shape[0] > 0 and dear.calls == 1


def test_faithfulness_scores_added_methods_and_names_the_failing_one(added_methods):
    cheap, dear, failing = added_methods
    inspector, handle, session = session_of()
    scored, _, rows, note = FaithfulnessTab._score(lambda key: handle, session, None, lambda *a, **k: None, {},
                                                   inspector.with_relevance)
    assert {"twice_first_layer", "own_logit"} <= set(scored.curves) and "always_fails" not in scored.curves
    assert "first layer's attention, doubled" in [row[0] for row in rows]  # named by its title
    assert "Left out: fails: always_fails raised RuntimeError." in note and "/secret" not in note
    assert dear.calls == 1  # computed once for the pass, with LeGrad and AttnLRP, and scored from there


def test_downloads_carry_the_added_maps_the_pass_holds(added_methods, tmp_path, monkeypatch):
    import json
    from pathlib import Path

    cheap, dear, failing = added_methods
    inspector, handle, session = session_of()
    _, paths, _ = inspector.downloads(session, **CONTROLS)
    files = {Path(path).suffix: Path(path) for path in paths}
    record = json.loads(files[".json"].read_text())
    arrays = np.load(files[".npz"])
    expected = 2.0 * session.result.attention_map(0)
    np.testing.assert_allclose(record["twice_first_layer"], np.round(expected, 6), atol=1e-6)
    np.testing.assert_allclose(arrays["twice_first_layer"], expected)
    assert "own_logit" not in record and record["left_out"]["own_logit"].startswith("own_logit: not computed")
    assert record["left_out"]["always_fails"] == "always_fails: always_fails raised RuntimeError."
    assert dear.calls == 0  # a download never runs a method's own passes
