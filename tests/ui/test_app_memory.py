"""The app's byte budget end to end: a second visitor's result pushes the first one's out, and the first
visitor is told to re-run, never shown an error page or the other visitor's maps."""
from __future__ import annotations

import numpy as np
import pytest
from support.app import CHELSEA, WEIGHTS, analyze, launch, pixels

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from vit_inspect.passes.pipeline import analyze_image  # noqa: E402
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.demo import build_demo
from vit_inspect.ui.model_cache import CacheKey, ModelCache  # noqa: E402
from vit_inspect.ui.session_store import module_nbytes  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not WEIGHTS.is_file(), reason=f"real DeiT-Ti weights not found at {WEIGHTS}"),
    pytest.mark.filterwarnings("ignore::Warning:gradio.queueing"),
]


@pytest.mark.slow  # sessions filling the byte budget
def test_an_evicted_session_is_told_to_rerun(tmp_path):
    config = AppConfig(weights=str(WEIGHTS), device="cpu")
    cache = ModelCache(config.cache_size)
    handle = cache.get(CacheKey.of(config.model, config.weights, config.device))
    # the model plus room for one DeiT-Ti result (about 3.5 MB), not two
    one = analyze_image(handle, CHELSEA).nbytes()
    config = AppConfig(weights=str(WEIGHTS), device="cpu", memory_budget=module_nbytes(handle.model) + int(1.5 * one))
    demo = build_demo(config, cache)
    url = launch(demo)
    try:
        first, second = Client(url, verbose=False), Client(url, verbose=False)
        analyze(first)
        before = pixels(first.predict(layer=3, head=1, api_name="/attention"))
        flipped = tmp_path / "flipped.png"
        from PIL import Image
        Image.fromarray(pixels(str(CHELSEA))[:, ::-1].copy()).save(flipped)
        theirs = analyze(second, flipped)
        with pytest.raises(AppError, match="dropped to make room.*re-run"):
            first.predict(layer=3, head=1, api_name="/attention")
        assert pixels(second.predict(layer=3, head=1, api_name="/attention")).shape == before.shape
        again = analyze(first)  # re-running brings the first visitor back (and drops the second)
        assert not np.array_equal(pixels(again["attention"]), pixels(theirs["attention"]))
        assert np.array_equal(pixels(first.predict(layer=3, head=1, api_name="/attention")), before)
    finally:
        demo.close()
