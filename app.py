"""vit_inspect's Gradio app: `python app.py` serves it on http://127.0.0.1:7860.

Gradio only: flags -> `AppConfig` -> `build_demo(config)` -> `gr.Blocks`. A new image runs one pass
(`analyze_image`: one forward, one backward) whose result is kept in the session's `gr.State`;
sliders, clicks and options redraw from it without calling the model. Models live in a bounded
`ModelCache` shared by all sessions and are loaded on first use, never at import.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr
import numpy as np
from PIL import Image
from starlette.middleware import Middleware

from vit_inspect import plotting
from vit_inspect.analysis import class_name, search_classes
from vit_inspect.cli import analysis_record, class_record
from vit_inspect.errors import InputError, VitInspectError
from vit_inspect.geometry import InputGeometry
from vit_inspect.images import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, ImageLimits
from vit_inspect.model_cache import DEFAULT_CACHE_SIZE, CacheKey, ModelCache
from vit_inspect.models import DEFAULT_MODEL, ViTHandle
from vit_inspect.module_spec import model_file_name
from vit_inspect.pipeline import ImageAnalysis, add_relevance, analyze_image, dataset_attention_distance
from vit_inspect.session_store import DEFAULT_BUDGET, SessionStore, Slot, module_nbytes
from vit_inspect.spill import DEFAULT_SPILL_BUDGET, SpillFolder
from vit_inspect.ui import clicks
from vit_inspect.ui import compare as compare_ui
from vit_inspect.ui.attention import attention_tab_layout, map_geometry, wire_attention_tab
from vit_inspect.ui.classes import CLASS_CHOICES, class_choices, find_class
from vit_inspect.ui.common import (OutputImage, describe, download_folder, geometry_updates, model_label,
                                   names_python_file, own_upload_folder, prediction_labels, public_message, shown_model, shows_errors, upload_folders,
                                   upload_source, weights_label)
from vit_inspect.ui.faithfulness import FaithfulnessTab
from vit_inspect.ui.heads import HeadsTab
from vit_inspect.ui.model_tab import ModelTab, model_tab_layout, wire_model_tab
from vit_inspect.ui.ordering import DrawOrder, session_hash
from vit_inspect.ui.panels import IMAGE_PANELS, MAP_NAMES, draw_panels, view_map
from vit_inspect.ui.relevance import TOGGLE_LABEL, computed, with_relevance
from vit_inspect.ui.request_guard import RequestGuard, body_limit
from vit_inspect.ui.untrusted import client_file, client_files, finite_float, finite_int, flag, redact_paths, text
from vit_inspect.ui.view import DISCARDS, HEAD_FUSIONS, PATCH, ROLLOUTS, SCALES, View
from vit_inspect.ui.view import READOUT  # noqa: F401  (the query choices, for API callers and tests)
from vit_inspect.zerogpu import gpu_pass

log = logging.getLogger("vit_inspect.app")

ASSETS = Path(__file__).resolve().parent / "assets"
CURATED_MODELS = (
    "deit_tiny_patch16_224",
    "deit_small_patch16_224",
    "deit_base_patch16_224",
    "deit_small_distilled_patch16_224",
    "vit_tiny_patch16_224.augreg_in21k_ft_in1k",
    "vit_small_patch16_224.augreg_in21k_ft_in1k",
    "vit_base_patch16_224.augreg2_in21k_ft_in1k",
    "vit_small_patch16_224.dino",
    "vit_small_patch14_reg4_dinov2.lvd142m",
)
EXAMPLES = (  # (file in assets/, caption with the credit and licence from assets/README.md)
    ("chelsea.png", "Chelsea the cat · Stéfan van der Walt · CC0"),
    ("coffee.png", "Coffee · Rachel Michetti · CC0"),
    ("astronaut.png", "Eileen Collins · NASA · public domain"),
    ("rocket.jpg", "Falcon 9 launch · SpaceX · public domain"),
    ("china.jpg", "China · danielbuechele (Flickr) · CC BY 2.0"),
    ("flower.jpg", "Flower · vultilion (Flickr) · CC BY 2.0"),
)
GEOMETRIES = {"model's centre crop": "crop", "whole image, squashed": "squash", "whole image, aspect kept": "keep"}
MAX_TARGETS_PER_SESSION = 8  # passes kept per image, one per target class
MAX_DATASET_IMAGES = 64  # images per attention-distance average
CLASS_PANELS = ("gradcam", "relevance", "rollout")  # the panels a new class redraws
# A new image's answer carries its maps; these figures (PIL pictures of 3-20 ms for DeiT-Ti; once about 1 s
# of matplotlib, 7x its pass) are drawn by events that follow it, so predictions and maps show as soon as the
# pass is done, and only if the page shows their tab then (else the tab draws its figure when it opens):
# panel -> its tab
LATER_PANELS = {"distance": "Attention distance", "compare": "All maps", "heads": "All heads"}
FIRST_TAB = "Predictions"  # the tab a page opens on
FIRST_PANELS = tuple(name for name in IMAGE_PANELS if name not in LATER_PANELS)
DRAW_CONCURRENCY = 4  # redraws run in parallel; model passes run one at a time (hooks are per model)
CACHE_SECONDS = (3600, 7200)  # Gradio deletes its temporary files every hour once they are 2 hours old


@dataclass(frozen=True)
class AppConfig:
    """How the server runs; set from the command line."""

    model: str = DEFAULT_MODEL  # the model every session starts with
    weights: str | None = None  # its weights file; None: checkpoints/ first, then the hub
    device: str | None = None  # None: CUDA when available, else CPU
    model_file: str | None = None  # operator's hand-written model "FILE.py:FUNCTION" (then `model` is its name)
    cache_size: int = DEFAULT_CACHE_SIZE  # models held in memory at once
    max_upload_mb: float = DEFAULT_MAX_BYTES / 2**20  # largest upload Gradio accepts, MiB
    max_image_pixels: int = DEFAULT_MAX_PIXELS  # larger images are refused before decoding
    max_sessions: int = 100  # sessions whose results stay in memory; the oldest is dropped beyond this
    memory_budget: int = DEFAULT_BUDGET  # bytes of session results plus loaded models; LRU results dropped beyond
    spill_budget: int = DEFAULT_SPILL_BUDGET  # bytes of attention maps spilled to local disk (vit_inspect.spill); 0: none
    session_ttl_s: float = 3600.0  # a session's results are dropped this long after their last update

    @property
    def limits(self) -> ImageLimits:
        return ImageLimits(max_pixels=self.max_image_pixels, max_bytes=int(self.max_upload_mb * 2**20))


@dataclass(frozen=True)
class Session:
    """One user's image and its passes, held in gr.State: never seen by another session."""

    model: CacheKey  # the model the passes ran on
    source: str | bytes  # the upload (a file in Gradio's cache, or its bytes), to rerun for another target
    name: str  # the upload's file name, for the downloads
    slot: Slot  # its results in the server's byte-bounded store: {(target, contrast): ImageAnalysis}, one pass per pair
    target: tuple[int | None, int | None]  # the pass shown now
    distance: plotting.DistanceScatterOnce  # this image's attention-distance scatter, rendered on first use
    labels: tuple[str, ...] = ()  # the model's class names
    model_label: str = ""  # model name and weights, for every caption
    geometry: InputGeometry = InputGeometry()  # how the upload became the input
    relevance: bool = False  # passes also compute LeGrad and AttnLRP (the All maps toggle; off: the gradient floor)
    relevance_for: frozenset = frozenset()  # the (target, contrast) passes whose LeGrad and AttnLRP were computed

    @property
    def results(self) -> dict[tuple[int | None, int | None], ImageAnalysis]:
        """One pass per (target, contrast) pair (target None: a model without a head); ResultDropped if evicted."""
        return self.slot.get()

    @property
    def result(self) -> ImageAnalysis:
        return self.results[self.target]

    def class_text(self, index: int | None) -> str:
        return "" if index is None else class_name(self.labels, index)


def results_nbytes(results: dict[tuple[int | None, int | None], ImageAnalysis]) -> int:
    """Bytes held by a session's results, the attention store they share counted once."""
    stores = {id(r.attention_store): r.attention_store.nbytes() for r in results.values()}
    return sum(r.nbytes() - r.attention_store.nbytes() for r in results.values()) + sum(stores.values())


class Inspector:
    """The event handlers: UI values in, library calls, UI values out. Holds models, never user data."""

    def __init__(self, config: AppConfig, cache: ModelCache):
        self.config = config
        self.cache = cache
        # session results, bounded in bytes together with the loaded models' weights
        self.store = SessionStore(config.memory_budget,
                                  reserved=lambda: sum(module_nbytes(h.model) for h in cache.handles()))
        self.default_key = CacheKey.of(config.model, config.weights, config.device)
        self.run_pass = gpu_pass(analyze_image)  # on a ZeroGPU Space: under spaces.GPU, model on the GPU
        # maps of many-token models on local disk for fast redraws; not from a ZeroGPU worker's pass
        self.spill = (SpillFolder(config.spill_budget)
                      if config.spill_budget > 0 and not getattr(self.run_pass, "on_gpu", False) else None)
        self.run_relevance = gpu_pass(add_relevance)  # LeGrad and AttnLRP on demand, the same way
        self.default_label = model_label(config.model)  # the operator's model as the dropdown shows it
        self.model_tab = ModelTab(self.handle, cache.max_size)  # the Model tab's figures, drawn once per model
        self.order = DrawOrder()  # a panel shows the newest of a session's overlapping draws

    def handle(self, key: CacheKey) -> ViTHandle:
        # Only the operator's own model (from the command line) may be a folder or a Python file on this server.
        own = key == self.default_key
        operator_file = {"model_file": self.config.model_file} if own and self.config.model_file else {}
        bound = {} if own else {"max_model_bytes": self.config.memory_budget}  # a web user's model fits the budget
        return self.cache.get(key, allow_local_dirs=own, **operator_file, **bound)

    def startup(self, progress=gr.Progress()):
        """Page load: the default model (the server loads it in the background; this waits for it with a
        progress bar), or in its place how to get its weights."""
        progress(0, desc=f"Loading the model {self.default_key.name} (first start: a few seconds)")
        try:
            handle = self.handle(self.default_key)
        except VitInspectError as exc:
            log.warning("the default model could not be loaded: %s", exc)
            return (f"⚠️ **The model could not be loaded.** {public_message(exc)}\n\nYou can still use the app: open "
                    "**Change model** below the image, upload a `.safetensors` weights file, type its timm "
                    "architecture name (e.g. `deit_tiny_patch16_224`) and press **Load model**.",
                    gr.update(open=True), *[gr.skip()] * 7)
        return describe(handle), gr.update(), *geometry_updates(handle)

    @shows_errors
    def load_model(self, name: object, weights: object, progress=gr.Progress()):
        """Another model: everything shown for the previous one is cleared (the image is rerun through
        `key.change`). On failure the picker goes back to the model in use (the event's .failure)."""
        name = text(name, "The model name")
        if not name:
            raise InputError("Choose a model from the list or type a timm name or Hugging Face id.")
        upload = client_file(weights, upload_folders(), max_bytes=2**40)  # the file is already on disk
        weights = None if upload is None else upload[0]
        if weights and Path(weights).suffix.lower() != ".safetensors":
            raise InputError("Only .safetensors weights files can be uploaded here.")
        if weights and "/" in name:
            raise InputError("An uploaded weights file goes with a timm architecture name (such as "
                             "'deit_tiny_patch16_224'), not with a Hugging Face id.")
        if name == self.default_label and weights is None:
            key = self.default_key  # the operator's model, which the page names by its base name only
        elif names_python_file(name):
            raise InputError("Models defined in Python files cannot be loaded from this page; whoever runs the "
                             "server chooses one when starting it (python app.py --model-file FILE.py:FUNCTION).")
        else:
            key = CacheKey.of(name, weights, self.config.device)
        progress(0, desc=f"Loading {name}")
        handle = self.handle(key)
        return (key, describe(handle), gr.update(open=False), *geometry_updates(handle),
                *[None] * 3, None, "", None, None)

    @staticmethod
    def picker_name(key: CacheKey) -> str:
        """The model in use, put back in the picker after a failed load."""
        return key.name

    def _pass(self, handle: ViTHandle, source, geometry: InputGeometry, target=None, contrast=None,
              relevance: bool = False) -> ImageAnalysis:
        return self.run_pass(handle, source, target=target, contrast=contrast, limits=self.config.limits,
                             geometry=geometry, relevance=relevance, spill=self.spill)

    def with_relevance(self, session: Session, progress=None) -> Session:
        """The session with LeGrad and AttnLRP for the pass it shows (one more forward, at most)."""
        if progress is not None and not computed(session):
            progress(0.2, desc="Adding AttnLRP and LeGrad (one more forward and backward pass)")
        return with_relevance(session, self.handle(session.model), self.run_relevance, self.config.limits,
                              results_nbytes)

    @shows_errors
    def set_relevance(self, session: Session | None, wanted: object, progress=gr.Progress(), **controls):
        """The All maps toggle: ticked, LeGrad and AttnLRP are added to the pass shown and computed by the
        session's later passes; unticked, later passes leave them out (maps already computed stay)."""
        wanted = flag(wanted, "The AttnLRP and LeGrad choice")
        if session is None:
            return gr.skip(), gr.skip()
        view = View.from_controls(session.result, **controls)
        session = replace(session, relevance=wanted)
        if wanted:
            session = self.with_relevance(session, progress)
        return session, draw_panels(("compare",), session, view)[0]

    @staticmethod
    def geometry_of(mode: object, size: object) -> InputGeometry:
        """The input geometry from the raw radio and number values."""
        side = finite_int(size, "The shorter side", 16, 1024, default=224, clamp=False)
        return InputGeometry(GEOMETRIES[mode] if isinstance(mode, str) and mode in GEOMETRIES else "crop", side)

    @shows_errors
    def analyze(self, image: dict | None, key: CacheKey, geometry_mode: object, shorter_side: object,
                progress=gr.Progress(), request: gr.Request = None, **controls):
        relevance = flag(controls.pop("relevance", False), "The AttnLRP and LeGrad choice")
        upload = upload_source(image, self.config.limits.max_bytes)
        if upload is None:
            return None, None, None, gr.update(choices=[], value=None), *[None] * len(IMAGE_PANELS), None, None
        source, name = upload
        geometry = self.geometry_of(geometry_mode, shorter_side)
        view_controls = controls | dict(first_layer=0, last_layer=10**6)  # an inverted range must not stop a pass
        progress(0.1, desc="Loading the model")
        handle = self.handle(key)
        progress(0.4, desc="Running the model (one forward and one backward pass"
                           + (", plus AttnLRP and LeGrad)" if relevance else ")"))
        result = self._pass(handle, source, geometry, relevance=relevance)
        progress(0.8, desc="Drawing")
        scatter = plotting.DistanceScatterOnce(result.mean_distance, image_width=result.layout.input_size[1],
                                               title=f"{model_label(handle.name)} · this image")
        slot = self.store.put({(result.target, None): result}, result.nbytes())
        session = Session(model=key, source=source, name=name, slot=slot, target=(result.target, None),
                          distance=scatter, labels=handle.labels, model_label=shown_model(handle), geometry=geometry,
                          relevance=relevance,
                          relevance_for=frozenset({(result.target, None)} if relevance else ()))
        target = (gr.update(choices=class_choices(handle.labels, result.probs, []), value=str(result.target),
                            interactive=True) if result.probs.size else gr.update(choices=[], value=None))
        try:
            view = View.from_controls(result, **controls)
        except InputError:  # an inverted rollout range must not stop a new image; the rollout tab refuses it
            view = View.from_controls(result, **view_controls)
        drawn = dict(zip(FIRST_PANELS, draw_panels(FIRST_PANELS, session, view)))
        panels = [drawn.get(name) for name in IMAGE_PANELS]  # LATER_PANELS: cleared now, drawn by the next events
        self.order.supersede(session_hash(request), IMAGE_PANELS)  # redraws in flight drew the previous image
        seen = plotting.outline_region(result.preview, result.seen_box, result.source_size)
        return session, prediction_labels(handle, result), result.rgb, target, *panels, seen, map_geometry(result)

    def redraw(self, name: str):
        """A handler redrawing one panel from the session's cached pass, never the model (`_draw_newest`)."""
        @shows_errors
        def handler(session: Session | None, request: gr.Request = None, **controls):
            if session is None:
                return gr.skip()
            picture, newest = self._draw_newest(request, name, session, View.from_controls(session.result, **controls))
            return picture if newest else gr.skip()
        return handler

    def redraw_if_shown(self, name: str, tab: str | None):
        """`redraw(name)` when the page shows ``tab`` (the browser's own record of its open tab, a client's
        word: it only decides whether to draw now); otherwise nothing, and the tab draws when it opens.
        ``tab`` None: a panel no tab opening redraws (the attention map), drawn whatever is shown."""
        draw = self.redraw(name)

        def handler(session: Session | None, shown: object, request: gr.Request = None, **controls):
            return draw(session, request=request, **controls) if tab is None or shown == tab else gr.skip()
        return handler

    def _draw_newest(self, request, name: str, session: Session, view: View) -> tuple:
        """(one panel drawn for `view`, whether no later draw of that panel for this web session began meanwhile)."""
        ticket = self.order.begin(session_hash(request), name)
        picture = draw_panels((name,), session, view)[0]
        return picture, self.order.is_latest(session_hash(request), name, ticket)

    @shows_errors
    def pick_patch(self, evt: gr.SelectData, session: Session | None, request: gr.Request = None, **controls):
        """A click on the attention map (x, y in the crop's pixels) makes that patch the query; a click
        on the colour bar or the caption beside the map does nothing."""
        if session is None or evt.index is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        if not isinstance(evt.index, (list, tuple)) or len(evt.index) < 2:
            raise InputError("A click gives the (x, y) pixel it landed on; this one gave none.")
        height, width = session.result.layout.input_size
        x = finite_float(evt.index[0], "The clicked x", -1e6, 1e6)
        y = finite_float(evt.index[1], "The clicked y", -1e6, 1e6)
        if not (0 <= x < width and 0 <= y < height):  # the colour bar or the caption beside the map
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        row, col = session.result.layout.patch_at(y, x)
        view = View.from_controls(session.result, **(controls | dict(query=PATCH, row=row, col=col)))
        picture, newest = self._draw_newest(request, "attention", session, view)
        return (row, col, PATCH, picture) if newest else (gr.skip(), gr.skip(), gr.skip(), gr.skip())

    @shows_errors
    def type_patch(self, session: Session | None, request: gr.Request = None, **controls):
        """Typing a patch row or column makes that patch the query (the browser ticks it at once)."""
        if session is None:
            return PATCH, gr.skip()
        view = View.from_controls(session.result, **(controls | dict(query=PATCH)))
        picture, newest = self._draw_newest(request, "attention", session, view)
        return PATCH, picture if newest else gr.skip()

    def _switch(self, session: Session, target: int, contrast: int | None, progress) -> Session:
        """The session showing (target, contrast): one new pass, or none if this pair was seen before."""
        num_classes = session.result.probs.size
        if not num_classes:
            raise InputError("This model has no classification head, so there is no class to explain.")
        for index in (target, contrast):
            if index is not None and not 0 <= index < num_classes:
                raise InputError(f"Class {index} does not exist: this model has classes 0 to {num_classes - 1}.")
        if contrast == target:
            raise InputError("The class to compare with is the class itself; choose another one.")
        results = dict(session.results)
        done = set(session.relevance_for)  # passes whose LeGrad and AttnLRP were computed
        if (target, contrast) not in results:
            progress(0.3, desc=f"Gradients for class {target}" + ("" if contrast is None else f" versus {contrast}"))
            fresh = self._pass(self.handle(session.model), session.source, session.geometry, target, contrast,
                               relevance=session.relevance)
            # same image, same model: the attention is the same, so every target shares one copy
            results[(target, contrast)] = replace(fresh, attention_store=session.result.attention_store)
            if session.relevance:
                done.add((target, contrast))
            while len(results) > MAX_TARGETS_PER_SESSION:
                results.pop(next(iter(results)))
        session.slot.set(results, results_nbytes(results))
        session = replace(session, target=(target, contrast), relevance_for=frozenset(done & results.keys()))
        return self.with_relevance(session, progress) if session.relevance else session

    def set_target(self, session: Session | None, target: object, versus: object, progress=gr.Progress(),
                   request: gr.Request = None, **controls):
        """Gradient maps for the class picked in the list (and the class typed under "versus"). A refused
        choice is a warning and leaves every panel as it was."""
        try:
            target = text(target, "The class to explain", max_chars=40)
            if session is None or not target:
                return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            if not target.isdigit():
                raise InputError(f"{target!r} is not a class; pick one from the list or type a name or an index "
                                 "in the search box.")
            contrast = find_class(session.labels, session.result.probs, text(versus, "The versus class", 100),
                                  "comparison")
            return self._show_class(session, int(target), contrast, [int(target)], progress, controls, request)
        except VitInspectError as exc:
            gr.Warning(public_message(exc))
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()

    def search_class(self, session: Session | None, wanted: object, versus: object, progress=gr.Progress(),
                     request: gr.Request = None, **controls):
        """The search box: "1" is class 1, "beagle" finds #162; the best match becomes the target and the
        list shows the top 5, then the other matches. A search that finds nothing is a warning and leaves
        every panel as it was."""
        try:
            wanted = text(wanted, "The class search", 100)
            if session is None or not wanted:
                return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            index = find_class(session.labels, session.result.probs, wanted, "class to explain")
            contrast = find_class(session.labels, session.result.probs, text(versus, "The versus class", 100),
                                  "comparison")
            found = search_classes(session.labels, wanted, session.result.probs, limit=CLASS_CHOICES)
            return self._show_class(session, index, contrast, found, progress, controls, request)
        except VitInspectError as exc:
            gr.Warning(public_message(exc))
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()

    def _show_class(self, session: Session, index: int, contrast: int | None, found: list[int], progress, controls,
                    request=None):
        session = self._switch(session, index, contrast, progress)
        view = View.from_controls(session.result, **controls)
        choices = class_choices(session.labels, session.result.probs, found)
        panels = draw_panels(CLASS_PANELS, session, view)
        self.order.supersede(session_hash(request), CLASS_PANELS)  # redraws in flight drew the previous class
        return session, gr.update(choices=choices, value=str(index)), *panels

    @shows_errors
    def dataset_distance(self, files: object, key: CacheKey, progress=gr.Progress()):
        uploads = client_files(files, upload_folders(), self.config.limits.max_bytes, MAX_DATASET_IMAGES)
        if not uploads:
            raise InputError("Upload a few images first (they are averaged; the more, the steadier).")
        if any(isinstance(source, bytes) for source, _ in uploads):
            raise InputError("Upload the images to average as files.")
        files = [source for source, _ in uploads]
        progress(0, desc="Loading the model")
        handle = self.handle(key)
        stats = dataset_attention_distance(
            handle, files, limits=self.config.limits, progress=lambda done, total: progress((done, total), unit="images"))
        image = plotting.distance_scatter(  # PIL: 2 ms, against 150 ms for a matplotlib figure (bench_upload 6l)
            stats.distances, image_width=handle.input_size[1],
            title=f"{shown_model(handle)} · mean over {stats.num_images} images", selectable=False).background
        note = f"Averaged over {stats.num_images} image(s)."
        if stats.skipped:
            note += " Skipped: " + redact_paths("; ".join(f"{name}: {reason}" for name, reason in stats.skipped))
        return image, note

    @shows_errors
    def downloads(self, session: Session | None, **controls) -> list[str]:
        """The current image's figures as PNG (each captioned with its model, class and settings), its
        numbers as JSON (the CLI's record plus the settings) and .npz (with the same settings)."""
        if session is None:
            raise InputError("Analyse an image first; the downloads are its figures and numbers.")
        result = session.result
        view = View.from_controls(result, **controls)
        handle = self.handle(session.model)
        folder = download_folder()
        stem = Path(session.name).stem or "image"
        paths = []
        for name, image in zip(IMAGE_PANELS, draw_panels(IMAGE_PANELS, session, view)):
            if image is not None:
                paths.append(folder / f"{stem}_{name}.png")
                Image.fromarray(image).save(paths[-1])
        settings = {"model": model_label(handle.name), "weights": weights_label(handle),
                    "input_geometry": session.geometry.describe(result.layout.input_size),
                    "class": class_record(handle, result.target), "contrast": class_record(handle, result.contrast),
                    "relevance": computed(session)}  # False: LeGrad and AttnLRP were not computed (the toggle)
        settings |= view.record()
        record = analysis_record(handle, result, session.name) | {"model": settings["model"], "settings": settings}
        paths.append(folder / f"{stem}.json")
        paths[-1].write_text(json.dumps(record, indent=1))
        arrays = result.attention_arrays() | {"mean_distance": result.mean_distance, "probs": result.probs,
                  "rgb": result.rgb, "gradcam": result.gradcam, "chefer": result.chefer, "legrad": result.legrad,
                  "attnlrp": result.attnlrp, "settings_json": np.array(json.dumps(settings))}
        arrays |= {f"{name}_map": view_map(result, view, name) for name in MAP_NAMES}
        paths.append(folder / f"{stem}.npz")
        np.savez_compressed(paths[-1], **{k: v for k, v in arrays.items() if v is not None})
        return [str(p) for p in paths]

def build_demo(config: AppConfig = AppConfig(), cache: ModelCache | None = None) -> gr.Blocks:
    """The app's Blocks. Loads nothing: the first page load or request loads the model through the cache."""
    app = Inspector(config, cache if cache is not None else ModelCache(config.cache_size))
    models = CURATED_MODELS if config.model in CURATED_MODELS else (app.default_label, *CURATED_MODELS)
    map_out = dict(interactive=False, format="png", buttons=["download", "fullscreen"])
    figure_out = dict(interactive=False, format="png", show_label=False, buttons=["download", "fullscreen"])
    panel: dict[str, gr.Image] = {}
    with gr.Blocks(title="vit_inspect", delete_cache=CACHE_SECONDS) as demo:
        key = gr.State(app.default_key)
        session = gr.State(None, time_to_live=config.session_ttl_s)
        gr.Markdown("# vit_inspect\nLook inside a Vision Transformer: what it predicts, where it attends and "
                    "how it sees. Upload an image or pick an example; every slider and click redraws instantly "
                    "from one pass of the model. Every map has a colour bar with its unit; **Colour scale** "
                    "chooses each map's own range or one shared range.")
        status = gr.Markdown("⏳ Loading the model…", elem_id="status")
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                image = gr.Image(label="Image (upload, drop, paste or webcam)", type="filepath", height=320,
                                 sources=["upload", "clipboard", "webcam"], elem_id="input-image")
                geometry_mode = gr.Radio(list(GEOMETRIES), value="model's centre crop", label="What the model sees",
                                         elem_id="geometry", info="The model's own centre crop, the whole image "
                                         "squashed to its input size, or the whole image with its aspect ratio "
                                         "kept (a non-square patch grid; position embeddings interpolated).")
                shorter_side = gr.Number(224, label="Shorter side for 'aspect kept' (pixels)", precision=0,
                                         minimum=16, maximum=1024, elem_id="shorter-side")
                gr.Examples([[str(ASSETS / name)] for name, _ in EXAMPLES], inputs=image, label="Examples",
                            examples_per_page=len(EXAMPLES))
                gr.Markdown("Examples, left to right: " + "; ".join(c for _, c in EXAMPLES) + ".")
                with gr.Accordion("Change model", open=False) as model_box:
                    model_name = gr.Dropdown(list(models), value=app.default_label, label="Model",
                                             allow_custom_value=True, elem_id="model-name",
                                             info="Or type any timm ViT name, or a Hugging Face id such as "
                                                  "google/vit-base-patch16-224.")
                    weights = gr.File(label="Own weights (.safetensors, for a timm name; leave empty otherwise)",
                                      file_types=[".safetensors"], type="filepath", elem_id="weights-file")
                    load_button = gr.Button("Load model", variant="primary", elem_id="load-model")
            with gr.Column(scale=2):
                scale = gr.Radio(list(SCALES), value="each map its own range", label="Colour scale", elem_id="scale",
                                 info="Shared: one range over every layer and head (attention) or block "
                                      "(Grad-CAM). Absolute: attention and rollout weights on 0 to 1.")
                shown_tab = gr.Textbox(FIRST_TAB, visible=False, elem_id="shown-tab")  # the tab the page shows
                with gr.Tabs() as tabs:
                    with gr.Tab("Predictions"):
                        with gr.Row():
                            predictions = gr.Label(num_top_classes=5, label="Top-5 classes", elem_id="predictions")
                            crop = OutputImage(label="What the model sees (its input)", elem_id="crop", **map_out)
                        seen = OutputImage(label="Your upload: the outlined region is what the model saw",
                                        elem_id="seen-region", height=340, **map_out)
                    with gr.Tab("Attention"):
                        attention = attention_tab_layout(map_out)
                        panel["attention"] = attention.panel
                        layer, head, mean_heads, query, row, col = (attention.layer, attention.head, attention.mean_heads,
                                                                    attention.query, attention.row, attention.col)
                    with gr.Tab("All heads") as heads_tab:
                        gr.Markdown("Every head of the layer chosen under **Attention**, from the same query, on "
                                    "one colour scale (DINO, Caron et al. 2021, Fig. 3). Each title gives the share "
                                    "of the head's attention that goes to the prefix tokens, which the maps leave out.")
                        with gr.Row():
                            threshold_on = gr.Checkbox(False, label="Threshold mask", elem_id="threshold-on",
                                                       info="Keep bright only the smallest set of patches holding "
                                                            "the chosen share of each head's attention.")
                            threshold = gr.Slider(10, 100, value=60, step=5, label="Attention mass kept (%)",
                                                  elem_id="threshold")
                        panel["heads"] = OutputImage(label="All heads", elem_id="heads-grid", **figure_out)
                    with gr.Tab("Heads") as heads_view:
                        heads = HeadsTab(app, tuple(ASSETS / name for name, _ in EXAMPLES), upload_folders, View.from_controls)
                    with gr.Tab("Rollout"):
                        with gr.Row():
                            panel["rollout"] = OutputImage(label="Rollout", elem_id="rollout-map", **map_out)
                            with gr.Column():
                                rollout_method = gr.Radio(list(ROLLOUTS), value=list(ROLLOUTS)[0], label="Method",
                                                          elem_id="rollout-method",
                                                          info="Gradient rollout weighs each layer's attention by "
                                                               "its gradient for the class (Grad-CAM tab's class).")
                                head_fusion = gr.Radio(list(HEAD_FUSIONS), value="mean", label="Head fusion",
                                                       info="Attention rollout only; gradient rollout averages.")
                                discard_ratio = gr.Slider(0.0, 0.95, value=0.0, step=0.05, label="Discard ratio",
                                                          info="Fraction of the lowest attention dropped before "
                                                               "rolling out.", elem_id="discard-slider")
                                discard = gr.Radio(list(DISCARDS), value=list(DISCARDS)[0], label="Discard where",
                                                   elem_id="discard-where")
                                first_layer = gr.Slider(0, 11, value=0, step=1, label="From layer",
                                                        elem_id="first-layer")
                                last_layer = gr.Slider(0, 11, value=11, step=1, label="To layer (included)",
                                                       elem_id="last-layer")
                    with gr.Tab("Grad-CAM"):
                        with gr.Row():
                            class_search = gr.Textbox(label="Find a class: name or index, then Enter",
                                                      placeholder="e.g. 1 (goldfish) or beagle", elem_id="class-search",
                                                      max_lines=1, scale=2)
                            target = gr.Dropdown([], label="Class to explain", scale=2, elem_id="target",
                                                 info="The top 5 first, then what the search found.")
                            versus = gr.Textbox(label="Versus class (optional): name or index, then Enter",
                                                placeholder="e.g. tabby", elem_id="versus", max_lines=1, scale=2,
                                                info="Gradients of logit A − logit B: why A and not B?")
                            gradcam_layer = gr.Slider(0, 11, value=11, step=1, label="Grad-CAM block", scale=1)
                        with gr.Row():
                            panel["gradcam"] = OutputImage(label="Grad-CAM", elem_id="gradcam-map", **map_out)
                            panel["relevance"] = OutputImage(label="Gradient-weighted attention (Chefer et al. 2021)",
                                                          elem_id="relevance-map", **map_out)
                    with gr.Tab("All maps") as compare_tab:
                        gr.Markdown("Every map on the same input, each with the options set in its own tab: "
                                    "layer, head and query under **Attention**, method and layers under **Rollout**, "
                                    "class and block under **Grad-CAM**.")
                        relevance_toggle = gr.Checkbox(False, label=TOGGLE_LABEL, elem_id="relevance-toggle",
                                                       info="LeGrad and AttnLRP for this image and class, and for "
                                                            "later passes while ticked. Off, a pass is one forward "
                                                            "and one backward.")
                        panel["compare"] = OutputImage(label="All maps", elem_id="compare-maps", **figure_out)
                    with gr.Tab("Faithfulness"):
                        faithfulness = FaithfulnessTab()
                    with gr.Tab("Attention distance") as distance_tab:
                        gr.Markdown("Mean attention distance per head (ViT paper, Fig. 7 right): how far, in pixels, "
                                    "each head looks. The red dot is the layer and head chosen under **Attention**.")
                        with gr.Row():
                            panel["distance"] = OutputImage(label="This image", elem_id="distance-plot", **figure_out)
                            dataset_plot = OutputImage(label="Averaged over your images", elem_id="dataset-plot",
                                                    **figure_out)
                        with gr.Row():
                            dataset_files = gr.File(label=f"Images to average (up to {MAX_DATASET_IMAGES})",
                                                    file_count="multiple", file_types=["image"], type="filepath",
                                                    height=120, scale=3, elem_id="dataset-files")
                            dataset_button = gr.Button("Average over these images", scale=1)
                        dataset_note = gr.Markdown()
                    with gr.Tab("Model") as model_tab:
                        model_view = model_tab_layout(figure_out)
                    with gr.Tab("Downloads"):
                        gr.Markdown("The current image's figures as PNG, its numbers as JSON (the command line's "
                                    "record plus every setting: model, weights, input geometry, layer, head, query, "
                                    "rollout options, class) and NumPy `.npz` (attention, Grad-CAM, relevance, mean "
                                    "distance, the maps as shown, and the same settings as `settings_json`).")
                        download_button = gr.Button("Prepare downloads", variant="primary", elem_id="downloads-button")
                        download_files = gr.File(label="Files", file_count="multiple", interactive=False,
                                                 elem_id="download-files")
                    compare_ui.compare_tab(app, image, key, models, model_pass=dict(concurrency_id="model_pass", concurrency_limit=1),
                                           upload_source=upload_source, shows_errors=shows_errors)

        controls = dict(layer=layer, head=head, mean_heads=mean_heads, query=query, row=row, col=col,
                        head_fusion=head_fusion, discard_ratio=discard_ratio, first_layer=first_layer,
                        last_layer=last_layer, gradcam_layer=gradcam_layer, scale=scale, rollout_method=rollout_method,
                        discard=discard, threshold_on=threshold_on, threshold=threshold)
        geometry = [layer, head, first_layer, last_layer, gradcam_layer, row, col]
        model_outputs = [model_view.pca, model_view.similarity, model_view.similarity_other]
        cleared = [dataset_plot, dataset_note, download_files, model_view.files]  # shown for the previous model
        model_pass = dict(concurrency_id="model_pass", concurrency_limit=1)
        class_outputs = [session, target, *[panel[n] for n in CLASS_PANELS]]
        # Handlers get the client's raw values and check them themselves (vit_inspect.ui.untrusted), so
        # that a NaN, a string or a forged file reference gets a sentence rather than Gradio's bare "Error".
        raw = dict(preprocess=False)

        clicks.install(demo)  # the page knows where a click on a map or heatmap landed before the server answers
        gr.on([demo.load], app.startup, outputs=[status, model_box, *geometry], api_name="startup")
        gr.on([load_button.click, model_name.select], app.load_model, inputs=[model_name, weights],
              outputs=[key, status, model_box, *geometry, *model_outputs, *cleared], api_name="load_model", **raw,
              ).failure(app.picker_name, inputs=[key], outputs=[model_name], api_name="restore_model_name")
        analyzed = gr.on([image.change, key.change, geometry_mode.input, shorter_side.submit], app.analyze,
              inputs=[image, key, geometry_mode, shorter_side], inputs_kwargs=controls | dict(relevance=relevance_toggle),
              outputs=[session, predictions, crop, target, *[panel[n] for n in IMAGE_PANELS], seen, attention.geometry],
              api_name="analyze", **raw, **model_pass)
        for tab in tabs.children:  # the page records which tab it shows, in the page (no server call)
            gr.on([tab.select], None, outputs=[shown_tab], js=f"() => {json.dumps(tab.label)}", queue=False)
        for name, tab in LATER_PANELS.items():  # the figures of a new image, once its maps are shown, if in view
            analyzed.success(app.redraw_if_shown(name, tab), inputs=[session, shown_tab], inputs_kwargs=controls,
                             outputs=panel[name], api_name=f"{name}_of_new_image", show_progress="hidden",
                             concurrency_limit=DRAW_CONCURRENCY, **raw)
        # Each panel redraws when a control it shows changes; panels showing other tabs' controls redraw
        # when their tab opens.
        scale_change = [scale.input]
        redraws = {"attention": [layer.input, head.input, mean_heads.input, query.input, *scale_change],
                   "rollout": [head_fusion.input, discard_ratio.input, first_layer.input, last_layer.input,
                               rollout_method.input, discard.input, *scale_change],
                   "gradcam": [gradcam_layer.input, *scale_change],
                   "heads": [heads_tab.select, threshold_on.input, threshold.release, *scale_change],
                   "distance": [distance_tab.select],
                   "compare": [compare_tab.select]}
        for name, triggers in redraws.items():
            gr.on(triggers, app.redraw(name), inputs=[session], inputs_kwargs=controls, outputs=panel[name],
                  api_name=name, trigger_mode="always_last", show_progress="hidden",
                  concurrency_limit=DRAW_CONCURRENCY, **raw)
        wire_attention_tab(attention, session, controls, app.pick_patch, app.type_patch, DRAW_CONCURRENCY, raw)
        retargeted = gr.on([target.input, versus.submit], app.set_target, inputs=[session, target, versus], inputs_kwargs=controls,
              outputs=class_outputs, api_name="set_target", **raw, **model_pass)
        searched = gr.on([class_search.submit], app.search_class, inputs=[session, class_search, versus],
              inputs_kwargs=controls, outputs=class_outputs, api_name="search_class", **raw, **model_pass)
        gr.on([relevance_toggle.input], app.set_relevance, inputs=[session, relevance_toggle], inputs_kwargs=controls,
              outputs=[session, panel["compare"]], api_name="relevance", **raw, **model_pass)
        faithfulness.wire(app.handle, session, controls, relevance=app.with_relevance, **raw, **model_pass)
        heads.wire(session, controls, heads_view, [analyzed, retargeted, searched], shows_errors, model_pass,
                   follow=[(name, app.redraw_if_shown(name, LATER_PANELS.get(name)), panel[name])
                           for name in ("attention", "distance")],
                   shown_tab=shown_tab, **raw)
        gr.on([dataset_button.click], app.dataset_distance, inputs=[dataset_files, key],
              outputs=[dataset_plot, dataset_note], api_name="dataset_distance", **raw, **model_pass)
        wire_model_tab(app.model_tab, model_view, model_tab, key, raw)
        gr.on([download_button.click], app.downloads, inputs=[session], inputs_kwargs=controls,
              outputs=[download_files], api_name="downloads", **raw)
    return demo


def launch_limits(config: AppConfig) -> dict:
    """The `launch()` arguments that bound what one server holds: upload size, sessions in memory, and
    `RequestGuard` in front of every route (no file fetched from a URL, no request body or text beyond its
    bounds)."""
    guard = Middleware(RequestGuard, max_body=body_limit(config.max_upload_mb))
    return dict(max_file_size=f"{config.max_upload_mb:g}mb", state_session_capacity=config.max_sessions,
                app_kwargs={"middleware": [guard]})


def with_launch_limits(blocks: gr.Blocks, config: AppConfig) -> gr.Blocks:
    """`blocks.launch(...)` with `launch_limits(config)` applied: the caller's own values win, and its own
    middleware runs inside `RequestGuard`. For code that imports `app.demo` and launches it itself."""
    launch = blocks.launch

    def launch_with_limits(*args, **kwargs):
        limits = launch_limits(config)
        app_kwargs = dict(kwargs.pop("app_kwargs", None) or {})
        app_kwargs["middleware"] = limits.pop("app_kwargs")["middleware"] + list(app_kwargs.get("middleware") or [])
        return launch(*args, **(limits | kwargs), app_kwargs=app_kwargs)

    blocks.launch = launch_with_limits
    return blocks


if __name__ != "__main__":  # for importers (gradio's reload mode, tests); `python app.py` builds from its flags
    demo = with_launch_limits(build_demo(), AppConfig())


def parse_args(argv: list[str] | None = None) -> tuple[AppConfig, argparse.Namespace]:
    """Command-line flags -> the app's config and the server options (host, port, share)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"timm name, HF id or folder (default {DEFAULT_MODEL})")
    parser.add_argument("--weights", help="weights file for --model (.safetensors preferred)")
    parser.add_argument("--model-file", metavar="FILE.py:FUNCTION",
                        help="serve a hand-written ViT: imports FILE.py (runs its code) and calls FUNCTION() for "
                             "(model, ModuleSpec); replaces --model. Web users can never name a Python file.")
    parser.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available)")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="address to serve on (default 127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--share", action="store_true", help="also serve through a temporary gradio.live link")
    parser.add_argument("--cache-size", type=int, default=DEFAULT_CACHE_SIZE, help="models kept in memory at once")
    parser.add_argument("--max-upload-mb", type=float, default=AppConfig.max_upload_mb,
                        help=f"largest file an upload may be, MiB (default {AppConfig.max_upload_mb:g})")
    parser.add_argument("--max-image-pixels", type=int, default=AppConfig.max_image_pixels,
                        help=f"largest image, width x height, refused before decoding (default {AppConfig.max_image_pixels:,})")
    parser.add_argument("--memory-budget", type=float, default=AppConfig.memory_budget / 2 ** 30,
                        help="GiB of session results plus loaded models; the least recently used results are "
                             f"dropped beyond this (default {AppConfig.memory_budget / 2 ** 30:g})")
    parser.add_argument("--spill-budget", type=float, default=AppConfig.spill_budget / 2 ** 30,
                        help="GiB of local disk for the attention maps of models whose maps are dear to rebuild "
                             "(heads x N >= 0.015 D^2: DeiT-Ti at 224, DINOv2 at 518 px), read by redraws instead of "
                             "rebuilt; the least recently read "
                             f"are dropped beyond this; 0 turns it off (default {AppConfig.spill_budget / 2 ** 30:g})")
    parser.add_argument("--max-sessions", type=int, default=AppConfig.max_sessions,
                        help=f"sessions kept in memory; the oldest is dropped beyond this (default {AppConfig.max_sessions})")
    args = parser.parse_args(argv)
    try:
        model = model_file_name(args.model_file) if args.model_file else args.model
    except VitInspectError as exc:
        parser.error(str(exc))
    for option, value in (("--max-upload-mb", args.max_upload_mb), ("--max-image-pixels", args.max_image_pixels),
                          ("--memory-budget", args.memory_budget), ("--max-sessions", args.max_sessions),
                          ("--cache-size", args.cache_size)):
        if not (math.isfinite(value) and value > 0):  # a bound must bound: NaN, inf, 0 and below are refused
            parser.error(f"{option} must be a positive finite number, got {value!r}.")
    if not math.isfinite(args.spill_budget):  # at most 0 turns spilling off; NaN or inf is a typing mistake
        parser.error(f"--spill-budget must be a finite number of GiB (0 turns it off), got {args.spill_budget!r}.")
    config = AppConfig(model=model, weights=args.weights, device=args.device, model_file=args.model_file,
                       cache_size=args.cache_size,
                       max_upload_mb=args.max_upload_mb, max_image_pixels=args.max_image_pixels,
                       max_sessions=args.max_sessions, memory_budget=int(args.memory_budget * 2 ** 30),
                       spill_budget=int(max(0.0, args.spill_budget) * 2 ** 30))
    return config, args


def preload(cache: ModelCache, config: AppConfig) -> None:
    """Load the default model in the background while the server starts; a page opened meanwhile waits
    for it with a progress bar, and a failure is explained on the page (and printed here)."""
    try:
        Inspector(config, cache).handle(CacheKey.of(config.model, config.weights, config.device))
    except (VitInspectError, ValueError) as exc:
        print(f"warning: {exc}")


def stop_like_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM (`docker stop`, a Space restarting, systemd, `kill`) stops the server as Ctrl-C does:
    Gradio closes it and the process exits normally, so its `atexit` hooks remove the private upload
    folder and the spill folders. Python's default for SIGTERM ends the process at once, without them."""
    raise KeyboardInterrupt


def main() -> None:
    config, args = parse_args()
    signal.signal(signal.SIGTERM, stop_like_ctrl_c)
    own_upload_folder()
    cache = ModelCache(config.cache_size)
    threading.Thread(target=preload, args=(cache, config), daemon=True).start()  # the port opens at once
    try:
        build_demo(config, cache).launch(server_name=args.host, server_port=args.port, share=args.share,
                                         **launch_limits(config))
    except KeyboardInterrupt:  # before the server ran (Gradio's own wait handles it once it runs)
        pass


if __name__ == "__main__":
    main()
