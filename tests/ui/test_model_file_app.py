"""A hand-written model in the app and the CLI: only the operator's --model-file is ever imported; the page
can never name a Python file (a marker module proves nothing was imported). Random weights, in-process."""
from __future__ import annotations

import json
import socket

import pytest
from support import REPO
from support.app import refused

gradio_client = pytest.importorskip("gradio_client")
import gradio as gr
from gradio_client import Client, handle_file  # noqa: E402

import app  # noqa: E402
from vit_inspect.cli.main import main as cli_main  # noqa: E402
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.demo import build_demo
from vit_inspect.ui.inspector import Inspector
from vit_inspect.ui.model_cache import (
    CacheKey,
    ModelCache,  # noqa: E402
)

TOY = f"{REPO / 'examples' / 'toy_vit.py'}:build"
CHELSEA = REPO / "assets" / "chelsea.png"
REFUSED = "Models defined in Python files cannot be loaded from this page"

pytestmark = pytest.mark.filterwarnings("ignore::Warning:gradio.queueing")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def served():
    """The app started as `python app.py --model-file examples/toy_vit.py:build --device cpu` would start it."""
    config, _ = app.parse_args(["--model-file", TOY, "--device", "cpu"])
    cache = ModelCache(config.cache_size)
    demo = build_demo(config, cache)
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    yield config, cache, f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture
def marker_module(tmp_path):
    """A Python file that would build a model and leaves a marker file if it is ever imported."""
    marker = tmp_path / "imported.txt"
    module = tmp_path / "evil_model.py"
    module.write_text(f"open({str(marker)!r}, 'w').write('imported')\n"
                      f"exec(open({str(REPO / 'examples' / 'toy_vit.py')!r}).read())\n")
    return module, marker


def test_the_operators_model_file_is_served(served):
    config, cache, url = served
    assert config.model == "toy_vit.py:build" and config.model_file == TOY
    client = Client(url, verbose=False)
    status = client.predict("toy_vit.py:build", None, api_name="/load_model")[0]
    assert "toy_vit.py:build" in status and "4×4-pixel patches on a 8×8 grid" in status
    assert str(REPO) not in status  # no server folder in the page
    predictions = client.predict(handle_file(str(CHELSEA)), api_name="/analyze")[0]
    labels = {c["label"].split(" (#")[0] for c in predictions["confidences"]}
    assert labels <= {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"}
    assert [k.name for k in cache.keys()] == ["toy_vit.py:build"]


@pytest.mark.parametrize("form", ["{module}:build", "{module}", "evil_model.py:build", "examples/toy_vit.py:build"])
def test_the_page_can_never_name_a_python_file(served, marker_module, form):
    _, cache, url = served
    module, marker = marker_module
    name = form.format(module=module)
    assert REFUSED in refused(Client(url, verbose=False), name, None, api_name="/load_model")
    assert not marker.exists()
    assert all(k.name == "toy_vit.py:build" for k in cache.keys())


def test_an_app_without_model_file_refuses_python_files_and_loads_nothing(marker_module):
    module, marker = marker_module

    def no_loading(*args, **kwargs):
        raise AssertionError(f"a model was loaded for {args} {kwargs}")

    inspector = Inspector(AppConfig(device="cpu"), ModelCache(loader=no_loading))
    for name in (f"{module}:build", str(module), "examples/toy_vit.py:build"):
        with pytest.raises(gr.Error, match=REFUSED):
            inspector.load_model(name, None)
    assert not marker.exists()
    assert CacheKey.of("deit_tiny_patch16_224") == inspector.default_key  # the default is untouched


@pytest.mark.parametrize("name, sentence", [
    ("open_clip:ViT-B-32:openai", "This app loads OpenCLIP models only when its operator starts it with --model "
                                  "open_clip:NAME."),
    ("deit_tiny_patch16_224:latest", "'deit_tiny_patch16_224:latest' is not a valid model name."),
])
def test_a_name_with_a_colon_gets_the_sentence_that_fits_it(name, sentence):
    """Every name with a colon was answered as a Python file; only a '.py' name is one."""
    inspector = Inspector(AppConfig(device="cpu"), ModelCache())
    with pytest.raises(gr.Error) as refused:
        inspector.load_model(name, None)
    assert sentence in refused.value.message and REFUSED not in refused.value.message


def test_bad_model_file_flag_is_a_command_line_error(capsys):
    with pytest.raises(SystemExit):
        app.parse_args(["--model-file", "examples/toy_vit.txt"])
    assert "FILE.py:FUNCTION" in capsys.readouterr().err


def test_cli_model_and_analyze_take_model_file(capsys, tmp_path):
    assert cli_main(["model", "--model-file", TOY, "--device", "cpu", "--components", "5"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["model"] == "toy_vit.py:build"
    components = record["filter_pca"]["components"]
    assert (len(components), len(components[0]), len(components[0][0]), len(components[0][0][0])) == (5, 4, 4, 3)
    assert cli_main(["analyze", str(CHELSEA), "--model-file", TOY, "--device", "cpu", "--out", str(tmp_path)]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["grid"] == [8, 8] and record["patch_size"] == [4, 4] and len(record["gradcam"]) == 8
    assert (tmp_path / "chelsea_maps.png").is_file()
