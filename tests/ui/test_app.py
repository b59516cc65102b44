"""The Gradio app through its API, as a client sees it: real DeiT-Ti weights, served in-process.

Each test opens its own client (its own session), so no test sees another's results. Model calls
are counted with a forward pre-hook on the cached handle's model.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support import REPO

gradio_client = pytest.importorskip("gradio_client")
import gradio as gr  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402
from support.app import ANALYZE_OUTPUTS, CATS, CHELSEA, WEIGHTS, analyze, click, launch, pixels, refusal, refused

import app  # noqa: E402
from vit_inspect.jobs.distance import dataset_attention_distance  # noqa: E402
from vit_inspect.plots import distance as distance_plots
from vit_inspect.ui.common import (
    OutputImage,  # noqa: E402
    shown_model,
)
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.demo import build_demo
from vit_inspect.plots.canvas import COLORBAR_PIXELS
from vit_inspect.ui.inspector import CLASS_PANELS, FIRST_PANELS, FIRST_TAB, LATER_PANELS
from vit_inspect.ui.model_cache import CacheKey, ModelCache  # noqa: E402
from vit_inspect.ui.panels import IMAGE_PANELS
from vit_inspect.ui.view import PATCH


def test_building_the_app_loads_no_model_and_names_every_event():
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded while the app was being built")

    demo = build_demo(AppConfig(), ModelCache(loader=no_loading))  # what `import app` does
    names = [fn.api_name for fn in demo.fns.values()]
    assert all(names) and len(set(names)) == len(names)
    assert {"analyze", "attention", "rollout", "gradcam", "pick_patch", "set_target", "downloads"} <= set(names)
    assert isinstance(app.demo, type(demo))


def _zlib_level_class(png: bytes) -> int:
    """FLEVEL of the first IDAT's zlib header (RFC 1950): 0 fastest (zlib level 0-1), 1 fast, 2 default, 3 max."""
    at = png.index(b"IDAT") + 4
    return png[at + 1] >> 6


def test_the_page_records_the_tab_it_shows():
    """Six sections, three with sub-tabs; a sub-tab opening records its label (and remembers it for its
    section), a section opening records the sub-tab it last showed, its first at the start; all in the page."""
    demo = build_demo(AppConfig(), ModelCache(loader=lambda *a, **k: None))
    tabs = [block for block in demo.blocks.values() if isinstance(block, gr.Tab)]
    labels = {tab.label for tab in tabs}
    assert set(LATER_PANELS.values()) | {FIRST_TAB, "Ablate & rank"} <= labels  # the tabs the gating names exist
    sections = {"Explain": "Overview", "Heads": "All heads", "How it sees": "Filters & positions",
                "Compare": "Compare", "Features": "Features", "Downloads": "Downloads"}
    assert set(sections) <= labels and len(tabs) == 18  # 6 sections, 15 views
    shown = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "shown-tab")
    assert shown.value == FIRST_TAB and not shown.visible
    recorded = {}
    for dep in demo.config["dependencies"]:
        if not dep.get("backend_fn") and dep["outputs"] == [shown._id] and dep["js"]:
            [(target, event)] = dep["targets"]
            assert event == "select"
            recorded.setdefault(target, []).append(dep["js"])
    assert {t._id for t in tabs} <= set(recorded)  # every tab records itself, without a server call
    for tab in tabs:
        if tab.label in sections:  # reads what its sub-tab recorded
            assert any(js.endswith(f"[{json.dumps(tab.label)}] || {json.dumps(sections[tab.label])})")
                       for js in recorded[tab._id]), tab.label
        else:
            assert any(js.endswith(f"= {json.dumps(tab.label)})") for js in recorded[tab._id]), tab.label


def test_output_images_are_sent_as_fast_pngs_that_gradio_draws():
    demo = build_demo(AppConfig(), ModelCache(loader=lambda *a, **k: None))
    outputs = [block for block in demo.blocks.values() if isinstance(block, OutputImage)]
    assert len(outputs) == 42  # every map and figure of every tab
    plain = [block for block in demo.blocks.values() if type(block) is gr.Image]
    assert [block.label for block in plain] == ["Image (upload, drop, paste or webcam)",  # the uploads, inputs
                                                "Second image (optional)"]
    kinds = {c["id"]: c["type"] for c in demo.config["components"]}
    assert {kinds[block._id] for block in outputs} == {"image"}  # drawn by Gradio's own image component
    picture = np.random.default_rng(0).integers(0, 256, (37, 53, 3)).astype(np.uint8)
    sent = outputs[0].postprocess(picture)
    data = Path(sent.path).read_bytes()
    assert Path(sent.path).is_relative_to(Path(outputs[0].GRADIO_CACHE).resolve()) and sent.orig_name == "image.png"
    np.testing.assert_array_equal(np.asarray(Image.open(Path(sent.path))), picture)  # lossless
    assert _zlib_level_class(data) == 0
    gradio_own = Path(gr.Image(format="png").postprocess(picture).path)
    np.testing.assert_array_equal(np.asarray(Image.open(gradio_own)), picture)
    assert _zlib_level_class(gradio_own.read_bytes()) == 2 and len(gradio_own.read_bytes()) <= len(data)
    # what this class does not encode itself goes Gradio's way: floats, another format
    floats = Path(outputs[0].postprocess(picture / 255.0).path)
    np.testing.assert_array_equal(np.asarray(Image.open(floats)), picture)
    webp = OutputImage(format="webp").postprocess(picture)
    assert webp.path.endswith(".webp")
    # the same picture again names the same file and never rewrites it: a browser may be reading it
    served = Path(sent.path)
    served.write_bytes(b"the bytes a reader is being sent")
    assert outputs[1].postprocess(picture).path == sent.path
    assert served.read_bytes() == b"the bytes a reader is being sent"
    assert not list(served.parent.glob(".image.*"))  # nothing half-written is left beside it
    assert not list((REPO / "vit_inspect").rglob("*.pyi"))  # Gradio's stub writer was kept out of the package


def test_a_cat_photo_is_a_cat(client):
    result = analyze(client)
    labels = [c["label"] for c in result["predictions"]["confidences"]]
    assert len(labels) == 5
    assert any(cat in labels[0] for cat in CATS), labels
    assert sum(any(cat in label for cat in CATS) for label in labels[:3]) == 3
    assert pixels(result["crop"]).shape == (224, 224, 3)
    assert result["target"]["value"] == "285"  # Egyptian cat, the top class, is Grad-CAM's target
    for name in FIRST_PANELS:  # the first view's three maps, at the crop's own size with a colour bar
        assert pixels(result[name]).shape[1] == 224 + COLORBAR_PIXELS
    for name in ("attention", "rollout", "gradcam", "chefer"):  # the Explain section's maps: 448 pixels wide
        assert pixels(result[name]).shape[1] == 448 + COLORBAR_PIXELS
    for name, tab in LATER_PANELS.items():  # cleared by the answer, then drawn only for the view shown
        drawn = dict(zip(LATER_PANELS, client.predict(tab, api_name="/panels_of_new_image")))
        assert pixels(drawn[name]).ndim == 3
        assert all(value == {"__type__": "update"} for other, value in drawn.items() if LATER_PANELS[other] != tab)
    assert set(FIRST_PANELS) | set(LATER_PANELS) == set(IMAGE_PANELS)
    # what the browser turns a clicked pixel into a patch with: the map's enlargement, DeiT-Ti's 224 px input,
    # 16 px patches, 14 x 14
    assert result["geometry"] == {"scale": 2, "input": [224, 224], "patch": [16, 16], "grid": [14, 14]}
    assert result["query"] == "class / readout token"  # a new image starts from the readout token


def test_sliders_redraw_from_the_cached_pass_without_the_model(server, client):
    first = pixels(analyze(client)["attention"])
    before = server.forwards
    other_head = pixels(client.predict(layer=11, head=1, api_name="/attention"))
    other_layer = pixels(client.predict(layer=3, head=1, api_name="/attention"))
    mean = pixels(client.predict(layer=3, mean_heads=True, api_name="/attention"))
    rollout = pixels(client.predict(discard_ratio=0.9, head_fusion="max", api_name="/rollout")[0])
    gradcam = pixels(client.predict(gradcam_layer=5, api_name="/gradcam"))
    distance = pixels(client.predict(layer=3, head=1, api_name="/distance"))
    compare = pixels(client.predict(layer=3, api_name="/compare"))
    assert server.forwards == before, "a redraw called the model"
    assert not np.array_equal(first, other_head)
    assert not np.array_equal(other_head, other_layer)
    assert not np.array_equal(other_layer, mean)
    assert min(rollout.shape[:2]) > 224 and min(gradcam.shape[:2]) > 224  # the map, its colour bar and caption
    assert distance.shape[2] == compare.shape[2] == 3 and compare.shape[1] >= 3 * (224 + COLORBAR_PIXELS)


def test_clicking_a_patch_queries_from_it(server, client):
    readout = pixels(analyze(client)["attention"])
    before = server.forwards
    row, col, query, image = click(client, "pick_patch", x=200, y=80)  # map pixel (80, 200) = crop (40, 100)
    assert (row, col, query) == (2, 6, PATCH)
    clicked = pixels(image["path"])
    assert not np.array_equal(clicked, readout)
    same = pixels(client.predict(query=PATCH, row=2, col=6, api_name="/attention"))
    assert np.array_equal(same, clicked)
    assert server.forwards == before


def test_a_new_target_runs_one_pass_and_switching_back_is_free(server, client):
    first = pixels(analyze(client)["gradcam"])
    before = server.forwards
    gradcam = 1 + CLASS_PANELS.index("gradcam")  # after the class list
    tabby = pixels(client.predict("281", "", api_name="/set_target")[gradcam])
    assert server.forwards == before + 1
    assert not np.array_equal(tabby, first)
    back = pixels(client.predict("285", "", api_name="/set_target")[gradcam])
    assert server.forwards == before + 1, "switching back to a seen class ran the model again"
    assert np.array_equal(back, first)


def test_a_bad_upload_is_explained_once_and_the_app_keeps_serving(client, tmp_path):
    """The sentence goes to the page's notice line, which names the file, says why and what the page still shows;
    every other output (session, maps, top-5, status line) is left as it was, so no panel is marked as failed."""
    analyze(client)
    fake = tmp_path / "holiday.jpg"
    fake.write_text("this is a text file, not a photo")
    message = refused(client, handle_file(str(fake)), api_name="/analyze")
    assert message == ("**holiday.jpg** was not analysed: This file is not an image format we can read (try PNG, JPEG, "
                       "WebP, GIF, TIFF, BMP or PSD). The page still shows chelsea.png \\(model's centre crop, "
                       "224×224 pixels\\).")
    answer = analyze(client, REPO / "assets" / "coffee.png")  # a good upload recovers, and clears the line
    assert answer["predictions"]["label"] == "espresso (#967)" and answer["notice"] == ""


def test_unknown_models_and_wrong_weights_are_explained(client, tmp_path):
    assert "Unknown model 'not_a_vit_at_all'" in refused(client, "not_a_vit_at_all", None, api_name="/load_model")
    answer = client.predict("../../etc", None, api_name="/load_model")
    assert "not a valid model name" in refusal(answer) and answer[-1] == "deit_tiny_patch16_224"  # picker put back
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x00" * 64)
    assert "not a valid safetensors file" in refused(client, "deit_tiny_patch16_224", handle_file(str(broken)),
                                                     api_name="/load_model")
    labels = [c["label"] for c in analyze(client)["predictions"]["confidences"]]  # still serving the default
    assert any(cat in labels[0] for cat in CATS)


def test_downloads_hold_png_json_and_npz(client):
    analyze(client)
    listed, note = client.predict(layer=4, api_name="/downloads")
    files = {Path(p).name: Path(p) for p in listed}
    assert {f"chelsea_{name}.png" for name in IMAGE_PANELS} <= set(files)
    assert note.startswith("Prepared for chelsea.png (model's centre crop, 224×224 pixels), class Egyptian cat")
    for name in IMAGE_PANELS:
        data = files[f"chelsea_{name}.png"].read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert pixels(files[f"chelsea_{name}.png"]).shape[2] == 3
    record = json.loads(files["chelsea.json"].read_text())
    assert record["model"] == "deit_tiny_patch16_224" and record["grid"] == [14, 14]
    assert record["target"] == {"index": 285, "label": "Egyptian cat"} and record["topk"][0]["label"] == "Egyptian cat"
    assert record["settings"]["model"] == "deit_tiny_patch16_224"
    assert record["settings"]["attention"]["layer"] == 4 and record["settings"]["class"]["index"] == 285
    assert np.asarray(record["mean_attention_distance"]).shape == (12, 3)
    assert record["settings"]["relevance"] is False and record["attnlrp"] is None  # the pass leaves them out
    with np.load(files["chelsea.npz"]) as arrays:
        assert arrays["attention"].shape == (12, 3, 197, 197)
        assert arrays["gradcam"].shape == (12, 14, 14)
        assert arrays["chefer"].shape == (14, 14) and "legrad" not in arrays and "attnlrp" not in arrays
        assert arrays["mean_distance"].shape == (12, 3)
        assert arrays["probs"].shape == (1000,)
        assert arrays["attention_map"].shape == arrays["rollout_map"].shape == (14, 14)
        assert np.allclose(arrays["attention"].astype(np.float32).sum(-1), 1.0, atol=1e-2)  # softmax rows
    assert pixels(Path(client.predict(True, api_name="/relevance")[0])).shape[2] == 3  # the All maps toggle
    files = {Path(p).name: Path(p) for p in client.predict(layer=4, api_name="/downloads")[0]}
    assert json.loads(files["chelsea.json"].read_text())["settings"]["relevance"] is True
    with np.load(files["chelsea.npz"]) as arrays:
        assert arrays["legrad"].shape == arrays["attnlrp"].shape == (14, 14)


def test_model_figures_and_similarity_at_another_size(client):
    filters = pixels(client.predict(api_name="/model_figures")[0])
    assert filters.shape[2] == 3 and filters.std() > 0
    assert "at most 20 patches per side" in refused(client, 1024, 1024, api_name="/pos_similarity")
    other, note = client.predict(64, 128, api_name="/pos_similarity")  # a 4×8 grid; the refusal's line cleared
    other = pixels(other)
    assert note == ""
    assert other.shape[1] > other.shape[0]


def test_dataset_average_over_uploaded_images(server, client, tmp_path):
    fake = tmp_path / "notes.png"
    fake.write_text("not an image")
    images = [handle_file(str(REPO / "assets" / name)) for name in ("chelsea.png", "coffee.png")]
    figure, note = client.predict(images + [handle_file(str(fake))], api_name="/dataset_distance")
    assert note.startswith("Averaged over 2 image(s) with deit_tiny_patch16_224") and "notes.png" in note
    # the scatter of the two photos' mean distances, titled with the model and the count, no "selected" entry
    handle = server.cache.get(CacheKey.of(server.config.model, server.config.weights, server.config.device))
    stats = dataset_attention_distance(handle, [REPO / "assets" / name for name in ("chelsea.png", "coffee.png")])
    expected = distance_plots.attention_distance_panel(stats.distances, image_width=224, selectable=False,
                                         title=f"{shown_model(handle)} · mean over 2 images")
    np.testing.assert_array_equal(pixels(figure), expected.background)


def test_missing_weights_are_explained_in_the_page_and_an_upload_fixes_it(monkeypatch, tmp_path):
    monkeypatch.setenv("VIT_INSPECT_CHECKPOINTS", str(tmp_path))  # no weights here, and the hub is offline
    demo = build_demo(AppConfig(device="cpu"), ModelCache())
    try:
        client = Client(launch(demo), verbose=False)
        status = client.predict(api_name="/startup")[0]
        assert "could not be loaded" in status
        assert "not available on this server" in status
        assert str(tmp_path) not in status  # the web user never sees a server folder; the console does
        assert "upload a `.safetensors` weights file" in status
        # the page's first image meets no model: nothing shown and no second message beside the status line
        assert client.predict(handle_file(str(CHELSEA)), api_name="/analyze_first_image")[0] == {"__type__": "update"}
        assert ".safetensors" in refused(client, "deit_tiny_patch16_224", handle_file(str(CHELSEA)),
                                         api_name="/load_model")
        loaded = client.predict("deit_tiny_patch16_224", handle_file(str(WEIGHTS)), api_name="/load_model")[0]
        assert "`deit_tiny_patch16_224`" in loaded and "deit_tiny_patch16_224.safetensors" in loaded
        labels = [c["label"] for c in analyze(client)["predictions"]["confidences"]]
        assert any(cat in labels[0] for cat in CATS)
    finally:
        demo.close()


def test_a_backward_rollout_range_is_swapped_on_the_sliders_as_faithfulness_swaps_it(client):
    analyze(client)
    picture, first, last = client.predict(first_layer=9, last_layer=3, api_name="/rollout")
    assert (first, last) == (3, 9)  # the sliders show the range drawn
    forward, *kept = client.predict(first_layer=3, last_layer=9, api_name="/rollout")
    assert kept == [{"__type__": "update"}] * 2  # a forward range leaves the sliders alone
    assert pixels(picture).shape == pixels(forward).shape and not np.array_equal(pixels(picture), pixels(forward))


def test_curated_models_that_cannot_load_here_are_marked_before_a_pick(monkeypatch):
    from vit_inspect.core import hub
    from vit_inspect.ui import inputs

    at_hand = {"deit_tiny_patch16_224"}
    monkeypatch.setattr(inputs, "weights_at_hand", lambda name: name in at_hand)
    monkeypatch.setattr(hub, "offline_by_setting", lambda: True)  # HF_HUB_OFFLINE: the hub is not asked
    monkeypatch.setattr(hub, "hub_reachable", lambda: pytest.fail("an offline server probed the hub"))
    choices = dict((value, label) for label, value in inputs.model_choices(inputs.CURATED_MODELS, ("my_vit",)))
    assert choices["deit_tiny_patch16_224"] == "deit_tiny_patch16_224"
    assert choices["deit_small_patch16_224"] == "deit_small_patch16_224 · needs the hub"
    assert sum(label.endswith("needs the hub") for label in choices.values()) == len(inputs.CURATED_MODELS) - 1
    assert inputs.model_choices(("my_vit",), ("my_vit",)) == [("my_vit", "my_vit")]  # the operator's own model
    monkeypatch.setattr(hub, "offline_by_setting", lambda: False)
    monkeypatch.setattr(hub, "hub_reachable", lambda: True)  # online: every curated model can be fetched
    assert all(label == value for label, value in inputs.model_choices(inputs.CURATED_MODELS))
    monkeypatch.setattr(hub, "hub_reachable", lambda: False)  # a hub that does not answer: as offline
    assert inputs.model_choices(("deit_base_patch16_224",)) == [("deit_base_patch16_224 · needs the hub",
                                                                 "deit_base_patch16_224")]


def test_weights_at_hand_reads_the_checkpoints_folder_and_the_hub_cache(tmp_path, monkeypatch):
    from vit_inspect.core.load import weights_at_hand

    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    assert not weights_at_hand("deit_small_patch16_224", tmp_path)
    (tmp_path / "deit_small_patch16_224.safetensors").write_bytes(b"")
    assert weights_at_hand("deit_small_patch16_224", tmp_path)
    assert weights_at_hand("deit_tiny_patch16_224")  # the repository's checkpoints/ (the real weights)


def test_the_same_input_again_changes_nothing_and_costs_no_pass(server, client):
    """Gradio's image fires two changes when an upload replaces an image: the second costs no pass and
    draws nothing (its controls are still checked)."""
    analyze(client)
    before = server.forwards
    again = analyze(client)
    assert server.forwards == before
    assert all(value == {"__type__": "update"} for value in again.values())
    assert "must be a number" in refused(client, handle_file(str(CHELSEA)), layer="deep", api_name="/analyze")
    assert analyze(client, REPO / "assets" / "coffee.png")["predictions"]["label"] == "espresso (#967)"
    assert server.forwards == before + 1


def test_the_status_line_gives_a_non_square_inputs_own_grid(client, tmp_path):
    from support import dog_and_cat

    pair = tmp_path / "dog_and_cat.png"
    dog_and_cat(pair)
    answer = client.predict(handle_file(str(pair)), "whole image, aspect kept", 224, api_name="/analyze")
    status = answer[ANALYZE_OUTPUTS.index("status")]
    assert "on a 14×14 grid at its own size; **this input: 224×" in status and "a 14×" in status.split("this input")[1]
    square = client.predict(handle_file(str(CHELSEA)), "model's centre crop", 224,
                            api_name="/analyze")[ANALYZE_OUTPUTS.index("status")]
    assert "this input" not in square and "on a 14×14 grid" in square
