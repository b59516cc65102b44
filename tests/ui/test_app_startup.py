"""The server answers at once while the default model loads in the background; the page waits for it."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gradio_client import Client
from support.app import APP_MARKS, WEIGHTS, launch

import app
from vit_inspect.core.load import load_model
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.demo import build_demo
from vit_inspect.ui.model_cache import ModelCache

pytestmark = APP_MARKS  # the real weights' check and Gradio's warning filters


def test_port_opens_before_the_default_model_is_loaded():
    release = threading.Event()
    loads = []

    def slow_loader(*args, **kwargs):
        loads.append(args[0])
        assert release.wait(120), "the test never released the loader"
        return load_model(*args, **kwargs)

    config = AppConfig(weights=str(WEIGHTS), device="cpu")
    cache = ModelCache(config.cache_size, loader=slow_loader)
    threading.Thread(target=app.preload, args=(cache, config), daemon=True).start()  # what main() does
    demo = build_demo(config, cache)
    try:
        url = launch(demo)
        assert httpx.get(url, timeout=10).status_code == 200  # the page is served while the model loads
        client = Client(url, verbose=False)
        with ThreadPoolExecutor(1) as pool:
            status = pool.submit(client.predict, api_name="/startup")
            with pytest.raises(TimeoutError):
                status.result(timeout=1.0)  # the page waits (with a progress bar) for the model ...
            release.set()
            assert "12 layers × 3 heads" in status.result(timeout=120)[0]  # ... and shows it once loaded
        assert loads == ["deit_tiny_patch16_224"], "the model was loaded more than once"
    finally:
        release.set()
        demo.close()
