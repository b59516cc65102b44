"""Fixtures of the UI tests: the app served in-process (one server per test module) and a client per test
(random weights of timm's smallest ViT, `tiny_weights`, are in tests/conftest.py)."""
from __future__ import annotations

import pytest
from gradio_client import Client
from support.app import Server


@pytest.fixture(scope="module")
def server():
    served = Server()
    yield served
    served.demo.close()


@pytest.fixture
def client(server) -> Client:
    return Client(server.url, verbose=False)


@pytest.fixture(scope="module")
def clip_server(tmp_path_factory):
    """The app serving a tiny random OpenCLIP model through its own flags, `app.py --model
    open_clip:ViT-Tiny-8-test --weights FILE --zero-shot cat,dog,coffee`, in-process with its launch limits
    (the tiny architecture is registered with OpenCLIP here, as a plug-in config would be)."""
    pytest.importorskip("open_clip")
    from types import SimpleNamespace

    import app as app_module
    from support.app import free_port
    from support.clip import TINY_CLIP, make_clip, register_tiny_configs, save_clip

    from vit_inspect.ui.config import launch_limits
    from vit_inspect.ui.demo import build_demo

    register_tiny_configs()
    weights = save_clip(make_clip(seed=3), tmp_path_factory.mktemp("clip") / "tiny_clip.safetensors")
    config, _ = app_module.parse_args(["--model", f"open_clip:{TINY_CLIP}", "--weights", str(weights), "--device",
                                       "cpu", "--zero-shot", "cat,dog,coffee"])
    demo, port = build_demo(config), free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True,
                **launch_limits(config))  # as `python app.py` launches it: behind the request guard
    yield SimpleNamespace(url=f"http://127.0.0.1:{port}/", demo=demo, config=config)
    demo.close()
