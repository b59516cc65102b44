"""The Compare tab keeps its comparison in the app's byte-bounded session store and runs its passes
through the app's pass (the ZeroGPU wrapper), like the main tab: gr.State holds only a slot, the bytes
are counted, and an evicted comparison answers with a sentence."""
from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("gradio")

from support import tiny_handle

from vit_inspect.core.images import ImageLimits  # noqa: E402
from vit_inspect.passes.pipeline import analyze_image  # noqa: E402
from vit_inspect.ui.session_store import ResultDropped, SessionStore, Slot  # noqa: E402
from vit_inspect.ui.tabs.compare import CompareTab as Compare  # noqa: E402


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def test_comparison_lives_in_the_store_and_runs_through_the_apps_pass():
    handles = {"a": tiny_handle("cls"), "b": tiny_handle("reg4")}
    passes = []

    def run_pass(handle, *args, **kwargs):
        passes.append((handle.name, kwargs.get("gradients", True)))
        return analyze_image(handle, *args, **kwargs)

    store = SessionStore(10 ** 9)
    app = SimpleNamespace(store=store, run_pass=run_pass, handle=handles.__getitem__,
                          config=SimpleNamespace(limits=ImageLimits()))
    compare = Compare(app, upload_source=lambda image, max_bytes: (image, "photo.png"))
    outputs = compare.run(_png(), "a", "b", "", 0.6, False, 0.5, progress=lambda *a, **k: None)
    made_from, slot = outputs[:2]  # what it was computed from (`ui.stale`), then where it is held
    assert made_from.model == "a" and made_from.extra == "b" and made_from.image is None  # no session here
    assert isinstance(slot, Slot) and len(passes) == 2 and all(grad for _, grad in passes)
    state = slot.get()
    assert store.held == slot.nbytes == state.nbytes() > state.comparison.nbytes()
    assert len(compare.relayer(slot, 0)) == 3  # a redraw reads the store, no pass
    assert len(passes) == 2
    store.put("another visitor", 10 ** 9)  # the whole budget: the comparison is dropped
    with pytest.raises(ResultDropped, match="dropped to make room"):
        compare.relayer(slot, 0)
