"""The Features view through the served app: an uploaded SAE (no index: no labels, a sentence for the gallery),
the image encoded, a click and a feature, an edit, the feature explained, and the stale-result rule (a new image,
another SAE, another model clear what was made before)."""
from __future__ import annotations

import pytest
from gradio_client import Client, handle_file
from support.app import APP_MARKS, CHELSEA, analyze, dependency, queue_call
from support.sae import random_sae

from vit_inspect.core.sae_file import save_sae
from vit_inspect.ui.tabs.features import NO_INDEX_UPLOAD

pytestmark = [*APP_MARKS, pytest.mark.slow]
COFFEE = CHELSEA.with_name("coffee.png")


def shown(client: Client, api_name: str, *args) -> dict:
    """An event's outputs (states left out, as gradio_client gives them) by elem_id."""
    ids = {c["id"]: c.get("props", {}).get("elem_id") for c in client.config["components"] if c["type"] != "state"}
    outputs = [ids[i] for i in dependency(client, api_name)["outputs"] if i in ids]
    answer = client.predict(*args, api_name=f"/{api_name}")
    return dict(zip(outputs, answer if isinstance(answer, tuple) else (answer,), strict=True))


def test_an_uploaded_sae_encodes_clicks_edits_and_goes_stale(server, tmp_path):
    client = Client(server.url, verbose=False)
    save_sae(random_sae(seed=4), tmp_path / "first.safetensors")
    save_sae(random_sae(seed=5), tmp_path / "second.safetensors")
    analyze(client)
    loaded = shown(client, "features_load_sae", handle_file(str(tmp_path / "first.safetensors")), None, None)
    assert loaded["features-sae-status"] == ("SAE **first.safetensors** (block 6 output, 256 features, top-8, all "
                                             "tokens) loaded for `deit_tiny_patch16_224 (deit_tiny_patch16_224.safetensors)`. "
                                             + NO_INDEX_UPLOAD)
    assert str(tmp_path) not in loaded["features-sae-status"]
    encoded = shown(client, "features_encode")
    assert encoded["features-map"] and len(encoded["features-table"]["data"]) == 8
    assert encoded["features-table"]["headers"] == ["feature", "activation", "label"]
    assert all(row[2] == "" for row in encoded["features-table"]["data"])  # an upload has no index: no labels
    assert encoded["features-gallery"] is None and encoded["features-gallery-note"] == NO_INDEX_UPLOAD
    assert encoded["features-note"].startswith("Encoded chelsea.png \\(model's centre crop")
    first = encoded["features-table"]["data"][0][0]
    forwards = server.forwards
    clicked = queue_call(client, "features_patch", [None], {"index": [2 * 16 * 7 + 3, 2 * 16 * 2 + 3], "value": None})
    assert clicked["success"] and server.forwards == forwards  # a click redraws from the stored codes
    assert shown(client, "features_feature", first)["features-map"]
    edited = shown(client, "features_edit", 0)
    assert edited["features-edit-note"].startswith("**Edited pass**") and edited["features-top-after"]["confidences"]
    assert server.forwards == forwards + 1  # the edit is one more pass
    explained = shown(client, "features_explain")
    assert explained["features-explained"] and server.forwards == forwards + 2  # and so is the explanation
    assert explained["features-explain-note"].startswith(f"**Why feature {first} fires here**")
    other = shown(client, "features_feature", encoded["features-table"]["data"][1][0])
    assert other["features-explained"] is None and other["features-explain-note"].startswith("*Cleared: these maps")
    assert other["features-gallery"] is None and other["features-gallery-note"] == NO_INDEX_UPLOAD
    shown(client, "features_feature", first)
    shown(client, "features_explain")

    shown(client, "features_load_sae", handle_file(str(tmp_path / "second.safetensors")), None, None)
    cleared = shown(client, "stale_check_sae")
    assert cleared["features-map"] is None and "another SAE was loaded" in cleared["features-note"]
    assert "another SAE was loaded" in cleared["features-edit-note"]
    assert cleared["features-explained"] is None and "another SAE was loaded" in cleared["features-explain-note"]
    assert shown(client, "features_encode")["features-map"]
    analyze(client, COFFEE)
    cleared = shown(client, "stale_check_image")
    assert cleared["features-map"] is None and cleared["features-table"]["data"] == []
    assert "(these were for chelsea.png (model" in cleared["features-note"] and "**Encode this image**" in cleared["features-note"]


def test_an_index_uploaded_beside_the_sae_labels_the_table_and_draws_galleries(server, deit, tmp_path):
    from vit_inspect.core.sae_index import index_path, save_index
    from vit_inspect.jobs.sae_index import build_index

    client = Client(server.url, verbose=False)
    sae = random_sae(seed=4)
    save_sae(sae, tmp_path / "mine.safetensors")
    index = build_index(deit, sae, tmp_path / "mine.safetensors", [CHELSEA, COFFEE], top=3, crop=32, labels=2)
    save_index(index, index_path(tmp_path / "mine.safetensors"))
    analyze(client)
    loaded = shown(client, "features_load_sae", handle_file(str(tmp_path / "mine.safetensors")), None, None,
                   handle_file(str(index_path(tmp_path / "mine.safetensors"))))
    assert loaded["features-sae-status"].endswith("Its feature index (3 patches per feature) labels and illustrates "
                                                  "each feature.")
    encoded = shown(client, "features_encode")
    rows = encoded["features-table"]["data"]
    assert [row[2] for row in rows] == [index.label(int(row[0])) for row in rows] and any(row[2] for row in rows)
    assert encoded["features-gallery"] and encoded["features-gallery-note"].startswith("Feature ")
    other = shown(client, "features_load_sae", handle_file(str(tmp_path / "mine.safetensors")), None, None,
                  handle_file(str(CHELSEA)))  # a photo is no index: the SAE loads, the index is refused
    assert other["features-sae-status"].endswith("Its galleries and labels are off.")
    assert str(tmp_path) not in other["features-sae-status"]
