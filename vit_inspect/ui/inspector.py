"""The page-wide event handlers: model loading, the image pass and what is drawn from it (redraws, class
switching, downloads); a tab's own handlers live in its module (`ui.tabs`). UI values in, library calls, UI
values out. A session's results live in the byte-bounded store; models in the shared cache."""
from __future__ import annotations

import hashlib
import json
import logging
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr
import numpy as np
from PIL import Image

from vit_inspect.analysis import class_name, search_classes
from vit_inspect.core.errors import InputError, VitInspectError
from vit_inspect.core.geometry import InputGeometry
from vit_inspect.core.handle import ViTHandle
from vit_inspect.passes.pipeline import add_relevance, analyze_image
from vit_inspect.core.open_clip_models import is_open_clip_name
from vit_inspect.passes.records import analysis_record, rounded, target_record
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.passes.spill import SpillFolder
from vit_inspect.plots import distance as distance_plots
from vit_inspect.plots import maps as map_plots
from vit_inspect.ui.classes import CLASS_CHOICES, class_choices, find_class
from vit_inspect.ui.common import (REFUSED, describe, download_folder, geometry_updates, names_python_file,
                                   prediction_labels, public_message, public_name, shown_model, shows_errors,
                                   upload_folders, upload_source, weights_label)
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.model_cache import CacheKey, ModelCache
from vit_inspect.ui.ordering import DrawOrder, session_hash
from vit_inspect.ui.panels import (FIRST_VIEW, IMAGE_PANELS, MAP_NAMES, draw_panels, main_scale, map_geometry,
                                  view_map)
from vit_inspect.ui.relevance import added_maps, computed, with_relevance
from vit_inspect.ui.session_store import ResultDropped, SessionStore, Slot, module_nbytes
from vit_inspect.ui.stale import Basis
from vit_inspect.ui.untrusted import client_file, finite_float, finite_int, flag, plain_markdown, prompt_text, text
from vit_inspect.ui.view import PATCH, READOUT, View, download_options
from vit_inspect.ui.zerogpu import gpu_pass

log = logging.getLogger("vit_inspect.app")

GEOMETRIES = {"model's centre crop": "crop", "whole image, squashed": "squash", "whole image, aspect kept": "keep"}
MAX_TARGETS_PER_SESSION = 8  # passes kept per image, one per target class
CLASS_PANELS = ("first_chefer", "gradcam", "chefer", "rollout", "compare")  # the panels a new class redraws
CLASS_SKIP = (gr.skip(),) * (2 + len(CLASS_PANELS))  # no class to switch to: the session, the list and its panels

# A new image's answer carries the first view's maps (`panels.FIRST_VIEW`), so the first view shows as soon as
# the pass is done; every other panel it clears. The event that follows it draws those (PIL pictures of 3-20 ms
# for DeiT-Ti) only if the page shows their tab then, else the tab draws them when it opens: nothing drawn out
# of view competes with the browser fetching the first view. panel -> its tab
FIRST_PANELS = FIRST_VIEW
LATER_PANELS = {"attention": "Attention", "rollout": "Rollout", "gradcam": "Grad-CAM", "chefer": "Grad-CAM",
                "compare": "All maps", "heads": "All heads", "distance": "Attention distance"}
FIRST_TAB = "Overview"  # the tab a page opens on
# `analyze`'s answer when nothing changes, one skip per output: session, top-5, crop, class list, the image panels,
# seen region, map geometry, status line, query, notice
ANALYSIS_KEPT = (gr.skip(),) * (9 + len(IMAGE_PANELS))


@dataclass(frozen=True)
class Session:
    """One user's image and its passes, held in gr.State: never seen by another session."""

    model: CacheKey  # the model the passes ran on
    source: str | bytes  # the upload (a file in Gradio's cache, or its bytes), to rerun for another target
    name: str  # the upload's file name, for the downloads
    slot: Slot  # its results in the server's byte-bounded store: {(target, contrast): ImageAnalysis}, one pass per pair
    target: tuple[int | str | None, int | str | None]  # the pass shown now: class indices, or prompts (text)
    distance: distance_plots.DistanceScatterOnce  # this image's attention-distance scatter, rendered on first use
    labels: tuple[str, ...] = ()  # the model's class names
    model_label: str = ""  # model name and weights, for every caption
    geometry: InputGeometry = InputGeometry()  # how the upload became the input
    relevance: bool = False  # passes also compute LeGrad and AttnLRP (the All maps toggle; off: the gradient floor)
    relevance_for: frozenset = frozenset()  # the (target, contrast) passes whose LeGrad and AttnLRP were computed
    digest: str = ""  # of the input the model saw (upload and geometry): what results computed from it share
    image_words: str = ""  # the upload's name and geometry, for sentences: "chelsea.png (model's centre crop, ...)"
    prompts: bool = False  # the model has a text tower (OpenCLIP): its targets may be prompts, its classes labels

    @property
    def results(self) -> dict[tuple[int | str | None, int | str | None], ImageAnalysis]:
        """One pass per (target, contrast) pair (target None: a model without a head); ResultDropped if evicted."""
        return self.slot.get()

    @property
    def result(self) -> ImageAnalysis:
        return self.results[self.target]

    def class_text(self, index: int | None) -> str:
        return "" if index is None else class_name(self.labels, index)

    def target_text(self, value: int | str | None) -> str:
        """How captions name a target: "class tabby, tabby cat (#281)", a zero-shot "label cat (#0)", or
        "prompt 'a photo of a cat'"; "" for none."""
        if isinstance(value, str):
            return f"prompt {value!r}"
        return "" if value is None else f"{'label' if self.prompts else 'class'} {self.class_text(value)}"

    def target_words(self) -> str:
        """What the gradient maps explain now, "class tabby, tabby cat (#281)" or "prompt 'a photo of a cat'" (and
        "versus ..."); "" for a model without a head."""
        target, contrast = self.target
        return self.target_text(target) + ("" if contrast is None else f" versus {self.target_text(contrast)}")


def input_digest(rgb: np.ndarray) -> str:
    """A digest of the (H, W, 3) input a pass saw: equal for equal inputs, whatever upload gave them."""
    return hashlib.blake2b(np.ascontiguousarray(rgb).tobytes(), digest_size=16).hexdigest()


def results_nbytes(results: dict[tuple[int | None, int | None], ImageAnalysis]) -> int:
    """Bytes held by a session's results, the attention store they share counted once."""
    stores = {id(r.attention_store): r.attention_store.nbytes() for r in results.values()}
    return sum(r.nbytes() - r.attention_store.nbytes() for r in results.values()) + sum(stores.values())


class Inspector:
    """The page-wide event handlers: UI values in, library calls, UI values out. Holds models, never user data."""

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
        self.default_label = public_name(config.model)  # the operator's model as the dropdown shows it
        self.order = DrawOrder()  # a panel shows the newest of a session's overlapping draws

    def handle(self, key: CacheKey) -> ViTHandle:
        # Only the operator's own model (from the command line) may be a folder or a Python file on this server.
        own = key == self.default_key
        operator_file = {"model_file": self.config.model_file} if own and self.config.model_file else {}
        bound = {} if own else {"max_model_bytes": self.config.memory_budget}  # a web user's model fits the budget
        zero_shot = ({"labels": self.config.zero_shot, "templates": self.config.templates}
                     if own and is_open_clip_name(key.name) and self.config.zero_shot else {})
        return self.cache.get(key, allow_local_dirs=own, **operator_file, **bound, **zero_shot)

    def startup(self, progress=gr.Progress()):
        """Page load: the default model (the server loads it in the background; this waits for it with a
        progress bar), or in its place how to get its weights. The first image's pass runs beside it
        (`analyze_first`)."""
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

    def analyze_first(self, image: dict | None, key: CacheKey, geometry_mode: object, shorter_side: object,
                      progress=gr.Progress(), request: gr.Request = None, **controls):
        """Page load: the pass over the image the page opens with (`AppConfig.first_image`, the image's initial
        value), beside `startup` rather than after it, so that the first view answers with no control touched
        one round trip sooner. Nothing when the model cannot be loaded: `startup` says why in the status line."""
        try:
            self.handle(key)
        except VitInspectError:
            return ANALYSIS_KEPT
        return self.analyze(image, key, geometry_mode, shorter_side, progress=progress, request=request, **controls)

    @shows_errors
    def load_model(self, name: object, weights: object, current: CacheKey | None = None, progress=gr.Progress()):
        """Another model: the image is rerun through `key.change`, and what was computed with the previous model
        is cleared by the page's stale-result check (`ui.stale`). On a refusal the picker goes back to the model
        in use, ``current`` (`picker_name`)."""
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
        return key, describe(handle), gr.update(open=False), *geometry_updates(handle)

    def picker_name(self, key: CacheKey | None) -> str:
        """The model in use as the picker names it, put back there after a refused load: the operator's model by
        its label (a folder on the server by its base name)."""
        return self.default_label if key is None or key == self.default_key else key.name

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
        """A new image (or model, geometry): one pass, the first view's maps, and the notice line ("" or the
        warning that the image is too small for the model: `ImageAnalysis.enlarged_blur`). A refused image leaves
        the session and every panel as they were and says why, and which image the page still shows."""
        current = controls.pop("current", None)  # the session's pass so far (a state: read when this event runs)
        name = None
        try:
            upload = upload_source(image, self.config.limits.max_bytes)
            if upload is not None:
                name = upload[1]
            return self._analyze(upload, key, geometry_mode, shorter_side, current, progress, request, controls)
        except VitInspectError as exc:
            what = f"**{plain_markdown(name)}** was not analysed" if name else "The image was not analysed"
            still = f" The page still shows {plain_markdown(current.image_words)}." if current is not None else ""
            raise InputError(f"{what}: {exc}{still}", public=f"{what}: {exc.public}{still}") from None

    def _analyze(self, upload: tuple | None, key: CacheKey, geometry_mode: object, shorter_side: object, current,
                 progress, request, controls: dict):
        relevance = flag(controls.pop("relevance", False), "The AttnLRP and LeGrad choice")
        typed, typed_versus = controls.pop("prompt", None), controls.pop("versus_prompt", None)  # OpenCLIP's boxes
        if upload is None:
            return (None, None, None, gr.update(choices=[], value=None), *[None] * len(IMAGE_PANELS), None, None,
                    gr.skip(), READOUT, "")
        source, name = upload
        geometry = self.geometry_of(geometry_mode, shorter_side)
        handle = self.handle(key)
        if (current is not None and (current.source, current.model, current.geometry) == (source, key, geometry)
                and current.relevance == relevance):
            # The page shows this input already: Gradio's image fires two changes when an upload replaces an
            # image. Nothing changes (the controls are still checked), no pass, and nothing drawn.
            with suppress(ResultDropped):  # unless the store let it go: then a pass as for a new image
                View.from_controls(current.result, **controls)
                return ANALYSIS_KEPT
        prompt = prompt_text(typed, optional=True) if handle.clip is not None else None  # a new image keeps it
        versus = prompt_text(typed_versus, "versus prompt", optional=True) if prompt is not None else None
        session = self._new_session(handle, key, source, name, geometry, relevance, progress, prompt, versus)
        result = session.result
        progress(0.8, desc="Drawing")
        picked = None if prompt is not None else str(result.target)  # a prompt is no label of the list
        target = (gr.update(choices=class_choices(handle.labels, result.probs, []), value=picked,
                            interactive=True) if result.probs.size else gr.update(choices=[], value=None))
        view = View.from_controls(result, **(controls | dict(query=READOUT)))  # a new image: no patch chosen yet
        drawn = dict(zip(FIRST_PANELS, draw_panels(FIRST_PANELS, session, view)))
        panels = [drawn.get(name) for name in IMAGE_PANELS]  # the others: cleared now, drawn by the next events
        self.order.supersede(session_hash(request), IMAGE_PANELS)  # redraws in flight drew the previous image
        seen = map_plots.outline_region(result.preview, result.seen_box, result.source_size)
        blur = result.enlarged_blur
        return (session, prediction_labels(handle, result), result.rgb, target, *panels, seen, map_geometry(result),
                describe(handle, result.layout), READOUT, "" if blur is None else f"{REFUSED}**{plain_markdown(name)}**: {blur}")

    def _new_session(self, handle: ViTHandle, key: CacheKey, source, name: str, geometry: InputGeometry,
                     relevance: bool, progress, prompt: str | None = None, versus: str | None = None) -> Session:
        """One pass over a new input (one forward, one backward), kept in the store: the session showing it.
        It explains the top class, or ``prompt`` (versus ``versus``) for a model with a text tower."""
        progress(0.4, desc="Running the model (one forward and one backward pass"
                           + (", plus AttnLRP and LeGrad)" if relevance else ")"))
        result = self._pass(handle, source, geometry, prompt, versus, relevance=relevance)
        scatter = distance_plots.DistanceScatterOnce(result.mean_distance, image_width=result.layout.input_size[1],
                                                     title=f"{public_name(handle.name)} · this image")
        shown = (result.target if prompt is None else prompt, versus)  # a prompt pass is kept under its text
        slot = self.store.put({shown: result}, result.nbytes())
        return Session(model=key, source=source, name=name, slot=slot, target=shown,
                       distance=scatter, labels=handle.labels, model_label=shown_model(handle), geometry=geometry,
                       relevance=relevance, relevance_for=frozenset({shown} if relevance else ()),
                       digest=input_digest(result.rgb),
                       image_words=f"{Path(name).name} ({geometry.describe(result.layout.input_size)})",
                       prompts=handle.clip is not None)

    def redraw(self, name: str):
        """A handler redrawing one panel from the session's cached pass, never the model (`_draw_newest`)."""
        @shows_errors
        def handler(session: Session | None, request: gr.Request = None, **controls):
            if session is None:
                return gr.skip()
            picture, newest = self._draw_newest(request, name, session, View.from_controls(session.result, **controls))
            return picture if newest else gr.skip()
        return handler

    def redraw_shown(self, tabs: dict[str, str]):
        """One handler for the panels of ``tabs`` (panel -> its tab): those whose tab the page shows are drawn
        (`redraw`), the others left as the new image's answer left them, cleared."""
        draws = {name: self.redraw(name) for name in tabs}

        def handler(session: Session | None, shown: object, request: gr.Request = None, **controls):
            return tuple(draws[name](session, request=request, **controls) if tab == shown else gr.skip()
                         for name, tab in tabs.items())
        return handler

    def redraw_many(self, names: tuple[str, ...]):
        """`redraw` of several panels in one event (the first view's maps on another colour scale)."""
        draws = [self.redraw(name) for name in names]

        def handler(session: Session | None, request: gr.Request = None, **controls):
            return tuple(draw(session, request=request, **controls) for draw in draws)
        return handler

    @shows_errors
    def redraw_rollout(self, session: Session | None, request: gr.Request = None, **controls):
        """The rollout map, and a backward range (From after To) swapped on the sliders as it is drawn."""
        if session is None:
            return gr.skip(), gr.skip(), gr.skip()
        view = View.from_controls(session.result, **controls)
        picture, newest = self._draw_newest(request, "rollout", session, view)
        sliders = (view.first_layer, view.last_layer) if view.swapped else (gr.skip(), gr.skip())
        return picture if newest else gr.skip(), *sliders

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
        scale = main_scale(session.result)  # the map shows the crop enlarged by this whole factor
        x = finite_float(evt.index[0], "The clicked x", -1e6, 1e6) / scale
        y = finite_float(evt.index[1], "The clicked y", -1e6, 1e6) / scale
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

    def _switch(self, session: Session, target: int | str, contrast: int | str | None, progress) -> Session:
        """The session showing (target, contrast), each a class index or a checked prompt (a model with a text
        tower): one new pass, or none if this pair was seen before."""
        num_classes = session.result.probs.size
        if not num_classes:
            raise InputError("This model has no classification head, so there is no class to explain.")
        for index in (target, contrast):
            if isinstance(index, str) and not session.prompts:
                raise InputError("This model has no text tower, so it reads no prompts; explain a class instead.")
            if isinstance(index, int) and not 0 <= index < num_classes:
                raise InputError(f"Class {index} does not exist: this model has classes 0 to {num_classes - 1}.")
        if contrast == target:
            raise InputError(f"The {'prompt' if isinstance(target, str) else 'class'} to compare with is the "
                             f"{'prompt' if isinstance(target, str) else 'class'} itself; choose another one.")
        results = dict(session.results)
        done = set(session.relevance_for)  # passes whose LeGrad and AttnLRP were computed
        if (target, contrast) not in results:
            progress(0.3, desc=f"Gradients for {session.target_text(target)}"
                               + ("" if contrast is None else f" versus {session.target_text(contrast)}"))
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
        """Gradient maps for the class picked in the list (and the class typed under "versus"; for a model with
        a text tower, a versus prompt, which with no label picked is compared with the prompt shown). A refused
        choice raises its sentence, which the page shows in its notice line, every panel left as it was
        (`common.says_refusals`)."""
        target = text(target, "The class to explain", max_chars=40)
        if session is not None and not target and isinstance(session.target[0], str):
            return self._show_class(session, session.target[0], self._versus(session, versus), [], progress,
                                    controls, request)
        if session is None or not target:
            return CLASS_SKIP
        if not target.isdigit():
            raise InputError(f"{target!r} is not a class; pick one from the list or type a name or an index "
                             "in the search box.")
        contrast = self._versus(session, versus)
        return self._show_class(session, int(target), contrast, [int(target)], progress, controls, request)

    def search_class(self, session: Session | None, wanted: object, versus: object, progress=gr.Progress(),
                     request: gr.Request = None, **controls):
        """The search box: "1" is class 1, "beagle" finds #162; the best match becomes the target and the
        list shows the top 5, then the other matches. A search that finds nothing raises its sentence, as
        `set_target` does."""
        wanted = text(wanted, "The class search", 100)
        if session is None or not wanted:
            return CLASS_SKIP
        index = find_class(session.labels, session.result.probs, wanted, "class to explain")
        contrast = self._versus(session, versus)
        found = search_classes(session.labels, wanted, session.result.probs, limit=CLASS_CHOICES)
        return self._show_class(session, index, contrast, found, progress, controls, request)

    def set_prompt(self, session: Session | None, prompt: object, versus: object, progress=gr.Progress(),
                   request: gr.Request = None, **controls):
        """The prompt box of a model with a text tower (OpenCLIP): every gradient map explains the cosine
        similarity of the image and the prompt, minus the versus prompt's when one is typed. A refused prompt
        (empty, too long, control or invisible characters) raises its sentence, as `set_target` does."""
        if session is None:
            raise InputError("Analyse an image first; the prompt is explained on it.")
        if not session.prompts:
            raise InputError("This model has no text tower, so it reads no prompts; its operator can serve an "
                             "OpenCLIP model (python app.py --model open_clip:NAME).")
        wanted = prompt_text(prompt)
        return self._show_class(session, wanted, self._versus(session, versus), [], progress, controls, request)

    @staticmethod
    def _versus(session: Session, versus: object) -> int | str | None:
        """The versus box: a prompt for a model with a text tower, else a class name or index (None: empty)."""
        if session.prompts:
            return prompt_text(versus, "versus prompt", optional=True)
        return find_class(session.labels, session.result.probs, text(versus, "The versus class", 100), "comparison")

    def _show_class(self, session: Session, index: int | str, contrast: int | str | None, found: list[int], progress,
                    controls, request=None):
        session = self._switch(session, index, contrast, progress)
        view = View.from_controls(session.result, **controls)
        choices = class_choices(session.labels, session.result.probs, found)
        panels = draw_panels(CLASS_PANELS, session, view)
        self.order.supersede(session_hash(request), CLASS_PANELS)  # redraws in flight drew the previous class
        picked = None if isinstance(index, str) else str(index)  # a prompt is no entry of the list
        return session, gr.update(choices=choices, value=picked), *panels

    @shows_errors
    def downloads(self, session: Session | None, key: CacheKey | None = None, **controls):
        """The current image's figures as PNG (each captioned with its model, class and settings), its
        numbers as JSON (the CLI's record plus the settings) and .npz (with the same settings); and what they
        were made from (a `stale.Basis` down to the settings) with a line saying so."""
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
        settings = {"model": public_name(handle.name), "weights": weights_label(handle),
                    "input_geometry": session.geometry.describe(result.layout.input_size),
                    "class": target_record(handle, result.target, result.prompt),
                    "contrast": target_record(handle, result.contrast, result.versus),
                    "relevance": computed(session)}  # False: LeGrad and AttnLRP were not computed (the toggle)
        settings |= view.record()
        plugged, missing = added_maps(session)  # the registry's added methods this pass holds (`relevance`)
        record = analysis_record(handle, result, session.name) | {"model": settings["model"], "settings": settings}
        record |= {name: rounded(values) for name, values in plugged.items() if name not in record}
        if missing:
            record["left_out"] = missing
        paths.append(folder / f"{stem}.json")
        paths[-1].write_text(json.dumps(record, indent=1))
        arrays = result.attention_arrays() | {"mean_distance": result.mean_distance, "probs": result.probs,
                  "rgb": result.rgb, "gradcam": result.gradcam, "chefer": result.chefer, "legrad": result.legrad,
                  "attnlrp": result.attnlrp, "settings_json": np.array(json.dumps(settings))}
        arrays |= {f"{name}_map": view_map(result, view, name) for name in MAP_NAMES}
        arrays |= {name: values for name, values in plugged.items() if name not in arrays}
        paths.append(folder / f"{stem}.npz")
        np.savez_compressed(paths[-1], **{k: v for k, v in arrays.items() if v is not None})
        basis = Basis.of(session, key or session.model, download_options(session, controls))
        note = (f"Prepared for {session.image_words}" + (f", {session.target_words()}" if session.target_words()
                else "") + " and the settings recorded in each file; a change to any of them clears these files.")
        return basis, [str(p) for p in paths], note
