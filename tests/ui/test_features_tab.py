"""The Features view's handlers on the real DeiT-Ti with a small random SAE: the table of a patch is `encode()`
of that patch's token computed directly, the map is that feature's codes over the grid, the SAE's bytes are
counted in the session store, and a file for another model, width or depth, a pickle, an oversized file or a
name not offered gets a sentence without a server path. With a feature index beside a server SAE (built here by
the library's own builder), the table's labels and the gallery's crops are the index's, and the feature's
Grad-CAM, LeGrad and AttnLRP are `passes.targets`' maps computed directly."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from dataclasses import replace
from types import SimpleNamespace

import gradio as gr
import numpy as np
import pytest
import torch
from gradio import utils as gradio_utils
from support.sae import FEATURES, K, random_sae

from vit_inspect.analysis.sae import encode, normalise
from vit_inspect.core.errors import InputError, VitInspectError
from vit_inspect.core.images import load_image
from vit_inspect.core.sae_file import SparseAutoencoder, save_sae
from vit_inspect.core.sae_index import index_path, read_index, save_index
from vit_inspect.jobs.sae_index import build_index
from vit_inspect.passes.sae import block_output, edited_block_output
from vit_inspect.passes.targets import TARGET_METHODS, FeatureTarget, target_maps
from vit_inspect.plots.maps import enlarged
from vit_inspect.plots.sae import GALLERY_SCALE, outlined
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.model_cache import CacheKey
from vit_inspect.ui.session_store import SessionStore
from vit_inspect.ui.tabs.features import (
    MAX_SCALE,
    NO_INDEX_UPLOAD,
    PRESS_ENCODE,
    TOP_FEATURES,
    FeaturesTab,
)
from vit_inspect.ui.sae_files import index_nbytes, sae_bytes, server_saes

CHELSEA = Path(__file__).resolve().parents[2] / "assets" / "chelsea.png"


@pytest.fixture(scope="module")
def uploads():
    """A folder inside Gradio's upload folder, where a client's files may be (`ui.untrusted.client_file`)."""
    folder = Path(gradio_utils.get_upload_folder()) / f"features-test-{uuid.uuid4().hex}"
    folder.mkdir(parents=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def app(deit, tmp_path_factory):
    key = CacheKey.of("deit_tiny_patch16_224", None, "cpu")
    folder = tmp_path_factory.mktemp("server_saes")
    save_sae(random_sae(seed=1), folder / "server_l6.safetensors")
    (folder / "notes.txt").write_text("not an SAE")
    config = AppConfig(device="cpu", sae_folder=str(folder), max_sae_upload_mb=1.0)
    return SimpleNamespace(config=config, store=SessionStore(2 ** 30), handle=lambda k: deit, key=key, folder=folder)


@pytest.fixture(scope="module")
def session(deit, app):
    pixels, rgb = deit.preprocess.apply(load_image(CHELSEA))
    return SimpleNamespace(model=app.key, result=SimpleNamespace(rgb=rgb), image_words="chelsea.png (centre crop)",
                           model_label="deit_tiny_patch16_224", digest="chelsea", target=(281, None),
                           target_words=lambda: "class tabby (#281)", pixels=pixels)


def direct_codes(deit, sae: SparseAutoencoder, pixels: torch.Tensor) -> torch.Tensor:
    """(P, F) codes of the patch tokens of block `sae.info.layer`, computed here without the app."""
    seen = []
    with torch.no_grad(), block_output(deit, sae.info.layer, seen.append, stop=True):
        deit.forward(pixels)
    patches = seen[0][0, deit.layout().patch_slice]
    return encode(normalise(patches, sae), sae.W_enc, sae.b_enc, sae.b_dec, sae.info.k)


def loaded(tab: FeaturesTab, app, uploads, sae: SparseAutoencoder, name: str = "sae.safetensors"):
    path = uploads / name
    save_sae(sae, path)
    return tab.load({"path": str(path), "orig_name": name}, None, None, app.key, progress=lambda *a, **k: None)


def test_a_patch_table_and_a_map_are_the_codes_of_that_patch(deit, app, session, uploads):
    tab = FeaturesTab(app)
    sae = random_sae()
    before = app.store.held
    state, sae_id, status = loaded(tab, app, uploads, sae)
    assert app.store.held - before == sae_bytes(sae) == 4 * (2 * 192 * FEATURES + FEATURES + 192 + 192 + 1)
    assert sae_id[0] == "sae.safetensors" and "block 6 output, 256 features, top-8" in status
    encoded, picture, rows, feature, note, shelf, shelf_note, *explained = tab.encode(
        session, state, app.key, progress=lambda *a, **k: None)
    assert shelf is None and "no feature index" not in shelf_note and shelf_note == NO_INDEX_UPLOAD
    assert explained == [gr.skip()] * 3 and all(r[2] == "" for r in rows)  # no index: no labels
    codes = direct_codes(deit, sae, session.pixels)  # (196, 256)
    strongest = int(codes.max(0).values.argmax())
    assert feature == strongest == encoded.feature
    row, col = encoded.patch
    grid_w = deit.layout().grid_w
    assert int(codes[:, strongest].argmax()) == row * grid_w + col
    expected = codes[row * grid_w + col]
    top = [(i, v) for i, v in zip(*map(torch.Tensor.tolist, expected.topk(TOP_FEATURES)[::-1])) if v > 0]
    assert len(rows) == len(top) == K  # a random SAE's codes: k positive values per patch
    assert [r[0] for r in rows] == [i for i, _ in top]
    np.testing.assert_allclose([r[1] for r in rows], [v for _, v in top], atol=1e-4)
    assert picture.shape[1] > 448 and f"feature {strongest}, the image's strongest" in note

    # a click on the map's pixel (x, y) of the crop enlarged twice: the patch under it, its codes in the table
    event = SimpleNamespace(index=[2 * (16 * 3 + 5), 2 * (16 * 9 + 2)])
    clicked, _, rows = tab.pick_patch(event, encoded)
    assert clicked.patch == (9, 3)
    token = codes[9 * grid_w + 3]
    assert [r[0] for r in rows] == token.topk(K).indices.tolist() and all(v > 0 for _, v, _ in rows)
    assert tab.pick_patch(SimpleNamespace(index=[2 * 224 + 10, 5]), encoded) == (gr.skip(),) * 3  # the colour bar

    # the map of a feature is its codes on the grid
    other = int(token.topk(1).indices)
    shown, *_ = tab.show_feature(clicked, other)
    features, _ = shown.slot.get()
    np.testing.assert_allclose(features.feature_grid(other).ravel(), codes[:, other].numpy(), atol=1e-5)
    with pytest.raises(VitInspectError, match="between 0 and 255"):
        tab.show_feature(clicked, FEATURES)
    by_row, *_, typed = tab.pick_row(SimpleNamespace(row_value=[other, 1.5]), clicked)  # a click on a table row
    assert by_row.feature == typed == other and by_row.patch == clicked.patch


@pytest.mark.parametrize("scale", [0.0, 3.0])
def test_an_edit_changes_the_logits_as_a_direct_forward_with_the_same_edit(deit, app, session, uploads, scale):
    tab = FeaturesTab(app)
    sae = random_sae(seed=2)
    state, _, _ = loaded(tab, app, uploads, sae, "edit.safetensors")
    quiet = {"progress": lambda *a, **k: None}
    encoded = tab.encode(session, state, app.key, **quiet)[0]
    feature = encoded.feature
    made, before, after, picture, note = tab.edit(session, encoded, state, app.key, scale, **quiet)
    with torch.no_grad():
        plain = deit.forward(session.pixels)[0]
        with edited_block_output(deit, sae, deit.layout(), {feature: scale}):
            direct = deit.forward(session.pixels)[0]
    edited = made.slot.get().logits
    np.testing.assert_allclose(encoded.slot.get()[0].logits, plain.numpy(), atol=1e-5)
    np.testing.assert_allclose(edited, direct.numpy(), atol=1e-5)
    assert float((direct - plain).abs().max()) > 1e-3  # the edit moved the logits
    top = int(plain.argmax())
    assert f"changes by {float(direct[top] - plain[top]):+.4g} logits" in note
    assert (made.feature, made.scale) == (feature, scale) and sum(after.values()) <= 1 and before != after
    assert picture.shape[1] > 2 * 224 and note.startswith(f"**Edited pass**: feature {feature} × {scale:g} at block 6")
    with pytest.raises(VitInspectError, match="between -10 and 10"):
        tab.edit(session, encoded, state, app.key, MAX_SCALE + 1)
    with pytest.raises(VitInspectError, match="must be a number, not NaN"):
        tab.edit(session, encoded, state, app.key, float("nan"))
    other, _, _ = loaded(tab, app, uploads, random_sae(seed=3), "other.safetensors")
    with pytest.raises(VitInspectError, match="another SAE"):
        tab.edit(session, encoded, other, app.key, scale)


def test_files_for_another_model_or_unsafe_files_get_a_sentence(app, uploads):
    tab = FeaturesTab(app)
    cases = {"wide.safetensors": (random_sae(width=384), "384-wide tokens"),
             "deep.safetensors": (random_sae(layer=12), "blocks (0 to 11)"),
             "other.safetensors": (random_sae(model="vit_small_patch16_224"), "was trained on")}
    for name, (sae, words) in cases.items():
        with pytest.raises(VitInspectError, match=words.replace("(", r"\(").replace(")", r"\)")) as refused:
            loaded(tab, app, uploads, sae, name)
        assert str(uploads) not in refused.value.public
    pickle = uploads / "sae.pt"
    torch.save(random_sae().tensors(), pickle)
    with pytest.raises(VitInspectError, match="pickled checkpoint") as refused:
        tab.load(str(pickle), None, None, app.key)
    assert str(uploads) not in refused.value.public
    big = uploads / "big.safetensors"
    big.write_bytes(b"\0" * (2 ** 20 + 1))
    with pytest.raises(VitInspectError, match="larger than the 1 MiB"):
        tab.load(str(big), None, None, app.key)
    with pytest.raises(VitInspectError, match="not available"):
        tab.load(str(app.folder / "server_l6.safetensors"), None, None, app.key)  # the folder is no upload folder
    saev = uploads / "saev_sae"
    saev.write_bytes(b'{"d_vit": 192, "exp_factor": 1}\n')
    with pytest.raises(VitInspectError, match="give the block"):
        tab.load(str(saev), None, None, app.key)


def test_the_servers_saes_are_offered_by_name_only(app):
    assert server_saes(str(app.folder)) == ["server_l6.safetensors"]
    tab = FeaturesTab(app)
    assert tab.choices()["choices"] == ["server_l6.safetensors"]
    _, sae_id, status = tab.load(None, "server_l6.safetensors", None, app.key, progress=lambda *a, **k: None)
    assert sae_id[0] == "server_l6.safetensors" and str(app.folder) not in status
    for name in ("../server_l6.safetensors", "notes.txt", str(app.folder / "server_l6.safetensors"), "nothing"):
        with pytest.raises(VitInspectError, match="no SAE of that name"):
            tab.load(None, name, None, app.key)
    assert server_saes(None) == [] and server_saes(os.devnull) == []


QUIET = {"progress": lambda *a, **k: None}


@pytest.fixture(scope="module")
def indexed(deit, tmp_path_factory):
    """A server folder with an SAE and its index built over two photos, an SAE beside another SAE's index, and
    an SAE without one and one beside a damaged index; the app that offers them."""
    folder = tmp_path_factory.mktemp("indexed_saes")
    sae = random_sae(seed=6)
    save_sae(sae, folder / "indexed.safetensors")
    built = build_index(deit, sae, folder / "indexed.safetensors", [CHELSEA, CHELSEA.with_name("coffee.png")],
                        top=3, crop=32, labels=2)
    save_index(built, index_path(folder / "indexed.safetensors"))
    save_sae(random_sae(seed=7), folder / "mismatched.safetensors")
    save_index(built, index_path(folder / "mismatched.safetensors"))
    save_sae(random_sae(seed=8), folder / "bare.safetensors")
    save_sae(sae, folder / "damaged.safetensors")
    index_path(folder / "damaged.safetensors").write_bytes((2 ** 40).to_bytes(8, "little") + b"{}")  # a lying header
    config = AppConfig(device="cpu", sae_folder=str(folder), max_sae_upload_mb=1.0)
    app = SimpleNamespace(config=config, store=SessionStore(2 ** 30), handle=lambda k: deit,
                          key=CacheKey.of("deit_tiny_patch16_224", None, "cpu"), folder=folder)
    return app, sae, read_index(index_path(folder / "indexed.safetensors"))


def places(picture: np.ndarray, tile: np.ndarray) -> list[tuple[int, int]]:
    """The (y, x) corners where ``tile`` appears, pixel for pixel, in ``picture``."""
    h, w = tile.shape[:2]
    found = []
    for y, x in zip(*np.nonzero((picture[:-h + 1, :-w + 1] == tile[0, 0]).all(-1))):
        if np.array_equal(picture[y:y + h, x:x + w], tile):
            found.append((int(y), int(x)))
    return found


def test_an_index_beside_a_server_sae_labels_the_table_and_shows_its_crops(indexed, session):
    app, sae, index = indexed
    tab = FeaturesTab(app)
    before = app.store.held
    state, _, status = tab.load(None, "indexed.safetensors", None, app.key, **QUIET)
    features = sae.info.features  # activation, image and (row, col) of 3 patches with their 32-px crops; 2 labels
    assert index_nbytes(index) == features * 3 * (3 * 32 * 32 + 4 + 4 + 8) + features * (8 * 2 + 4)
    assert app.store.held - before == sae_bytes(sae) + index_nbytes(index)
    assert "Its feature index (3 patches per feature)" in status and str(app.folder) not in status
    encoded, _, rows, feature, _, shelf, shelf_note, *_ = tab.encode(session, state, app.key, **QUIET)
    assert [r[2] for r in rows] == [index.label(r[0]) for r in rows] and any(r[2] for r in rows)

    def crops_shown(picture, feature):  # each filled slot's crop, outlined and enlarged, is in the picture
        filled = np.flatnonzero(index.image[feature] >= 0)
        assert len(filled) > 0
        for slot in filled:
            crop = np.asarray(index.crops[feature, slot])
            tile = enlarged(outlined(crop, index.patch_size), GALLERY_SCALE)
            spots = places(picture, tile)
            assert len(spots) >= 1
            y, x = spots[0]  # the crop's own pixels, away from the outline, are the index's
            inside = enlarged(crop, GALLERY_SCALE) == picture[y:y + tile.shape[0], x:x + tile.shape[1]]
            assert inside.mean() > 0.9

    crops_shown(shelf, feature)
    assert shelf_note.startswith(f"Feature {feature}'s {int((index.image[feature] >= 0).sum())} most activating")
    other = next(r[0] for r in rows if r[0] != feature and r[2])
    shown, _, picked, picked_note, *_ = tab.show_feature(encoded, other)
    assert shown.feature == other and f"Feature {other}'s" in picked_note
    crops_shown(picked, other)


def test_an_index_of_another_sae_or_none_gets_a_sentence(indexed, session):
    app, _, _ = indexed
    tab = FeaturesTab(app)
    state, _, status = tab.load(None, "mismatched.safetensors", None, app.key, **QUIET)
    assert state.index is None and status.endswith("The feature index belongs to another SAE. Its galleries and labels "
                                                   "are off.")
    state, _, status = tab.load(None, "damaged.safetensors", None, app.key, **QUIET)
    assert state.index is None and status.endswith("Its galleries and labels are off.")
    assert "damaged" in status and str(app.folder) not in status
    state, _, status = tab.load(None, "bare.safetensors", None, app.key, **QUIET)
    sentence = ("bare.safetensors has no feature index beside it; the operator builds one with "
                "`vit-inspect sae index FOLDER --sae bare.safetensors`.")
    assert state.index is None and status.endswith(sentence) and str(app.folder) not in status
    _, _, rows, _, _, shelf, shelf_note, *_ = tab.encode(session, state, app.key, **QUIET)
    assert shelf is None and shelf_note == sentence and all(r[2] == "" for r in rows)


def test_an_uploaded_index_beside_an_uploaded_sae_labels_its_table_and_is_checked(indexed, session, uploads):
    app, sae, index = indexed
    tab = FeaturesTab(app)
    save_sae(sae, uploads / "mine.safetensors")
    shutil.copy(index_path(app.folder / "indexed.safetensors"), uploads / "mine.index.safetensors")
    upload = {"path": str(uploads / "mine.safetensors"), "orig_name": "mine.safetensors"}
    before = app.store.held
    state, _, status = tab.load(upload, None, None, app.key, {"path": str(uploads / "mine.index.safetensors"),
                                                              "orig_name": "mine.index.safetensors"}, **QUIET)
    assert app.store.held - before == sae_bytes(sae) + index_nbytes(index)
    assert "Its feature index (3 patches per feature)" in status and str(uploads) not in status
    _, _, rows, feature, _, shelf, shelf_note, *_ = tab.encode(session, state, app.key, **QUIET)
    assert [r[2] for r in rows] == [index.label(r[0]) for r in rows] and any(r[2] for r in rows)
    assert shelf is not None and shelf_note.startswith(f"Feature {feature}'s")
    # another SAE's index, a pickle and a file over the page's upload bound: the SAE loads without them
    save_sae(random_sae(seed=9), uploads / "other.safetensors")
    other = {"path": str(uploads / "other.safetensors"), "orig_name": "other.safetensors"}
    state, _, status = tab.load(other, None, None, app.key, str(uploads / "mine.index.safetensors"), **QUIET)
    assert state.index is None and status.endswith("The feature index belongs to another SAE. Its galleries and "
                                                   "labels are off.")
    (uploads / "evil.index.safetensors").write_bytes(b"\x80\x04cos\nsystem\n(S'echo pwned'\ntR.")
    state, _, status = tab.load(upload, None, None, app.key, str(uploads / "evil.index.safetensors"), **QUIET)
    assert state.index is None and status.endswith("Its galleries and labels are off.") and str(uploads) not in status
    small = FeaturesTab(SimpleNamespace(**{**vars(app), "config": replace(app.config, max_upload_mb=0.05)}))
    state, _, status = small.load(upload, None, None, app.key, str(uploads / "mine.index.safetensors"), **QUIET)
    assert state.index is None and "larger than the 0.05 MiB this server accepts" in status
    with pytest.raises(InputError, match="not available"):  # only files in the upload folder are read
        tab.load(upload, None, None, app.key, str(index_path(app.folder / "indexed.safetensors")), **QUIET)


def test_the_explained_feature_has_the_maps_of_passes_targets(deit, indexed, session):
    app, sae, _ = indexed
    tab = FeaturesTab(app)
    state, _, _ = tab.load(None, "indexed.safetensors", None, app.key, **QUIET)
    with pytest.raises(VitInspectError, match="Press \\*\\*Encode this image\\*\\* first"):
        tab.explain(session, None, state, app.key, **QUIET)
    encoded = tab.encode(session, state, app.key, **QUIET)[0]
    feature = encoded.feature
    before = app.store.held
    made, picture, note = tab.explain(session, encoded, state, app.key, **QUIET)
    direct = target_maps(deit, session.pixels, FeatureTarget(sae, feature))
    maps = made.slot.get()
    assert tuple(maps.maps) == TARGET_METHODS and made.feature == feature
    for method in TARGET_METHODS:
        np.testing.assert_allclose(maps.maps[method], direct.maps[method], atol=1e-5, rtol=1e-5)
    assert abs(maps.score - direct.score) <= 1e-4 * max(1.0, abs(direct.score))
    assert app.store.held - before == sum(m.nbytes for m in direct.maps.values())
    assert picture.shape[1] > 3 * 224 and note.startswith(f"**Why feature {feature} fires here**")
    assert made.basis.options == f'{{"feature": {feature}}}' and made.basis.extra == encoded.basis.extra

    # another feature shown: the maps of this one are cleared with a sentence; the same one keeps them
    other = (feature + 1) % sae.info.features
    *_, state_out, shown_maps, sentence = tab.show_feature(encoded, other, made)
    assert state_out is None and shown_maps is None
    assert sentence.startswith(f"*Cleared: these maps explained feature {feature}; the view now shows feature {other}")
    assert tab.show_feature(encoded, feature, made)[-3:] == (gr.skip(),) * 3
    assert tab.pick_row(SimpleNamespace(row_value=[other, 1.0]), encoded, made)[-4] is None
    another, _, _ = tab.load(None, "bare.safetensors", None, app.key, **QUIET)
    with pytest.raises(VitInspectError, match=f"another SAE; press {PRESS_ENCODE.replace('*', '.')} again"):
        tab.explain(session, encoded, another, app.key, **QUIET)
