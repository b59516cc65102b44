"""The running app under attack through its real API (gradio_client and raw HTTP).

Every file reference a client may send, in every shape (Gradio's FileData with and without `meta`,
a bare path, a `url`, a `data:` URL, a symlink), to every endpoint that takes a file, is refused
with one fixed message unless it is a real upload; every endpoint listed in the app's own config
answers hostile numbers and types with a result or a sentence; no message names a server path.
"""
from __future__ import annotations

import base64
import json
import math
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
from support import REPO
from support.app import CHELSEA, WEIGHTS, analyze, launch

gradio_client = pytest.importorskip("gradio_client")
from gradio import utils as gradio_utils  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402
from support.app import dependency, queue_call, refusal, refused
from support.sae import random_sae

from vit_inspect.core.sae_file import save_sae
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.demo import build_demo
from vit_inspect.ui.model_cache import ModelCache  # noqa: E402
from vit_inspect.ui.untrusted import NOT_AVAILABLE  # noqa: E402
from vit_inspect.ui.view import View

pytestmark = [
    pytest.mark.slow,  # every endpoint of the served app under attack
    pytest.mark.skipif(not WEIGHTS.is_file(), reason=f"real DeiT-Ti weights not found at {WEIGHTS}"),
    pytest.mark.filterwarnings("ignore::Warning:gradio.queueing"),
]
META = {"_type": "gradio.FileData"}
GRADIO_REFUSAL = None  # what Gradio answers (error: null) when it refuses a payload before any app code runs
GRADIO_CLIENT_REFUSAL = ("The upstream Gradio app has raised an exception but has not enabled verbose error "
                         "reporting. To enable, set show_error=True in launch().")
RAW_PYTHON = ("could not convert", "embedded null byte", "cannot convert", "Traceback", "object has no attribute",
              "unsupported operand", "invalid literal", "not supported between", "Something went wrong")
SERVER_PATHS = tuple({str(REPO), str(REPO.parent), "/tmp/", "/root", "/etc/", "/home/", tempfile.gettempdir() + "/",
                      str(Path.home()) + "/"})


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A photo planted outside Gradio's upload folder, a symlink to it inside, and a missing path."""
    outside = tmp_path_factory.mktemp("planted")
    photo = outside / "planted_cat.png"
    shutil.copy(CHELSEA, photo)
    upload_dir = Path(gradio_utils.get_upload_folder()) / f"i9-test-{uuid.uuid4().hex}"
    upload_dir.mkdir(parents=True)
    link = upload_dir / "link_cat.png"
    os.symlink(photo, link)
    save_sae(random_sae(), upload_dir / "uploaded_sae.safetensors")  # a real upload, for the index beside it
    yield {"planted": str(photo), "symlink": str(link), "missing": str(outside / "no_such_file.png"),
           "passwd": "/etc/passwd", "dotdot": str(upload_dir / ".." / ".." / outside.name / photo.name),
           "weights": str(WEIGHTS), "sae": str(upload_dir / "uploaded_sae.safetensors")}
    shutil.rmtree(upload_dir, ignore_errors=True)


def shapes(path: str) -> dict[str, object]:
    """Every shape a file reference can take in a request."""
    return {"meta": {"path": path, "orig_name": "cat.png", "meta": META},
            "no_meta": {"path": path, "orig_name": "cat.png"},
            "bare": path,
            "url_file_route": {"url": f"/gradio_api/file={path}", "orig_name": "cat.png"},
            "url_http": {"url": "http://127.0.0.1:9/cat.png", "orig_name": "cat.png"}}


def defaults(client: Client, api_name: str) -> list:
    values = {c["id"]: c.get("props", {}).get("value") for c in client.config["components"]}
    return [values.get(i) for i in dependency(client, api_name)["inputs"]]


def call_route(client: Client, api_name: str, data: list) -> tuple[bool, object]:
    """One event through the plain HTTP API, POST /gradio_api/call/<api_name> then its event stream:
    (refused, its sentence) as `outcome` gives them."""
    base = client.src.rstrip("/") + "/gradio_api/call/" + api_name
    posted = httpx.post(base, content=json.dumps({"data": data}), headers={"content-type": "application/json"},
                        timeout=30)
    if posted.status_code != 200:
        return False, f"HTTP {posted.status_code}"
    event, result = None, None
    with httpx.stream("GET", f"{base}/{posted.json()['event_id']}", timeout=120) as stream:
        for line in stream.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event in ("complete", "error"):
                result = json.loads(line[5:])
                if event == "error":
                    return True, result.get("error") if isinstance(result, dict) else result
                return refusal(result) is not None, refusal(result)
    raise AssertionError("no completion")


def error_of(message: dict) -> object:
    return (message.get("output") or {}).get("error")


def outcome(message: dict) -> tuple[bool, object]:
    """(refused, its sentence) of a queue completion: Gradio's error (``success`` false; None where Gradio refused
    before any app code), or the sentence the event wrote into its note (`common.says_refusals`)."""
    if not message["success"]:
        return True, error_of(message)
    sentence = refusal(message["output"]["data"])
    return sentence is not None, sentence


FILE_INPUTS = {"analyze": (0, lambda f: f), "analyze_first_image": (0, lambda f: f), "load_model": (1, lambda f: f),
               "dataset_distance": (0, lambda f: [f]), "similarity_other_image": (0, lambda f: f),
               "class_concepts": (0, lambda f: [f]), "features_load_sae": (0, lambda f: f),
               "features_load_sae/index": (4, lambda f: f)}  # the feature index uploaded beside a real SAE


def file_call_data(client: Client, case: str, payload, planted: dict) -> list:
    index, wrap = FILE_INPUTS[case]
    data = defaults(client, endpoint(case))
    data[index] = wrap(payload)
    if case == "load_model":
        data[0] = "deit_tiny_patch16_224"
    if case == "features_load_sae/index":
        data[0] = {"path": planted["sae"], "orig_name": "sae.safetensors", "meta": META}
    return data


def endpoint(case: str) -> str:
    """The api_name of a `FILE_INPUTS` case ("features_load_sae/index": its index input)."""
    return case.split("/")[0]


@pytest.mark.parametrize("case", sorted(FILE_INPUTS))
def test_no_file_outside_the_upload_folder_is_ever_read(server, planted, case):
    """Raw HTTP, both the queue and the /call route: every shape of a path outside Gradio's upload
    folder (or a symlink out of it) is refused, with the same answer whether the file exists or not."""
    client = Client(server.url, verbose=False)
    cases = [("planted", s, p) for s, p in shapes(planted["planted"]).items()]
    cases += [(t, s, shapes(planted[t])[s]) for t in ("symlink", "passwd", "dotdot") for s in ("meta", "no_meta", "bare")]
    api_name = endpoint(case)
    for target, shape, payload in cases:
        answers = [outcome(queue_call(client, api_name, file_call_data(client, case, payload, planted))),
                   call_route(client, api_name, file_call_data(client, case, payload, planted))]
        if target == "planted":
            missing = shapes(planted["missing"])[shape]
            answers.append(call_route(client, api_name, file_call_data(client, case, missing, planted)))
            assert answers[1] == answers[2], f"{api_name} {shape}: a client can tell {target} from a missing file"
        for was_refused, sentence in answers:
            assert was_refused, (api_name, target, shape)
            assert sentence is GRADIO_REFUSAL or NOT_AVAILABLE in sentence, (api_name, target, shape, sentence)


def refused_here(client: Client, *args, api_name: str) -> str:
    """The sentence of a refused request: ours (`refused`), or the one gradio_client gives when Gradio refused
    the payload before any app code ran."""
    try:
        return refused(client, *args, api_name=api_name)
    except AppError as error:
        return str(error)


def test_the_planted_image_is_refused_through_gradio_client(server, planted):
    """What the attack did: {"path": ...} without `meta` made /analyze open a planted photo."""
    client = Client(server.url, verbose=False)
    for payload in ({"path": planted["planted"]}, {"path": planted["planted"], "orig_name": "x.png"},
                    {"path": planted["symlink"]}, {"url": "http://127.0.0.1:9/x.png"}):
        assert refused(client, payload, api_name="/analyze") == f"The image was not analysed: {NOT_AVAILABLE}"
        assert refused_here(client, [payload], api_name="/dataset_distance") in (NOT_AVAILABLE, GRADIO_CLIENT_REFUSAL)
        assert refused_here(client, "deit_tiny_patch16_224", payload, api_name="/load_model") in (
            NOT_AVAILABLE, GRADIO_CLIENT_REFUSAL)
    assert analyze(client)["predictions"]["confidences"]  # a real upload still works


def test_real_uploads_examples_and_data_urls_are_accepted(server):
    client = Client(server.url, verbose=False)
    data = base64.b64encode(CHELSEA.read_bytes()).decode()
    result = client.predict({"url": f"data:image/png;base64,{data}", "orig_name": "cat.png"}, api_name="/analyze")
    assert "cat" in result[0]["label"]
    assert "not valid base64" in refused(client, {"url": "data:image/png;base64,%%%%", "orig_name": "cat.png"},
                                         api_name="/analyze")
    assert "larger than the limit of 30 MiB" in refused(
        client, {"url": "data:image/png;base64," + "A" * (41 * 2**20), "orig_name": "x.png"}, api_name="/analyze")
    # Gradio copies the example photos into its upload folder and the page sends those copies
    example = next(c for c in client.config["components"] if c.get("type") == "dataset")["props"]["samples"][0][0]
    folder = os.path.realpath(gradio_utils.get_upload_folder())
    assert os.path.realpath(example["path"]).startswith(folder + os.sep)
    assert "cat" in client.predict(example, api_name="/analyze")[0]["label"]
    uploaded = client.predict("deit_tiny_patch16_224", handle_file(str(WEIGHTS)), api_name="/load_model")[0]
    assert "deit_tiny_patch16_224.safetensors" in uploaded and folder not in uploaded


def test_invisible_characters_in_an_uploads_name_never_reach_a_download(server):
    """A right-to-left override makes "cat\u202egnp.exe" show as "catexe.png"; it and the zero-width and
    other invisible characters of an upload's name are dropped before the name is used for the downloads."""
    client = Client(server.url, verbose=False)
    data = base64.b64encode(CHELSEA.read_bytes()).decode()
    name = "\u2066cat\u202egnp.exe\u200b\u2069.png"
    assert "cat" in client.predict({"url": f"data:image/png;base64,{data}", "orig_name": name},
                                   api_name="/analyze")[0]["label"]
    files = [Path(f).name for f in client.predict(api_name="/downloads")[0]]
    assert "catgnp.exe.json" in files and all(name.startswith("catgnp.exe") for name in files), files


# -------------------------------------------------------------------------------- every endpoint

HOSTILE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "huge": 1e308, "negative": -7,
           "text": "abc", "null_byte": "a\x00b", "list": [1, 2], "dict": {"a": 1}, "empty": ""}


# endpoints of a click on a map or a table row: their event data is attacked too
CLICKS = ("pick_patch", "pick_similar_patch", "features_patch", "features_row")


def assert_sentence(api_name: str, what: str, message: dict, component: str) -> None:
    refused, error = outcome(message)
    if not refused:
        return
    if error is GRADIO_REFUSAL and component in ("image", "file", "dataset"):
        return  # Gradio refuses a non-file value for a file input (or its own examples' index) before any app code
    assert isinstance(error, str) and len(error.split()) >= 3, (api_name, what, error)
    assert not any(raw in error for raw in RAW_PYTHON), (api_name, what, error)
    assert not any(path in error for path in SERVER_PATHS), (api_name, what, error)


SWEEP_PARTS = 4  # the sweep's endpoints in four parts, each its own unit on the test workers (tests/conftest.py)


@pytest.mark.parametrize("part", [pytest.param(part, marks=pytest.mark.xdist_group(f"endpoint-sweep-{part}"))
                                  for part in range(SWEEP_PARTS)])
def test_every_endpoint_answers_hostile_values_with_a_result_or_a_sentence(server, part):
    """Every api_name in the app's config (new ones included automatically), after a real analysis so
    the handlers have a session: each hostile value in every input at once (the image of /analyze
    kept real so that its controls are reached), then every input on its own with one hostile value
    in turn (rotating, so that each kind of value meets each kind of input across the endpoints).
    Part p takes the endpoints at positions p, p + 4, ... of the sorted list, so the four parts together
    take every endpoint once."""
    client = Client(server.url, verbose=False)
    analyze(client)
    components = {c["id"]: c.get("type") for c in client.config["components"]}
    # listeners that run in the browser only (js, no server function: the Attention tab's click and typed
    # patch) have nothing on the server to attack; Gradio keeps them private
    browser_only = [d for d in client.config["dependencies"] if not d.get("backend_fn")]
    assert browser_only and all(d["js"] and d["api_visibility"] == "private" for d in browser_only)
    endpoints = [d["api_name"] for d in client.config["dependencies"] if d.get("api_name") and d.get("backend_fn")]
    assert {"analyze", "attention", "pos_similarity", "load_model", "dataset_distance", "downloads", "concepts",
            "patch_similarity", "patch_similarity_opened", "pick_similar_patch", "similarity_other_image",
            "class_concepts", "cancel_class_concepts", "class_concept_maps"} <= set(endpoints)
    # this page's own: the first view, the model lists, the Explain maps, and the stale-result checks
    assert {"analyze_first_image", "first_view", "explain_opened", "gradient_weighted_attention", "model_choices",
            "model_figures", "panels_of_new_image", "stale_check_image", "stale_check_class", "stale_check_search",
            "stale_check_model", "stale_check_model_b", "stale_check_settings", "stale_check_result",
            "sanity_checks", "cancel_sanity_checks", "features_load_sae", "features_encode", "features_patch",
            "features_feature", "features_row", "features_edit", "features_explain", "features_saes",
            "stale_check_sae"} <= set(endpoints)
    sae = Path(tempfile.mkdtemp()) / "random.safetensors"  # an SAE loaded and the image encoded: every handler
    save_sae(random_sae(), sae)  # of the Features view then has codes to read when the hostile values come
    client.predict(handle_file(str(sae)), None, None, api_name="/features_load_sae")
    assert client.predict(api_name="/features_encode")[0]
    values = list(HOSTILE.items())
    tried = 0
    for api_name in sorted(endpoints)[part::SWEEP_PARTS]:
        inputs = dependency(client, api_name)["inputs"]
        open_inputs = [p for p, c in enumerate(inputs) if components[c] != "state"]
        event_data = ({"index": [100, 40], "value": None, "selected": True, "row_value": [3, 0.5]}
                      if api_name in CLICKS else None)

        def attempt(positions, value, what):
            data = defaults(client, api_name)
            for position in positions:
                data[position] = value
            if api_name in ("analyze", "analyze_first_image") and (0 not in positions or len(positions) > 1):
                data[0] = handle_file_payload(client)
            kinds = {components[inputs[p]] for p in positions}
            kind = "file" if kinds & {"image", "file", "dataset"} else "value"
            assert_sentence(api_name, what, queue_call(client, api_name, data, event_data), kind)

        for what, value in values if open_inputs else []:
            attempt(open_inputs, value, f"every input = {what}")
            tried += 1
        for n, position in enumerate(open_inputs):
            what, value = values[(n + len(api_name)) % len(values)]
            attempt([position], value, f"input {position} = {what}")
            tried += 1
        if api_name in CLICKS:
            for what, value in values:
                message = queue_call(client, api_name, defaults(client, api_name),
                                     {"index": [value, 3], "value": None, "selected": True, "row_value": [value]})
                assert_sentence(api_name, f"click at x = {what}", message, "click")
    assert tried > 100 / SWEEP_PARTS
    assert analyze(client, CHELSEA.with_name("coffee.png"))["predictions"]["confidences"]  # still serving


_UPLOADED: dict[str, dict] = {}


def handle_file_payload(client: Client) -> dict:
    """A real upload of the cat photo (uploaded once), as the browser sends it."""
    if "cat" not in _UPLOADED:
        with open(CHELSEA, "rb") as f:
            response = httpx.post(client.src.rstrip("/") + "/gradio_api/upload", files={"files": f}, timeout=30)
        _UPLOADED["cat"] = {"path": response.json()[0], "orig_name": "chelsea.png", "meta": META}
    return _UPLOADED["cat"]


def test_hostile_sae_files_get_sentences_without_a_path(server, tmp_path):
    """The Features view's upload: a pickle, files that only claim to be an SAE, one that lies about its shapes or
    size, NaN weights, a broken saev line, one over the size cap, one for another model: each a sentence naming
    no server path, nothing loaded."""
    import torch
    from safetensors.torch import save_file

    from vit_inspect.core.sae_file import METADATA_KEY

    good = random_sae()
    save_sae(good, tmp_path / "good.safetensors")
    whole = (tmp_path / "good.safetensors").read_bytes()
    files = {"sae.pt": None, "text.safetensors": b"not a safetensors file at all",
             "truncated.safetensors": whole[: len(whole) // 2], "saev_broken": b'{"d_vit": 192,\n\x00\x01'}
    torch.save(good.tensors(), tmp_path / "sae.pt")
    lying = dict(good.tensors())
    save_file(lying, str(tmp_path / "lying.safetensors"),
              metadata={METADATA_KEY: good.info.__class__(**{**good.info.__dict__, "features": 300}).to_json()})
    save_file(lying, str(tmp_path / "huge.safetensors"),
              metadata={METADATA_KEY: good.info.__class__(**{**good.info.__dict__, "features": 2 ** 40}).to_json()})
    nan = {name: t.clone() for name, t in good.tensors().items()}
    nan["W_dec"][0, 0] = float("nan")
    save_file(nan, str(tmp_path / "nan.safetensors"), metadata={METADATA_KEY: good.info.to_json()})
    save_sae(random_sae(width=384), tmp_path / "wide.safetensors")
    (tmp_path / "big.safetensors").write_bytes(whole + b"\0" * (17 * 2 ** 20))
    for name, data in files.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
    expected = {"sae.pt": "pickled checkpoint", "text.safetensors": "", "truncated.safetensors": "",
                "saev_broken": "", "lying.safetensors": "shape", "huge.safetensors": "features",
                "nan.safetensors": "", "wide.safetensors": "384-wide tokens", "big.safetensors": "16 MiB"}
    client = Client(server.url, verbose=False)
    for name, words in expected.items():
        sentence = refused(client, handle_file(str(tmp_path / name)), None, 6, api_name="/features_load_sae")
        assert words in sentence and len(sentence.split()) >= 3, (name, sentence)
        assert not any(raw in sentence for raw in RAW_PYTHON), (name, sentence)
        assert not any(path in sentence for path in SERVER_PATHS), (name, sentence)
    for block in (-1, "six", [6], 1e9):  # NaN and the rest: every endpoint's sweep above
        sentence = refused(client, handle_file(str(tmp_path / "saev_broken")), None, block,
                           api_name="/features_load_sae")
        assert "block" in sentence.lower() and not any(path in sentence for path in SERVER_PATHS), sentence
    for choice in ("/etc/passwd", "../good.safetensors", "good.safetensors"):  # no server folder is configured
        assert refused(client, None, choice, None, api_name="/features_load_sae") == (
            "This server offers no SAE of that name; choose one from the list.")


@pytest.mark.parametrize("api_name, data, message", [
    ("pos_similarity", [None, math.inf, 64], "between 16 and 100000, not inf"),
    ("pos_similarity", [None, math.nan, 64], "must be a number, not NaN"),
    ("pos_similarity", [None, "tall", 64], "must be a number, not 'tall'"),
    ("pos_similarity", [None, 8, 64], "between 16 and 100000, not 8"),
    ("load_model", ["deit_tiny_patch16_224.no_such_tag", None, None], "has no pretrained tag 'no_such_tag'"),
    ("load_model", ["deit_tiny\x00", None, None], "printable characters"),  # the last: the state of the model in use
    ("load_model", [["deit"], None, None], "must be text"),
])
def test_the_reported_inputs_get_sentences(server, api_name, data, message):
    client = Client(server.url, verbose=False)
    was_refused, sentence = outcome(queue_call(client, api_name, data))
    assert was_refused and message in sentence, sentence


def test_the_sanity_checks_answer_a_session_without_an_image_and_forged_values(server):
    """/sanity_checks and its Cancel take no value a client sets (their inputs are the session's states): a fresh
    session gets sentences, and hostile values sent where the states go are ignored by Gradio, not run."""
    client = Client(server.url, verbose=False)  # a session that analysed nothing (the first view's pass aside)
    for data in ([None] * len(dependency(client, "sanity_checks")["inputs"]),
                 [value for _, value in list(HOSTILE.items())[:len(dependency(client, "sanity_checks")["inputs"])]]):
        was_refused, sentence = outcome(queue_call(client, "sanity_checks", data))
        assert was_refused and sentence.startswith("Analyse an image first"), sentence
    cancelled = queue_call(client, "cancel_sanity_checks", [])
    assert cancelled["success"] and cancelled["output"]["data"] == ["Nothing to cancel: no sanity checks are running "
                                                                    "for you."]


def test_a_name_pasted_with_spaces_and_a_line_break_loads(server):
    """It was refused as "at most 200 printable characters" for a 24-character name."""
    client = Client(server.url, verbose=False)
    status = client.predict("  deit_tiny_patch16_224\n", None, api_name="/load_model")[0]
    assert "`deit_tiny_patch16_224`" in status


def test_a_slider_at_infinity_is_clamped_for_a_new_image(server):
    client = Client(server.url, verbose=False)
    data = defaults(client, "analyze")
    data[0] = handle_file_payload(client)
    names = list(View.__dataclass_fields__)
    data[1 + 1 + 2 + names.index("layer")] = math.inf  # image, key, geometry and shorter side, then the controls
    message = queue_call(client, "analyze", data)
    assert message["success"], error_of(message)


# ------------------------------------------------------------------------------------- no paths

def test_no_server_path_in_the_page_or_messages_with_a_model_folder(tmp_path):
    """--model DIR: the page config, status line and dropdown show only the folder's base name."""
    from support import tiny_hf

    folder = tmp_path / "private_models" / "my_vit"
    tiny_hf().save_pretrained(folder)
    config = AppConfig(model=str(folder), device="cpu")
    demo = build_demo(config, ModelCache(1))
    try:
        client = Client(launch(demo), verbose=False)
        page = json.dumps(client.config)
        assert str(tmp_path) not in page and "my_vit" in page
        status = client.predict(api_name="/startup")[0]
        assert "`my_vit`" in status and str(tmp_path) not in status
        loaded = client.predict("my_vit", None, api_name="/load_model")[0]  # the dropdown's value loads it
        assert "`my_vit`" in loaded and str(tmp_path) not in loaded
        # a client who knows the folder gets only the operator's own model, still named by its base name
        again = client.predict(str(folder), None, api_name="/load_model")[0]
        assert "`my_vit`" in again and str(tmp_path) not in again
        sentence = refused(client, str(tmp_path), None, api_name="/load_model")  # any other folder: no model name
        assert "not a valid model name" in sentence and str(tmp_path) not in sentence
    finally:
        demo.close()


def test_no_server_path_in_any_figure_download_or_caption_with_a_model_folder(tmp_path, monkeypatch):
    """--model /a/folder: every endpoint that names the model (analysis, downloads, the Model tab's
    downloads, faithfulness, heads, the dataset job, Compare) names it by the folder's base name. Every
    text drawn into a picture is read where it is drawn (PIL's `ImageDraw.text`, matplotlib's
    `Figure.draw`), every returned string and file name is read, and every downloaded file's bytes."""
    import matplotlib.text
    from matplotlib.figure import Figure
    from PIL import ImageDraw
    from support import tiny_hf

    folder = tmp_path / "private_models" / "my_vit"
    tiny_hf().save_pretrained(folder)
    secrets = (str(tmp_path), str(tmp_path).replace("/", "_"), "private_models")
    drawn: list[str] = []
    pil_text, figure_draw = ImageDraw.ImageDraw.text, Figure.draw
    monkeypatch.setattr(ImageDraw.ImageDraw, "text",
                        lambda self, xy, text, *a, **k: drawn.append(str(text)) or pil_text(self, xy, text, *a, **k))
    monkeypatch.setattr(Figure, "draw", lambda self, renderer: drawn.extend(
        t.get_text() for t in self.findobj(matplotlib.text.Text)) or figure_draw(self, renderer))
    demo = build_demo(AppConfig(model=str(folder), device="cpu"), ModelCache(2))
    try:
        client = Client(launch(demo), verbose=False)
        photo = handle_file(str(CHELSEA))
        outputs = {name: client.predict(*args, api_name=name) for name, args in [
            ("/analyze", (photo,)), ("/downloads", ()), ("/model_downloads", (32, 48)), ("/faithfulness", ()),
            ("/heads_overview", ()), ("/ablate_heads", ("0:0", "zero", [])), ("/dataset_distance", ([photo],)),
            ("/compare_load_model", ("my_vit", None)), ("/compare_models", (photo, "", 0.6, False, 0.5))]}
    finally:
        demo.close()

    def strings(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for item in value.values():
                yield from strings(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from strings(item)

    returned = [s for value in outputs.values() for s in strings(value)]
    files = [Path(s) for s in returned if s.startswith(gradio_utils.get_upload_folder()) and Path(s).is_file()]
    downloads = {Path(p).name for p in outputs["/downloads"][0] + outputs["/model_downloads"][0]}  # files, a note
    assert {"chelsea.json", "chelsea.npz", "my_vit_filters.png", "my_vit_model.npz"} <= downloads
    record = json.loads(next(f for f in files if f.name == "chelsea.json").read_text())
    assert record["model"] == record["settings"]["model"] == "my_vit"
    for name in ("chelsea.npz", "my_vit_model.npz"):  # compressed: their records are read, not their bytes
        with np.load(next(f for f in files if f.name == name)) as arrays:
            assert json.loads(str(arrays["settings_json"]))["model"] == "my_vit"
    assert any(text.startswith("my_vit: class") for text in drawn)  # the faithfulness curves' title
    assert {"A: my_vit (32×32)", "B: my_vit (32×32)"} <= set(drawn)  # Compare's captions
    assert len(drawn) > 100 and len(files) > 20
    for secret in secrets:
        assert not [s for s in returned if secret in s]
        assert not [t for t in drawn if secret in t]
        assert not [f.name for f in files if secret.encode() in f.read_bytes()]


def test_missing_weights_of_a_curated_model_say_so_without_a_path(server, monkeypatch, tmp_path):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    client = Client(server.url, verbose=False)
    for name in ("deit_small_patch16_224", "vit_base_patch16_224"):
        assert refused(client, name, None, api_name="/load_model") == (
            f"Weights for {name!r} are not available on this server (no network access to the Hugging Face hub "
            "and no local copy).")


def queue_messages(client: Client, api_name: str, data: list) -> list[dict]:
    """Every message of one event through /queue/join, its warnings (msg "log") included, up to its completion."""
    dep = dependency(client, api_name)
    payload = {"data": data, "fn_index": dep["id"], "session_hash": client.session_hash,
               "trigger_id": dep["targets"][0][0] if dep["targets"] else None, "event_data": None}
    base = client.src.rstrip("/") + "/gradio_api"
    event_id = httpx.post(f"{base}/queue/join", json=payload, timeout=30).json()["event_id"]
    messages = []
    with httpx.stream("GET", f"{base}/queue/data", params={"session_hash": client.session_hash}, timeout=120) as s:
        for line in s.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("event_id") == event_id:
                    messages.append(message)
                    if message.get("msg") == "process_completed":
                        return messages
    raise AssertionError("no completion")


def prompt_data(client: Client, prompt: object, versus: object = "") -> list:
    """/set_prompt's inputs at their defaults, with this prompt and versus prompt in their boxes."""
    ids = {c.get("props", {}).get("elem_id"): c["id"] for c in client.config["components"]}
    data, inputs = defaults(client, "set_prompt"), dependency(client, "set_prompt")["inputs"]
    data[inputs.index(ids["prompt"])], data[inputs.index(ids["versus"])] = prompt, versus
    return data


@pytest.mark.parametrize("prompt, says", [
    ("a cat\x1b[2J\x00", "control or invisible characters (U+0000, U+001B)"), ("a\u202ecat", "U+202E"),
    ("", "The prompt is empty"), ("\n\t ", "The prompt is empty"), ("x" * 10_000, "10,000 characters"),
], ids=["escape-and-null", "right-to-left-override", "empty", "blank", "10-kB"])
def test_a_hostile_prompt_to_an_openclip_app_gets_a_sentence(clip_server, prompt, says):
    """Through the queue, as a browser or script sends it: the prompt (and the same text as the versus prompt)
    is refused with one sentence in the page's notice line (no toast), the event completes, and the page keeps
    its maps."""
    client = Client(clip_server.url, verbose=False)
    shown = analyze(client)["first_chefer"]
    cases = [(prompt, "", "The prompt")] + ([("a photo of a cat", prompt, "The versus prompt")]
                                            if prompt.strip() else [])  # an empty versus box is no versus prompt
    for typed, versus, what in cases:
        messages = queue_messages(client, "set_prompt", prompt_data(client, typed, versus))
        assert messages[-1]["success"] and not [m for m in messages if m.get("msg") == "log"], messages
        was_refused, sentence = outcome(messages[-1])
        assert was_refused and says.replace("The prompt", what) in sentence
        assert not any(raw in sentence for raw in RAW_PYTHON) and len(sentence) < 200
    assert analyze(client, CHELSEA.with_name("coffee.png"))["first_chefer"] != shown  # still serving


def test_a_100_kb_prompt_is_refused_before_the_app_with_a_sentence(clip_server):
    """Longer than any text a request may carry (`request_guard.MAX_TEXT_CHARS`): refused at the door."""
    client = Client(clip_server.url, verbose=False)
    dep = dependency(client, "set_prompt")
    payload = {"data": prompt_data(client, "x" * 102_400), "fn_index": dep["id"],
               "session_hash": client.session_hash, "trigger_id": dep["targets"][0][0], "event_data": None}
    refused = httpx.post(client.src.rstrip("/") + "/gradio_api/queue/join", json=payload, timeout=30)
    assert refused.status_code in (400, 413)
    assert refused.json()["detail"] == "A text in the request is longer than 65,536 characters."


def test_the_sanity_checks_of_a_prompt_through_the_served_app(clip_server):
    """The prompt typed in the page is what the sanity checks explain; a versus prompt gets a sentence."""
    client = Client(clip_server.url, verbose=False)
    analyze(client)
    inputs = [None] * len(dependency(client, "sanity_checks")["inputs"])
    assert queue_messages(client, "set_prompt", prompt_data(client, "a photo of a cat", "a photo of a dog"))[-1][
        "success"]
    was_refused, sentence = outcome(queue_call(client, "sanity_checks", inputs))
    assert was_refused and sentence.startswith("The sanity checks explain one prompt"), sentence
    assert queue_messages(client, "set_prompt", prompt_data(client, "a photo of a cat"))[-1]["success"]
    answer = queue_call(client, "sanity_checks", inputs)
    assert answer["success"], error_of(answer)
    note = next(value for value in answer["output"]["data"] if isinstance(value, str) and value.startswith("Ran "))
    assert "for prompt 'a photo of a cat'" in note and "the map for zero-shot label '" in note
    assert "ignores the prompt" in note
