"""The Features view: a top-k sparse autoencoder (SAE) on one block's output, read on the page's image.

An SAE is uploaded (untrusted: a size cap, this tool's safetensors format or saev's through `core.sae_load`,
never unpickled) or chosen from the operator's folder (`AppConfig.sae_folder`); it must fit the model in use
(`core.sae_file.check_fits`), and it lives in the byte-bounded session store, its tensors' bytes counted.
**Encode this image** runs one forward pass with the SAE's block read (`passes.sae_image.sparse_codes`): a
click on the map then lists that patch's most active features, and a feature's number draws its activation
over the image. **Apply the edit** scales the mapped feature at every token the SAE reads (0 switches it off) in
one more pass (`passes.sae.edited_block_output`, the SAE's error kept), and shows that pass's prediction and
map beside the unedited ones, labelled as edited; the page's own pass and maps stay unedited. The SAE is
cleared when the model changes, the codes and the edit when the model, the image or the SAE changes
(`ui.stale`).

An SAE comes with its feature index (`core.sae_index`) when one is uploaded beside it (untrusted like the SAE:
the page's upload bound, its header, shapes and every index in it checked before use) or, for an SAE of the
operator's folder, when ``<stem>.index.safetensors`` sits beside it. Either is checked to belong to that SAE and
its bytes are counted in the session store; an index that does not fit is a sentence and the SAE loads without
it. The table then
labels each feature with the classes where it fires, and the shown feature's top-activating patches over the
index's folder are drawn under the map. **Explain this feature** runs one more pass for Grad-CAM, LeGrad and
AttnLRP of the shown feature's activation summed over the patches (`passes.targets`); its maps are cleared
when the image, the SAE or the shown feature changes.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import gradio as gr
import numpy as np

from vit_inspect.core.errors import InputError
from vit_inspect.core.sae_file import SparseAutoencoder, check_fits
from vit_inspect.core.sae_index import SAEIndex
from vit_inspect.core.sae_load import load_sae
from vit_inspect.passes.sae_image import SparseCodes, sparse_codes, top_at
from vit_inspect.passes.targets import FeatureTarget, TargetMaps, target_maps
from vit_inspect.plots import canvas
from vit_inspect.plots import maps as map_plots
from vit_inspect.plots.sae import feature_gallery
from vit_inspect.ui.common import (
    MAP_OUT,
    MODEL_PASS,
    RAW,
    OutputImage,
    says_refusals,
    shown_model,
    shows_errors,
    upload_folders,
)
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.sae_files import (
    NO_INDEX_UPLOAD,
    file_digest,
    is_saev,
    sae_bytes,
    served_index,
    server_saes,
    uploaded_index,
)
from vit_inspect.ui.panels import MAIN_MAP_PIXELS
from vit_inspect.ui.session_store import Slot
from vit_inspect.ui.stale import NOTE, Basis, Tracked, cleared_sentence
from vit_inspect.ui.untrusted import (
    client_file,
    finite_float,
    finite_int,
    plain_markdown,
    text,
)
from vit_inspect.ui.zerogpu import gpu_pass

TOP_FEATURES = 10  # rows of a patch's table
MAX_SCALE = 10.0  # an edit scales a feature by -MAX_SCALE to MAX_SCALE
TABLE_HEADERS = ["feature", "activation", "label"]
UNIT = "feature activation (SAE units)"
PRESS_LOAD, PRESS_ENCODE, PRESS_EDIT = "**Load the SAE**", "**Encode this image**", "**Apply the edit**"
PRESS_EXPLAIN = "**Explain this feature**"
GALLERY_COLUMNS = 4  # crops per row of a feature's gallery (its captions legible in the view's width)


@dataclass(frozen=True)
class LoadedSAE:
    """The SAE a session loaded: its tensors in the session store, and words for captions."""

    slot: Slot  # the `SparseAutoencoder` in the app's store
    name: str  # its file's name as the user gave it (no folder)
    digest: str  # of the file's bytes: two loads of one file are one SAE
    basis: Basis  # the model it was checked against (level "model")
    index: Slot | None = None  # its `SAEIndex` in the app's store; None: no index
    index_note: str = ""  # why there is no index (a sentence), or "" with one

    @property
    def sae(self) -> SparseAutoencoder:
        return self.slot.get()


@dataclass(frozen=True)
class Encoded:
    """One image's codes under one SAE (in the session store) and what the view shows of them."""

    slot: Slot  # `SparseCodes` of the pass, and the crop it saw: (features, rgb)
    basis: Basis  # model, image and the SAE (extra: `LoadedSAE` name and digest)
    words: str  # model, image and SAE, for captions
    features: int  # F, the SAE's number of features
    patch: tuple[int, int]  # the patch whose features the table lists (row, col)
    feature: int  # the feature the map shows
    index: Slot | None = None  # the SAE's `SAEIndex` (`LoadedSAE.index`); None: no index
    index_note: str = ""  # why there is no index
    sae_text: str = ""  # the SAE, for captions (`sae_words`)

    def feature_index(self) -> SAEIndex | None:
        """The index, or None without one."""
        return None if self.index is None else self.index.get()


@dataclass(frozen=True)
class Edited:
    """The pass with one feature scaled (in the session store) and what it was made from."""

    slot: Slot  # `SparseCodes` of the edited pass
    basis: Basis  # model, image, the SAE (extra) and the edit (options)
    feature: int
    scale: float


@dataclass(frozen=True)
class Explained:
    """The maps of one feature as a target (`TargetMaps`, in the session store) and what they were made from."""

    slot: Slot  # `TargetMaps` of the pass
    basis: Basis  # model, image, the SAE (extra) and the feature (options)
    feature: int


def sae_words(loaded: LoadedSAE, name: str | None = None) -> str:
    """"SAE NAME (block 6 output, 1536 features, top-32, all tokens)", the file's name as given or ``name``."""
    info = loaded.sae.info
    tokens = "patch tokens" if info.tokens == "patches" else "all tokens"
    return f"SAE {loaded.name if name is None else name} (block {info.layer} output, {info.features} features, top-{info.k}, {tokens})"


def feature_panel(encoded: Encoded, features: SparseCodes, rgb: np.ndarray) -> np.ndarray:
    """The shown feature's activation over the image, the table's patch marked, captioned with everything it
    was computed from."""
    grid = features.feature_grid(encoded.feature)
    peak = float(grid.max())
    row, col = encoded.patch
    fires = (f"peak {peak:.3g}" if peak > 0 else "not among any patch's top k on this image")
    caption = (f"Feature {encoded.feature}: {encoded.words} · {fires} · marker: patch ({row}, {col}) listed in the "
               "table · colour range 0 to the peak")
    return map_plots.map_panel(rgb, grid, caption, UNIT, vmin=0.0, vmax=peak if peak > 0 else 1.0, marker=(row, col),
                               scale=picture_scale(features))


def before_after(encoded: Encoded, features: SparseCodes, edited: SparseCodes, rgb: np.ndarray,
                 feature: int, scale: float) -> np.ndarray:
    """The edited feature's map from the unedited pass beside the one from the edited pass, on one colour range."""
    grids = (features.feature_grid(feature), edited.feature_grid(feature))
    peak = max(float(g.max()) for g in grids) or 1.0
    panels = [map_plots.map_panel(rgb, grid, f"{words}: feature {feature}", UNIT, vmin=0.0, vmax=peak)
              for grid, words in zip(grids, ("unedited pass", f"EDITED pass (feature {feature} × {scale:g})"))]
    return canvas.titled(canvas.grid_of(panels, 2), f"Feature {feature} before and after scaling it by {scale:g} at "
                         f"block {features.layer} (the SAE's error kept; codes of the edited tokens re-encoded): "
                         f"{encoded.words} · colour range 0 to {peak:.3g}")


def explanation_kept(explained: Explained | None, feature: int) -> tuple:
    """The explanation's outputs (state, maps, line) when the shown feature becomes ``feature``: left as they
    are when they explain it (or there are none), cleared with a sentence when they explain another."""
    if explained is None or explained.feature == feature:
        return gr.skip(), gr.skip(), gr.skip()
    return None, None, (f"*Cleared: these maps explained feature {explained.feature}; the view now shows feature "
                        f"{feature}. Press {PRESS_EXPLAIN} to explain it.*")


def top_classes(handle, logits: np.ndarray) -> dict | None:
    """The gr.Label value of logits' top 5 (None for a model without a head)."""
    if not handle.has_head:
        return None
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    return {f"{t['label']} (#{t['index']})": t["prob"] for t in handle.top_labels(probs, 5)}


def picture_scale(features: SparseCodes) -> int:
    """The whole factor the map enlarges the crop by, as the page's main maps (`panels.main_scale`)."""
    return max(1, math.ceil(MAIN_MAP_PIXELS / features.layout.input_size[1]))


def table_rows(features: SparseCodes, patch: tuple[int, int], index: SAEIndex | None = None) -> list[list]:
    """The patch's most active features: [feature, activation, the index's label ("" without an index)]."""
    return [[feature, round(value, 4), index.label(feature) if index is not None else ""]
            for feature, value in top_at(features, *patch, TOP_FEATURES)]


def gallery(encoded: Encoded) -> tuple[np.ndarray | None, str]:
    """(the shown feature's top-activating patches from the index as one picture, or None, a line about it):
    each crop titled with its activation and image, the picture captioned with SAE, block, feature and label."""
    index = encoded.feature_index()
    if index is None:
        return None, encoded.index_note
    entry = index.feature(encoded.feature)
    label = f" · {entry.label}" if entry.label else ""
    images = index.built_from.get("images", 0)
    title = (f"Feature {encoded.feature}{label}: its top patches over the index's folder ({images} images), "
             f"{encoded.sae_text} · z: the feature's activation at the outlined patch")
    note = (f"Feature {encoded.feature}'s {len(entry.activations)} most activating patches of the index "
            f"(it fired on {entry.fired:.2%} of the folder's patch tokens).")
    return feature_gallery(entry, index.patch_size, title, GALLERY_COLUMNS), note


METHOD_NAMES = {"gradcam": "Grad-CAM", "legrad": "LeGrad", "attnlrp": "AttnLRP"}


def explain_panel(encoded: Encoded, maps: TargetMaps, rgb: np.ndarray, label: str) -> np.ndarray:
    """The three maps of the feature's summed activation side by side, each with its colour bar and a caption
    naming the method and the blocks it read, under a title naming model, image, SAE, block, feature and label."""
    blocks = maps.legrad_layers
    read = {"gradcam": f"block {maps.gradcam_layer} output, ReLU'd",
            "legrad": f"blocks {blocks[0]}-{blocks[-1]}" if len(blocks) > 1 else f"block {blocks[0]}",
            "attnlrp": "pixels summed per patch"}
    units = {"gradcam": "activation × gradient", "legrad": "relevance (SAE activation units)",
             "attnlrp": "relevance (SAE activation units)"}
    panels = []
    for method, grid in maps.maps.items():
        name = f"{METHOD_NAMES[method]} ({read[method]}) of feature {encoded.feature}"
        if grid is None:
            panels.append(map_plots.note_panel(rgb, f"{METHOD_NAMES[method]}: this model's attention is one the "
                                                    "relevance rules cannot follow; no map."))
            continue
        relu = method == "gradcam"
        low, high = canvas.map_range(grid, relu)
        panels.append(map_plots.map_panel(rgb, grid, name, units[method], vmin=low, vmax=high, relu=relu))
    named = f" ({label})" if label else ""
    return canvas.titled(canvas.grid_of(panels, len(panels)), f"Why feature {encoded.feature}{named} fires here: "
                         f"{encoded.words} · explained score: its activation summed over the patches, "
                         f"{maps.score:.4g}")


def strongest(features: SparseCodes) -> tuple[int, tuple[int, int]]:
    """(the feature with the largest activation anywhere on the image, the patch where it peaks)."""
    patch, column = np.unravel_index(int(np.argmax(features.values)), features.values.shape)
    row, col = divmod(int(patch), features.layout.grid_w)
    return int(features.indices[patch, column]), (row, col)


class FeaturesTab:
    """The view's handlers. ``app`` is the page's `Inspector` (config, model cache, session store)."""

    def __init__(self, app):
        self.app = app
        self.run_pass = gpu_pass(sparse_codes)
        self.run_maps = gpu_pass(target_maps)

    def choices(self):
        listed = server_saes(self.app.config.sae_folder)
        return gr.update(choices=listed, value=None, visible=bool(listed))

    def load(self, upload: object, choice: object, block: object, key, index_upload: object = None,
             progress=gr.Progress()):
        """The SAE of the upload (or, without one, of the operator's folder by name) checked against the model
        in use, with its feature index (`index_upload`, else the one beside a server's SAE): (its state, its
        identity for results, the status line)."""
        choice = text(choice, "The SAE's name", 200)
        cap = int(self.app.config.max_sae_upload_mb * 2 ** 20)
        given = client_file(upload, upload_folders(), max_bytes=cap, default_name="sae")
        served = given is None and bool(choice)
        if given is not None:
            path, name = given
            if isinstance(path, bytes):
                raise InputError("Upload the SAE as a file.")
            if os.path.getsize(path) > cap:
                raise InputError(f"The SAE file is larger than the {cap / 2 ** 20:g} MiB this server accepts.")
        elif choice:
            if choice not in server_saes(self.app.config.sae_folder):
                raise InputError("This server offers no SAE of that name; choose one from the list.")
            path, name = os.path.join(self.app.config.sae_folder, choice), choice
        else:
            raise InputError("Upload an SAE file, or choose one of this server's.")
        block = block.strip() if isinstance(block, str) else block
        layer = None if block in (None, "") else finite_int(block, "The block", 0, 10_000, clamp=False)
        if layer is None and is_saev(path):
            raise InputError("This is a saev SAE file, which does not record the block it reads; give the block "
                             "under **Block (saev files)** and load it again.")
        progress(0.2, desc="Reading the SAE")
        handle = self.app.handle(key)
        sae = load_sae(path, layer=layer, model=handle.name)
        check_fits(sae, handle.name, handle.depth, handle.embed_dim, source=f"The SAE {name!r}")
        slot = self.app.store.put(sae, sae_bytes(sae))
        if index_upload not in (None, "", {}):
            index, index_note = uploaded_index(self.app, index_upload, sae)
        else:
            index, index_note = served_index(self.app, path, sae, name) if served else (None, NO_INDEX_UPLOAD)
        loaded = LoadedSAE(slot, name, file_digest(path), Basis(model=key, model_words=shown_model(handle)), index,
                           index_note)
        status = f"{sae_words(loaded, f'**{plain_markdown(name)}**')} loaded for `{shown_model(handle)}`."
        if index is not None:
            status += f" Its feature index ({index.get().top} patches per feature) labels and illustrates each feature."
        else:
            status += f" {index_note}"
        return loaded, (name, loaded.digest), status

    def encode(self, session, loaded: LoadedSAE | None, key, explained: Explained | None = None,
               progress=gr.Progress()):
        """One forward pass of the session's image with the SAE's block read: the state, the map of the image's
        strongest feature, the table of the patch where it peaks, the feature box, a line saying so, the
        feature's gallery and its line, and the explanation's outputs (`explanation_kept`)."""
        if session is None:
            raise InputError("Analyse an image first; its patches are encoded.")
        if loaded is None:
            raise InputError("Load an SAE first (above).")
        if session.model != key:
            raise InputError("The image is still being analysed with the new model; press again in a moment.")
        sae, handle = loaded.sae, self.app.handle(key)
        check_fits(sae, handle.name, handle.depth, handle.embed_dim, source=f"The SAE {loaded.name!r}")
        progress(0.3, desc=f"One forward pass, reading block {sae.info.layer}")
        rgb = session.result.rgb
        features = self.run_pass(handle, sae, handle.preprocess.normalize(rgb))
        feature, patch = strongest(features)
        slot = self.app.store.put((features, rgb), features.nbytes() + rgb.nbytes)
        encoded = Encoded(slot, Basis.of(session, key, extra=(loaded.name, loaded.digest)),
                          f"{shown_model(handle)}, {session.image_words}, {sae_words(loaded)}", sae.info.features,
                          patch, feature, loaded.index, loaded.index_note, sae_words(loaded))
        note = (f"Encoded {plain_markdown(session.image_words)} with **{plain_markdown(loaded.name)}**. Click the map "
                f"for a patch's features; the map shows feature {feature}, the image's strongest.")
        return (encoded, feature_panel(encoded, features, rgb), table_rows(features, patch, encoded.feature_index()),
                feature, note, *gallery(encoded), *explanation_kept(explained, feature))

    def pick_patch(self, evt: gr.SelectData, encoded: Encoded | None):
        """A click on the map (its pixel in the enlarged crop) lists that patch's features; a click on the colour
        bar or the caption does nothing."""
        if encoded is None or evt.index is None:
            return gr.skip(), gr.skip(), gr.skip()
        if not isinstance(evt.index, (list, tuple)) or len(evt.index) < 2:
            raise InputError("A click gives the (x, y) pixel it landed on; this one gave none.")
        features, rgb = encoded.slot.get()
        scale = picture_scale(features)
        x = finite_float(evt.index[0], "The clicked x", -1e6, 1e6) / scale
        y = finite_float(evt.index[1], "The clicked y", -1e6, 1e6) / scale
        height, width = features.layout.input_size
        if not (0 <= x < width and 0 <= y < height):
            return gr.skip(), gr.skip(), gr.skip()
        encoded = replace(encoded, patch=features.layout.patch_at(y, x))
        rows = table_rows(features, encoded.patch, encoded.feature_index())
        return encoded, feature_panel(encoded, features, rgb), rows

    def show_feature(self, encoded: Encoded | None, feature: object, explained: Explained | None = None):
        """The map of the feature typed in the box (0 to F - 1), its gallery and the line about it, and the
        explanation's outputs (its state, maps, line): cleared when they explain another feature."""
        if encoded is None:
            return (gr.skip(),) * 7
        features, rgb = encoded.slot.get()
        chosen = finite_int(feature, "The feature", 0, encoded.features - 1, clamp=False)
        encoded = replace(encoded, feature=chosen)
        return (encoded, feature_panel(encoded, features, rgb), *gallery(encoded),
                *explanation_kept(explained, chosen))

    def pick_row(self, evt: gr.SelectData, encoded: Encoded | None, explained: Explained | None = None):
        """A click on a row of the table shows that row's feature (`show_feature`), and puts it in the box."""
        if encoded is None or not isinstance(evt.row_value, (list, tuple)) or not evt.row_value:
            return (gr.skip(),) * 8
        shown = self.show_feature(encoded, evt.row_value[0], explained)
        return *shown, shown[0].feature

    def explain(self, session, encoded: Encoded | None, loaded: LoadedSAE | None, key, progress=gr.Progress()):
        """One more pass for Grad-CAM, LeGrad and AttnLRP of the shown feature's activation summed over the
        patches (`passes.targets.target_maps`): (its state, the maps, a line)."""
        if encoded is None:
            raise InputError(f"Press {PRESS_ENCODE} first; the maps explain the feature it shows.")
        if loaded is None or (loaded.name, loaded.digest) != encoded.basis.extra:
            raise InputError(f"The codes shown were made with another SAE; press {PRESS_ENCODE} again.")
        handle, sae = self.app.handle(key), loaded.sae
        check_fits(sae, handle.name, handle.depth, handle.embed_dim, source=f"The SAE {loaded.name!r}")
        _, rgb = encoded.slot.get()
        feature = encoded.feature
        progress(0.3, desc=f"One forward pass and backwards from feature {feature} at block {sae.info.layer}")
        maps = self.run_maps(handle, handle.preprocess.normalize(rgb), FeatureTarget(sae, feature, loaded.name))
        nbytes = sum(m.nbytes for m in maps.maps.values() if m is not None)
        slot = self.app.store.put(maps, nbytes)
        made = Explained(slot, Basis.of(session, key, {"feature": feature}, extra=encoded.basis.extra), feature)
        index = encoded.feature_index()
        label = index.label(feature) if index is not None else ""
        note = (f"**Why feature {feature} fires here**: Grad-CAM, LeGrad and AttnLRP of its activation summed over "
                f"the patches ({maps.score:.4g}), blocks 0 to {sae.info.layer} taking part.")
        return made, explain_panel(encoded, maps, rgb, label), note

    def edit(self, session, encoded: Encoded | None, loaded: LoadedSAE | None, key, scale: object,
             progress=gr.Progress()):
        """One more pass with the mapped feature scaled at every token the SAE reads: (its state, the unedited
        prediction, the edited one, the maps before and after, a line with the top class's change)."""
        if encoded is None:
            raise InputError(f"Press {PRESS_ENCODE} first; the edit applies to the feature it maps.")
        if loaded is None or (loaded.name, loaded.digest) != encoded.basis.extra:
            raise InputError(f"The codes shown were made with another SAE; press {PRESS_ENCODE} again.")
        factor = finite_float(scale, "The scale", -MAX_SCALE, MAX_SCALE, default=0.0, clamp=False)
        handle, sae = self.app.handle(key), loaded.sae
        features, rgb = encoded.slot.get()
        feature = encoded.feature
        progress(0.3, desc=f"One forward pass with feature {feature} × {factor:g} at block {sae.info.layer}")
        edited = self.run_pass(handle, sae, handle.preprocess.normalize(rgb), {feature: factor})
        slot = self.app.store.put(edited, edited.nbytes())
        made = Edited(slot, Basis.of(session, key, {"feature": feature, "scale": factor}, extra=encoded.basis.extra),
                      feature, factor)
        note = f"**Edited pass**: feature {feature} × {factor:g} at block {sae.info.layer}, every token the SAE reads."
        if handle.has_head:
            top = int(features.logits.argmax())
            note += (f" The unedited top class, {plain_markdown(handle.label(top))} (#{top}), changes by "
                     f"{float(edited.logits[top] - features.logits[top]):+.4g} logits; the edited top class is "
                     f"{plain_markdown(handle.label(int(edited.logits.argmax())))} (#{int(edited.logits.argmax())}).")
        return (made, top_classes(handle, features.logits), top_classes(handle, edited.logits),
                before_after(encoded, features, edited, rgb, feature, factor), note)


@dataclass(frozen=True)
class FeaturesView:
    """The Features view's components."""

    tab: gr.Tab
    sae_file: gr.File
    sae_choice: gr.Dropdown
    block: gr.Textbox  # saev's files do not record their block: typed, never a default a user did not choose
    index_file: gr.File  # the SAE's feature index, uploaded beside it (optional)
    load: gr.Button
    sae_status: gr.Markdown
    sae: gr.State  # the `LoadedSAE` (None: none)
    sae_id: gr.State  # (name, digest) of the SAE loaded: what a result's basis records
    encode: gr.Button
    note: gr.Markdown
    picture: gr.Image
    table: gr.Dataframe
    feature: gr.Number
    made_from: gr.State  # the `Encoded` shown
    scale: gr.Number
    apply: gr.Button
    top_before: gr.Label
    top_after: gr.Label
    edited: gr.Image
    edit_note: gr.Markdown
    edit_made_from: gr.State  # the `Edited` shown
    gallery: gr.Image  # the shown feature's top patches from the index
    gallery_note: gr.Markdown
    explain: gr.Button
    explained: gr.Image  # the shown feature's Grad-CAM, LeGrad and AttnLRP
    explain_note: gr.Markdown
    explain_made_from: gr.State  # the `Explained` shown


def layout(settings: PageSettings) -> FeaturesView:
    """The view: the SAE's file and block, its button and status, then the image's map and a patch's table."""
    with gr.Tab("Features", elem_id="features-tab") as tab:
        gr.Markdown("A top-k sparse autoencoder (SAE) on one block's output rewrites each patch token as a few "
                    "active *features* (docs: Sparse autoencoders). Load an SAE trained for the model in use, "
                    "encode the image, then click a patch for its most active features or type a feature for its "
                    "activation over the image.")
        with gr.Row():
            sae_file = gr.File(label="SAE file (.safetensors, or saev's format)", type="filepath", height=100,
                               scale=3, elem_id="features-sae-file")
            sae_choice = gr.Dropdown([], value=None, label="or one of this server's SAEs", visible=False, scale=2,
                                     elem_id="features-sae-choice")
            block = gr.Textbox("", label="Block it reads (saev files only)", placeholder="e.g. 6", max_length=6,
                               scale=1, elem_id="features-block")
            index_file = gr.File(label="Its feature index (optional: .index.safetensors)", type="filepath",
                                 height=100, scale=2, elem_id="features-index-file")
        load = gr.Button("Load the SAE", elem_id="features-load")
        sae_status = gr.Markdown("No SAE loaded.", elem_id="features-sae-status")
        encode = gr.Button("Encode this image", variant="primary", elem_id="features-encode")
        note = gr.Markdown(elem_id="features-note")
        with gr.Row():
            with gr.Column(scale=3, min_width=540):
                picture = OutputImage(elem_id="features-map", **MAP_OUT)
            with gr.Column(scale=2, min_width=240):
                table = gr.Dataframe(headers=TABLE_HEADERS, label="The clicked patch's most active features "
                                     "(click a row to map it)", interactive=False, wrap=True,
                                     column_widths=["22%", "26%", "52%"], elem_id="features-table")
                feature = gr.Number(None, label="Feature to map", precision=0, minimum=0, elem_id="features-feature")
        gallery_note = gr.Markdown(elem_id="features-gallery-note")
        gallery_picture = OutputImage(elem_id="features-gallery", **MAP_OUT)
        gr.Markdown("**Why does this feature fire here?** Grad-CAM, LeGrad and AttnLRP of the mapped feature's "
                    "activation summed over the patches, in one more pass (blocks up to the SAE's take part).")
        explain = gr.Button(PRESS_EXPLAIN.strip("*"), elem_id="features-explain")
        explain_note = gr.Markdown(elem_id="features-explain-note")
        explained = OutputImage(elem_id="features-explained", **MAP_OUT)
        gr.Markdown("**Edit**: scale the mapped feature at every token the SAE reads (0 switches it off), in one "
                    "more pass whose prediction and map show below, beside the unedited ones. The page's other "
                    "views stay unedited.")
        with gr.Row():
            scale = gr.Number(0.0, label=f"Scale (0: off; {-MAX_SCALE:g} to {MAX_SCALE:g})", minimum=-MAX_SCALE,
                              maximum=MAX_SCALE, step=0.5, elem_id="features-scale")
            apply = gr.Button(PRESS_EDIT.strip("*"), elem_id="features-apply")
        edit_note = gr.Markdown(elem_id="features-edit-note")
        with gr.Row():
            top_before = gr.Label(num_top_classes=5, label="Prediction, unedited", elem_id="features-top-before")
            top_after = gr.Label(num_top_classes=5, label="Prediction, EDITED", elem_id="features-top-after")
        edited = OutputImage(elem_id="features-edited", **MAP_OUT)
        sae, sae_id, made_from, edit_made_from = gr.State(None), gr.State(None), gr.State(None), gr.State(None)
        explain_made_from = gr.State(None)
    return FeaturesView(tab, sae_file, sae_choice, block, index_file, load, sae_status, sae, sae_id, encode, note, picture, table,
                        feature, made_from, scale, apply, top_before, top_after, edited, edit_note, edit_made_from,
                        gallery_picture, gallery_note, explain, explained, explain_note, explain_made_from)


def wire(view: FeaturesView, ctx: TabContext) -> None:
    """The view's events: the server's SAEs listed when it opens; the SAE loaded on its button (a refusal a
    sentence in its status line); the image encoded on **Encode this image** (a model pass); a click on the map
    or a row and the feature box redraw from the stored codes. The SAE is under the stale-result check at the
    model's level, the codes at the image's, with the SAE as their own input."""
    handlers = FeaturesTab(ctx.app)
    gr.on(ctx.opened(view.tab), handlers.choices, outputs=[view.sae_choice], api_name="features_saes",
          show_progress="hidden")
    loaded = gr.on([view.load.click], says_refusals(handlers.load, view.sae_status),
                   inputs=[view.sae_file, view.sae_choice, view.block, ctx.key, view.index_file],
                   outputs=[view.sae, view.sae_id, view.sae_status], api_name="features_load_sae",
                   show_progress="hidden", **RAW)
    explanation = [view.explain_made_from, view.explained, view.explain_note]
    gr.on([view.encode.click], says_refusals(handlers.encode, view.note),
          inputs=[ctx.session, view.sae, ctx.key, view.explain_made_from],
          outputs=[view.made_from, view.picture, view.table, view.feature, view.note, view.gallery,
                   view.gallery_note, *explanation], api_name="features_encode",
          show_progress_on=[view.picture], **RAW, **MODEL_PASS)
    gr.on([view.picture.select], shows_errors(handlers.pick_patch), inputs=[view.made_from],
          outputs=[view.made_from, view.picture, view.table], api_name="features_patch", show_progress="hidden",
          **RAW)
    gr.on([view.feature.submit], shows_errors(handlers.show_feature),
          inputs=[view.made_from, view.feature, view.explain_made_from],
          outputs=[view.made_from, view.picture, view.gallery, view.gallery_note, *explanation],
          api_name="features_feature", show_progress="hidden", **RAW)
    gr.on([view.table.select], shows_errors(handlers.pick_row), inputs=[view.made_from, view.explain_made_from],
          outputs=[view.made_from, view.picture, view.gallery, view.gallery_note, *explanation, view.feature],
          api_name="features_row", show_progress="hidden", **RAW)
    gr.on([view.explain.click], says_refusals(handlers.explain, view.explain_note),
          inputs=[ctx.session, view.made_from, view.sae, ctx.key], outputs=explanation,
          api_name="features_explain", show_progress_on=[view.explained], **RAW, **MODEL_PASS)
    gr.on([view.apply.click], says_refusals(handlers.edit, view.edit_note),
          inputs=[ctx.session, view.made_from, view.sae, ctx.key, view.scale],
          outputs=[view.edit_made_from, view.top_before, view.top_after, view.edited, view.edit_note],
          api_name="features_edit", show_progress_on=[view.edited], **RAW, **MODEL_PASS)
    ctx.events["sae"] = loaded
    ctx.track(Tracked("features_sae", view.sae, (view.sae_status,), (NOTE,), "model", PRESS_LOAD,
                      sentence=lambda old, now: f"*Cleared: the model changed. Press {PRESS_LOAD} to load an SAE "
                                                "for the model in use.*"))
    ctx.track(another_sae(Tracked("features", view.made_from,
                                  (view.picture, view.table, view.note, view.gallery, view.gallery_note),
                                  (None, None, NOTE, None, ""), "image", PRESS_ENCODE, extra=view.sae_id)))
    ctx.track(another_sae(Tracked("features_edit", view.edit_made_from,
                                  (view.top_before, view.top_after, view.edited, view.edit_note),
                                  (None, None, None, NOTE), "image", PRESS_EDIT, extra=view.sae_id)))
    ctx.track(another_sae(Tracked("features_explain", view.explain_made_from, (view.explained, view.explain_note),
                                  (None, NOTE), "image", PRESS_EXPLAIN, extra=view.sae_id)))


def another_sae(tracked: Tracked) -> Tracked:
    """``tracked`` whose cleared sentence says so when the SAE changed (its ``extra``), not the model."""
    def sentence(old: Basis, now: Basis) -> str:
        if old.model == now.model and old.extra != now.extra:
            return f"*Cleared: another SAE was loaded. Press {PRESS_ENCODE} to encode the image with it.*"
        return cleared_sentence(tracked, old, now)
    return replace(tracked, sentence=sentence)
