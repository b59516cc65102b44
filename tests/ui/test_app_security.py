"""A public Space: concurrent users get their own answers, uploads cannot name server files,
weights uploads never run code, limits are configurable, and the server binds to loopback."""
from __future__ import annotations

import json
import pickle
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from support import IMAGENET, PHOTOS
from support.app import CATS, WEIGHTS, Server, analyze, pixels, queue_call, refusal, refused
from support.hostile import corpus

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

import app  # noqa: E402
from vit_inspect.ui.common import own_upload_folder, upload_folders
from vit_inspect.ui.config import AppConfig, launch_limits
from vit_inspect.ui.demo import build_demo
from vit_inspect.ui.inspector import Inspector
from vit_inspect.ui.request_guard import RequestGuard
from vit_inspect.ui.untrusted import NOT_AVAILABLE

pytestmark = [
    pytest.mark.skipif(not WEIGHTS.is_file(), reason=f"real DeiT-Ti weights not found at {WEIGHTS}"),
    pytest.mark.filterwarnings("ignore::Warning:gradio.queueing"),
]

CLIENTS, REQUESTS = 8, 5


def images() -> list[Path]:
    """Eight different photos: the six assets and two ImageNet samples (or assets again if absent)."""
    extra = sorted(IMAGENET.glob("*.JPEG"))[:2] if IMAGENET.is_dir() else []
    photos = sorted(PHOTOS.glob("*.png")) + sorted(PHOTOS.glob("*.jpg")) + extra
    return (photos * 2)[:CLIENTS]


def answer(client: Client, path: Path, layer: int) -> tuple[dict, np.ndarray]:
    """One user's request: analyse the image, then redraw the attention of `layer` from the session."""
    result = analyze(client, path)
    attention = client.predict(layer=layer, head=1, api_name="/attention")
    labels = {c["label"]: round(c["confidence"], 4) for c in result["predictions"]["confidences"]}
    return labels, pixels(attention)


@pytest.mark.slow  # 8 clients at once
def test_concurrent_clients_get_their_own_answers(server):
    photos = images()
    expected = {(str(p), layer): answer(Client(server.url, verbose=False), p, layer)
                for p in photos for layer in (3,)}

    def user(index: int) -> list[str]:
        client = Client(server.url, verbose=False)
        problems = []
        for request in range(REQUESTS):
            path = photos[(index + request) % len(photos)]
            labels, attention = answer(client, path, 3)
            want_labels, want_attention = expected[(str(path), 3)]
            if labels != want_labels or not np.array_equal(attention, want_attention):
                problems.append(f"client {index} request {request}: answer for {path.name} differs")
        return problems

    with ThreadPoolExecutor(CLIENTS) as pool:
        problems = [p for found in pool.map(user, range(CLIENTS)) for p in found]
    assert problems == []


@pytest.mark.parametrize("path", ["/etc/passwd", str(WEIGHTS), "../../../../etc/hostname"])
def test_a_forged_upload_path_outside_gradios_folder_is_refused(server, path):
    """The image events skip Gradio's preprocessing, but Gradio still checks every file path a client
    sends is inside its own upload folder; the handler never reads the named file."""
    forged = {"path": path, "orig_name": "cat.png", "meta": {"_type": "gradio.FileData"}}
    client = Client(server.url, verbose=False)
    inputs = len(next(d for d in client.config["dependencies"] if d.get("api_name") == "analyze")["inputs"])
    message = queue_call(client, "analyze", [forged] + [None] * (inputs - 1))
    assert message["success"] is False or NOT_AVAILABLE in refusal(message["output"]["data"])  # Gradio's, or ours
    assert "root:" not in json.dumps(message)


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('pwned')",)


def test_weights_upload_refuses_pickles_and_runs_nothing(server, tmp_path):
    marker = tmp_path / "payload_ran"
    evil = tmp_path / "evil.pth"
    evil.write_bytes(pickle.dumps({"model": {"w": _Payload(str(marker))}}))
    client = Client(server.url, verbose=False)
    assert ".safetensors" in refused(client, "deit_tiny_patch16_224", handle_file(str(evil)), api_name="/load_model")
    renamed = tmp_path / "evil.safetensors"  # the same pickle behind a safetensors name
    renamed.write_bytes(evil.read_bytes())
    assert "not a valid safetensors" in refused(client, "deit_tiny_patch16_224", handle_file(str(renamed)),
                                                api_name="/load_model")
    assert not marker.exists()
    assert analyze(client)["predictions"]["label"].startswith(CATS)


def test_a_weights_upload_of_too_many_tensors_is_refused_with_a_sentence(server, tmp_path):
    import torch
    from safetensors.torch import save_file

    many = tmp_path / "many.safetensors"
    save_file({f"t{i}": torch.zeros(1) for i in range(10_001)}, str(many))
    client = Client(server.url, verbose=False)
    message = refused(client, "deit_tiny_patch16_224", handle_file(str(many)), api_name="/load_model")
    assert message.startswith("'many.safetensors' lists 10,001 tensors, more than the 10,000")
    assert "Traceback" not in message and str(tmp_path) not in message
    assert analyze(client)["predictions"]["label"].startswith(CATS)


@pytest.mark.parametrize("name, message", [
    ("resnet50", "not a Vision Transformer"),
    ("no_such_model_at_all", "Unknown model"),
    ("__import__('os').system('id')", "not a valid model name"),
    ("someone/unreachable-model", "Hugging Face model config"),
    ("/etc", "not a valid model name"),
])
def test_model_names_are_validated_never_evaluated(server, name, message):
    client = Client(server.url, verbose=False)
    assert message in refused(client, name, None, api_name="/load_model")


def test_the_hostile_image_corpus_through_the_app(server, tmp_path):
    """Each file of the corpus is analysed or refused with our message, and the app keeps answering."""
    client = Client(server.url, verbose=False)
    for name, (data, expectation) in sorted(corpus().items()):
        path = tmp_path / name
        path.write_bytes(data)
        if isinstance(expectation, str):
            assert expectation in refusal(tuple(analyze(client, path).values())), name
        else:
            assert analyze(client, path)["predictions"]["confidences"], name
    assert analyze(client)["predictions"]["label"].startswith(CATS)


def test_the_server_keeps_its_files_in_a_folder_of_its_own(monkeypatch, tmp_path):
    """Gradio names served files by their content in one folder that, by default, every Gradio process
    of the machine shares, and a stopping server deletes all it served: `python app.py` (and this test
    run, see conftest) takes a folder of its own, so another server stopping cannot break its links."""
    import os

    GRADIO_FOLDER = os.environ["GRADIO_TEMP_DIR"]  # the test run's own folder (tests/conftest.py)
    from gradio import utils as gradio_utils

    assert gradio_utils.get_upload_folder() == GRADIO_FOLDER  # set before gradio was imported

    monkeypatch.delenv("GRADIO_TEMP_DIR")
    shared = gradio_utils.get_upload_folder()  # what Gradio would use: /tmp/gradio
    seen = {}

    class Built(Exception):
        pass

    def build(config, cache):
        seen["folder"] = os.environ.get("GRADIO_TEMP_DIR")
        seen["gate"] = upload_folders()
        raise Built

    monkeypatch.setattr("sys.argv", ["app.py"])
    monkeypatch.setattr(Inspector, "handle", lambda self, key: None)  # no model needed here
    monkeypatch.setattr(app, "build_demo", build)
    with pytest.raises(Built):
        app.main()
    own = seen["folder"]
    try:
        assert own and Path(own).is_dir() and os.path.realpath(own) != os.path.realpath(shared)
        assert Path(own).name.startswith("vit_inspect_gradio_") and seen["gate"] == [own]
        assert (Path(own).stat().st_mode & 0o077) == 0  # only this user may read or plant files there
    finally:
        shutil.rmtree(own, ignore_errors=True)

    chosen = tmp_path / "operator"  # an operator's own choice is kept
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(chosen))
    assert own_upload_folder() == str(chosen)


def test_limits_and_loopback_defaults():
    config, args = app.parse_args([])
    assert args.host == "127.0.0.1" and not args.share
    assert config.limits.max_pixels == 40_000_000 and config.limits.max_bytes == 30 * 2**20
    limits = launch_limits(config)
    (guard,) = limits.pop("app_kwargs")["middleware"]
    assert limits == {"max_file_size": "30mb", "state_session_capacity": 100, "run_history": False}
    assert guard.cls is RequestGuard and guard.kwargs == {"max_body": 40 * 2**20 + 2**20}  # 30 MiB x 4/3 + 1 MiB
    config, _ = app.parse_args(["--max-upload-mb", "2", "--max-image-pixels", "1000000", "--max-sessions", "7"])
    assert config.limits.max_bytes == 2 * 2**20 and config.limits.max_pixels == 1_000_000
    limits = launch_limits(config)
    assert limits.pop("app_kwargs")["middleware"][0].kwargs == {"max_body": 3_844_779}  # ceil(2 MiB x 4/3) + 1 MiB
    assert limits == {"max_file_size": "2mb", "state_session_capacity": 7, "run_history": False}


@pytest.mark.parametrize("flags", [["--memory-budget", "inf"], ["--memory-budget", "nan"], ["--memory-budget", "0"],
                                   ["--max-upload-mb", "-1"], ["--max-image-pixels", "0"], ["--max-sessions", "0"],
                                   ["--cache-size", "-2"], ["--spill-budget", "inf"], ["--spill-budget", "nan"]])
def test_unbounded_or_meaningless_limits_stop_the_launch_with_a_sentence(flags, capsys):
    """An operator's typing mistake in a bound is one line naming the flag, not a traceback at launch."""
    with pytest.raises(SystemExit) as stopped:
        app.parse_args(flags)
    assert stopped.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert flags[0] in message and "Traceback" not in message
    assert app.parse_args(["--memory-budget", "0.5", "--spill-budget", "0"])[0].memory_budget == 2 ** 29


def test_pixel_limit_is_enforced_by_the_app(tmp_path):
    config = AppConfig(weights=str(WEIGHTS), device="cpu", max_image_pixels=10_000)
    served = Server.__new__(Server)
    from vit_inspect.ui.model_cache import ModelCache

    served.demo = build_demo(config, ModelCache(1))
    from support.app import launch

    url = launch(served.demo)
    try:
        client = Client(url, verbose=False)
        assert "the limit is 10,000" in refusal(tuple(analyze(client, PHOTOS / "chelsea.png").values()))
    finally:
        served.demo.close()


@pytest.mark.parametrize("name, words", [
    ("vit_large_patch16_224", "'vit_large_patch16_224' has 304 M parameters (1.1 GiB in float32), more than the "
                              "1.0 GiB this server allows one model"),
    ("someone/large_vit", "'someone/large_vit' has 304 M parameters (1.1 GiB in float32), more than the "
                          "1.0 GiB this server allows one model")])
def test_a_web_users_model_beyond_the_memory_budget_is_a_sentence(tmp_path, monkeypatch, name, words):
    """The page's model box sizes a timm name and a Hugging Face id (its config.json, here from an offline
    hub cache that holds no weights) against --memory-budget before building or fetching anything."""
    import gradio as gr
    from support import offline_hub_cache
    from transformers import ViTConfig

    from vit_inspect.ui.model_cache import ModelCache

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    offline_hub_cache(tmp_path, "someone/large_vit", ViTConfig(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, num_labels=1000,
        architectures=["ViTForImageClassification"]))
    inspector = Inspector(AppConfig(weights=str(WEIGHTS), device="cpu", memory_budget=2 ** 30), ModelCache(2))
    with pytest.raises(gr.Error) as refused:
        inspector.load_model(name, None, progress=lambda *args, **kwargs: None)
    assert refused.value.message.startswith(words) and "--memory-budget" in refused.value.message
    assert len(inspector.cache) == 0  # nothing was kept (the default model was never asked for)


def test_class_concepts_refuse_too_many_images_and_a_file_that_is_no_image(server, tmp_path):
    """/class_concepts reads at most 50 uploads, each checked as the page's own upload is; a file named .png that
    is no image, and a 51st file, get sentences before any pass (nothing is shown as a result)."""
    client = Client(server.url, verbose=False)
    fake = tmp_path / "notes.png"
    fake.write_text("not a picture")
    cat = handle_file(str(PHOTOS / "chelsea.png"))
    sentence = refused(client, [cat, handle_file(str(fake))], False, "Egyptian cat", 2, api_name="/class_concepts")
    assert "image" in sentence and str(tmp_path) not in sentence
    many = [cat] * 51
    assert refused(client, many, False, "Egyptian cat", 2, api_name="/class_concepts") == (
        "Please upload at most 50 files at once (51 given).")
    assert refused(client, None, False, "Egyptian cat", 2, api_name="/class_concepts").startswith(
        "Upload at least two images of the class")
