"""vit_inspect's Gradio app: `python app.py` serves it on http://127.0.0.1:7860.

Gradio only: flags -> `AppConfig` -> `build_demo(config)` -> `gr.Blocks`. A new image runs one pass
(`analyze_image`: one forward, one backward) whose result is kept in the session's `gr.State`;
sliders, clicks and options redraw from it without calling the model. Models live in a bounded
`ModelCache` shared by all sessions and are loaded on first use, never at import.
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr
import numpy as np
from gradio import utils as gradio_utils
from PIL import Image

from vit_inspect import plotting
from vit_inspect.analysis import filter_pca
from vit_inspect.cli import analysis_record
from vit_inspect.errors import InputError, VitInspectError
from vit_inspect.images import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, ImageLimits
from vit_inspect.model_cache import DEFAULT_CACHE_SIZE, CacheKey, ModelCache
from vit_inspect.models import DEFAULT_MODEL, ViTHandle
from vit_inspect.module_spec import model_file_name
from vit_inspect.pipeline import ImageAnalysis, analyze_image, dataset_attention_distance, pos_similarity_at
from vit_inspect.ui import compare as compare_ui
from vit_inspect.ui.faithfulness import FaithfulnessTab
from vit_inspect.ui.untrusted import client_file, client_files, finite_float, finite_int, flag, redact_paths, text

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
READOUT, PATCH = "class / readout token", "clicked patch"  # choices of the attention query
HEAD_FUSIONS = ("mean", "max", "min")
MAX_TARGETS_PER_SESSION = 8  # passes kept per image, one per target class
MAX_DATASET_IMAGES = 64  # images per attention-distance average
MAX_SIMILARITY_GRID = 20  # patches per side in a position-similarity figure (one tile per patch)
MAX_INPUT_SIDE = 100_000  # pixels: a larger height or width typed by a client is refused as such
DRAW_CONCURRENCY = 4  # redraws run in parallel; model passes run one at a time (hooks are per model)
CACHE_SECONDS = (3600, 7200)  # Gradio deletes its temporary files every hour once they are 2 hours old
MAP_BOX_HEIGHT = 290  # CSS pixels: a 224-pixel map sits centred below the image label, never scaled up
MAP_NAMES = ("attention", "rollout", "gradcam", "relevance")  # the maps drawn over the image
IMAGE_PANELS = ("attention", "distance", "rollout", "gradcam", "relevance", "compare")  # per-image outputs


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
    results: dict[int | None, ImageAnalysis]  # one pass per target class (None: a model without a head)
    target: int | None  # the pass shown now
    distance: plotting.DistanceScatter  # this image's attention-distance scatter, drawn once

    @property
    def result(self) -> ImageAnalysis:
        return self.results[self.target]


@dataclass(frozen=True)
class View:
    """What the controls ask to see, in library terms, fitted to one result's geometry."""

    layer: int
    head: int | None  # None: mean of heads
    patch: tuple[int, int] | None  # query patch (row, col); None: the readout token
    head_fusion: str  # rollout: how heads are fused
    discard_ratio: float  # rollout: fraction of the lowest attention dropped per row
    first_layer: int  # rollout: first and last layer, both included
    last_layer: int
    gradcam_layer: int

    @classmethod
    def from_controls(cls, result: ImageAnalysis, *, layer, head, mean_heads, query, row, col, head_fusion,
                      discard_ratio, first_layer, last_layer, gradcam_layer) -> View:
        """Raw client values -> a View. Values beyond this model (±inf included) are clamped, an empty
        box is 0; NaN and wrong types are refused with a sentence (`InputError`)."""
        layout = result.layout
        top = result.depth - 1

        def clamp(value, what: str, hi: int) -> int:
            return finite_int(value, what, 0, hi, default=0)

        first, last = sorted((clamp(first_layer, "From layer", top), clamp(last_layer, "To layer", top)))
        return cls(layer=clamp(layer, "Layer", top),
                   head=None if flag(mean_heads, "Mean of heads") else clamp(head, "Head", result.num_heads - 1),
                   patch=((clamp(row, "Patch row", layout.grid_h - 1), clamp(col, "Patch column", layout.grid_w - 1))
                          if query == PATCH else None),
                   head_fusion=head_fusion if isinstance(head_fusion, str) and head_fusion in HEAD_FUSIONS else "mean",
                   discard_ratio=finite_float(discard_ratio, "Discard ratio", 0.0, 0.95, default=0.0),
                   first_layer=first, last_layer=last, gradcam_layer=clamp(gradcam_layer, "Grad-CAM block", top))

    def titles(self) -> dict[str, str]:
        heads = "mean of heads" if self.head is None else f"head {self.head}"
        source = "" if self.patch is None else f", from patch {self.patch}"
        return {"attention": f"attention, layer {self.layer}, {heads}{source}",
                "rollout": f"rollout ({self.head_fusion}), layers {self.first_layer}-{self.last_layer}",
                "gradcam": f"Grad-CAM, block {self.gradcam_layer}",
                "relevance": "gradient-weighted attention"}


def view_map(result: ImageAnalysis, view: View, name: str) -> np.ndarray | None:
    """One raw (grid_h, grid_w) map of MAP_NAMES; None for Grad-CAM and relevance of a model without a head."""
    if name == "attention":
        return result.attention_map(view.layer, view.head, view.patch)
    if name == "rollout":
        return result.rollout(view.head_fusion, view.discard_ratio, start_layer=view.first_layer,
                              end_layer=view.last_layer + 1)
    if result.gradcam is None:
        return None
    return result.gradcam[view.gradcam_layer] if name == "gradcam" else result.chefer


def figure_image(fig) -> np.ndarray:
    """Render a matplotlib Figure to (H, W, 3) uint8 and release what it drew."""
    try:
        return plotting.figure_to_rgb(fig)
    finally:
        fig.clear()


def draw_panels(names: tuple[str, ...], session: Session, view: View) -> list[np.ndarray | None]:
    """The images of the named panels, in order; None where the model has nothing to show.
    Only the maps these panels need are computed, each once."""
    result = session.result
    maps = {}
    titles = view.titles()

    def grid_map(name: str) -> np.ndarray | None:
        if name not in maps:
            maps[name] = view_map(result, view, name)
        return maps[name]

    drawn = []
    for name in names:
        if name == "distance":
            drawn.append(session.distance.draw((view.layer, view.head)))
        elif name == "compare":
            shown = {titles[k]: grid_map(k) for k in MAP_NAMES if grid_map(k) is not None}
            shown |= {k: v for k, v in (("LeGrad", result.legrad), ("AttnLRP", result.attnlrp)) if v is not None}
            drawn.append(figure_image(plotting.maps_figure(result.rgb, shown, relu_names=(titles["gradcam"],))))
        elif grid_map(name) is None:
            drawn.append(None)
        else:
            drawn.append(plotting.overlay(result.rgb, grid_map(name), relu=name == "gradcam",
                                          marker=view.patch if name == "attention" else None))
    return drawn


def public_message(exc: VitInspectError) -> str:
    """What a web user sees of a library error: its public sentence, with any server path cut to its
    last component (the operator's console and the CLI keep `str(exc)`, the full detail)."""
    return redact_paths(exc.public)


def shows_errors(fn):
    """Handlers turn the library's exceptions into a gr.Error with their public sentence. Anything
    else is a bug: the user gets a sentence, the operator's console the traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except VitInspectError as exc:
            log.info("%s refused: %s", fn.__name__, exc)
            raise gr.Error(public_message(exc), print_exception=False) from None
        except Exception:
            log.exception("unexpected error in %s", fn.__name__)
            raise gr.Error(f"Something went wrong on the server while handling this request "
                           f"({fn.__name__.replace('_', ' ')}); it has been logged. Please try again "
                           "or with other settings.", print_exception=False) from None
    return wrapper


def upload_folders() -> list[str]:
    """The only folders a client's file reference may point into: Gradio's upload/cache folder, where
    Gradio puts uploads and its copies of the example images."""
    return [gradio_utils.get_upload_folder()]


def upload_source(payload: object, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[str | bytes, str] | None:
    """(file path or bytes, file name) of a raw gr.Image value; None when the image was cleared.

    The image events skip Gradio's preprocessing so that `load_image`, not PIL inside Gradio,
    reads the upload and explains what is wrong with it. Gradio checks a path only when the payload
    carries its `meta` field, so every shape goes through the one gate, `client_file`.
    """
    return client_file(payload, upload_folders(), max_bytes)


def model_label(name: str) -> str:
    """A model name as web users see it: a folder on this server (only the operator's --model can be
    one) by its base name, anything else (timm name, hub id) as it is."""
    return Path(name).name if os.path.isabs(name) or os.path.isdir(name) else name


def names_python_file(name: str) -> bool:
    """Whether a model name from the page points at Python code ("x.py", "x.py:build"): always refused."""
    return ":" in name or name.lower().rstrip("/").endswith((".py", ".pyc", ".pyw", ".pyz"))


def weights_label(handle: ViTHandle) -> str:
    """Where the weights came from, without revealing server folders."""
    return model_label(handle.weights)


def describe(handle: ViTHandle) -> str:
    layout = handle.layout()
    prefix = ", ".join(layout.prefix_names()) or "none"
    return (f"**Model** `{model_label(handle.name)}` · **weights** `{weights_label(handle)}` · **device** `{handle.device}`  \n"
            f"{handle.depth} layers × {handle.num_heads} heads · "
            f"{handle.patch_size[0]}×{handle.patch_size[1]}-pixel patches on a {layout.grid_h}×{layout.grid_w} grid · "
            f"prefix tokens: {prefix}"
            + ("" if handle.has_head else " · no classification head (no predictions or Grad-CAM)"))


def geometry_updates(handle: ViTHandle) -> list[dict]:
    """Ranges and defaults of layer, head, rollout range, Grad-CAM layer and patch boxes for a model."""
    last = handle.depth - 1
    layout = handle.layout()
    return [gr.update(maximum=last, value=last), gr.update(maximum=handle.num_heads - 1, value=0),
            gr.update(maximum=last, value=0), gr.update(maximum=last, value=last), gr.update(maximum=last, value=last),
            gr.update(maximum=layout.grid_h - 1), gr.update(maximum=layout.grid_w - 1)]


def prediction_labels(handle: ViTHandle, result: ImageAnalysis) -> tuple[dict | None, dict]:
    """(gr.Label value, target dropdown update) for a result."""
    if not result.probs.size:
        return None, gr.update(choices=[], value=None, interactive=False)
    top = handle.top_labels(result.probs, 5)
    choices = [(f"{t['label']} (#{t['index']}) · {t['prob']:.1%}", str(t["index"])) for t in top]
    return ({f"{t['label']} (#{t['index']})": t["prob"] for t in top},
            gr.update(choices=choices, value=str(result.target), interactive=True))


class Inspector:
    """The event handlers: UI values in, library calls, UI values out. Holds models, never user data."""

    def __init__(self, config: AppConfig, cache: ModelCache):
        self.config = config
        self.cache = cache
        self.default_key = CacheKey.of(config.model, config.weights, config.device)
        self.default_label = model_label(config.model)  # the operator's model as the dropdown shows it
        # Model-level figures depend only on the model: drawn once, kept beside the cache.
        self.filter_figure_of = functools.lru_cache(maxsize=cache.max_size)(self._filter_figure)
        self.similarity_figure_of = functools.lru_cache(maxsize=4 * cache.max_size)(self._similarity_figure)

    def handle(self, key: CacheKey) -> ViTHandle:
        # Only the operator's own model (from the command line) may be a folder or a Python file on this server.
        own = key == self.default_key
        operator_file = {"model_file": self.config.model_file} if own and self.config.model_file else {}
        return self.cache.get(key, allow_local_dirs=own, **operator_file)

    def startup(self, progress=gr.Progress()):
        """Page load: the default model, or in its place how to get its weights."""
        progress(0, desc="Loading the model")
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
        return key, describe(handle), gr.update(open=False), *geometry_updates(handle), None, None, None

    @shows_errors
    def analyze(self, image: dict | None, key: CacheKey, progress=gr.Progress(), **controls):
        upload = upload_source(image, self.config.limits.max_bytes)
        if upload is None:
            return None, None, None, gr.update(choices=[], value=None), *[None] * len(IMAGE_PANELS)
        source, name = upload
        progress(0.1, desc="Loading the model")
        handle = self.handle(key)
        progress(0.4, desc="Running the model (one forward and one backward pass)")
        result = analyze_image(handle, source, limits=self.config.limits)
        progress(0.8, desc="Drawing")
        scatter = plotting.distance_scatter(result.mean_distance, image_width=result.layout.input_size[1],
                                            title="this image")
        session = Session(model=key, source=source, name=name, results={result.target: result}, target=result.target,
                          distance=scatter)
        predictions, target = prediction_labels(handle, result)
        panels = draw_panels(IMAGE_PANELS, session, View.from_controls(result, **controls))
        return session, predictions, result.rgb, target, *panels

    def redraw(self, name: str):
        """A handler that redraws one panel from the session's cached pass; never calls the model."""
        @shows_errors
        def handler(session: Session | None, **controls):
            if session is None:
                return gr.skip()
            return draw_panels((name,), session, View.from_controls(session.result, **controls))[0]
        return handler

    @shows_errors
    def pick_patch(self, evt: gr.SelectData, session: Session | None, **controls):
        """A click on the attention map (x, y in the crop's pixels) makes that patch the query."""
        if session is None or evt.index is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        if not isinstance(evt.index, (list, tuple)) or len(evt.index) < 2:
            raise InputError("A click gives the (x, y) pixel it landed on; this one gave none.")
        height, width = session.result.layout.input_size
        x = finite_float(evt.index[0], "The clicked x", 0, width - 1)
        y = finite_float(evt.index[1], "The clicked y", 0, height - 1)
        row, col = session.result.layout.patch_at(y, x)
        view = View.from_controls(session.result, **(controls | dict(query=PATCH, row=row, col=col)))
        return row, col, PATCH, *draw_panels(("attention",), session, view)

    @shows_errors
    def set_target(self, session: Session | None, target: str | None, progress=gr.Progress(), **controls):
        """Grad-CAM and relevance for another class: one new pass, or none if this class was seen before."""
        target = text(target, "The target class", max_chars=40)
        if session is None or not target:
            return gr.skip(), gr.skip(), gr.skip()
        try:
            index = int(target)
        except ValueError:
            raise InputError(f"{target!r} is not a class index; pick a class or type a whole number.") from None
        num_classes = session.result.probs.size
        if not num_classes:
            raise InputError("This model has no classification head, so there is no class to explain.")
        if not 0 <= index < num_classes:
            raise InputError(f"Class {index} does not exist: this model has classes 0 to {num_classes - 1}.")
        results = dict(session.results)
        if index not in results:
            progress(0.3, desc=f"Gradients for class {index}")
            fresh = analyze_image(self.handle(session.model), session.source, target=index, limits=self.config.limits)
            # same image, same model: the attention is the same, so every target shares one copy
            results[index] = replace(fresh, attention=session.result.attention)
            while len(results) > MAX_TARGETS_PER_SESSION:
                results.pop(next(iter(results)))
        session = replace(session, results=results, target=index)
        view = View.from_controls(session.result, **controls)
        return session, *draw_panels(("gradcam", "relevance"), session, view)

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
        image = figure_image(plotting.attention_distance_figure(
            stats.distances, image_width=handle.input_size[1], title=f"mean over {stats.num_images} images"))
        note = f"Averaged over {stats.num_images} image(s)."
        if stats.skipped:
            note += " Skipped: " + redact_paths("; ".join(f"{name}: {reason}" for name, reason in stats.skipped))
        return image, note

    @shows_errors
    def filter_figure(self, key: CacheKey, progress=gr.Progress()):
        """Principal components of the patch-embedding filters, drawn once per model."""
        progress(0, desc="Drawing the patch-embedding filters")
        return self.filter_figure_of(key)

    def _filter_figure(self, key: CacheKey) -> np.ndarray:
        return figure_image(plotting.filter_pca_figure(filter_pca(self.handle(key).patch_embed_weight())))

    @shows_errors
    def native_similarity(self, key: CacheKey, progress=gr.Progress()):
        """Position-embedding similarity on the grid the model was trained for, drawn once per model."""
        progress(0, desc="Drawing the position-embedding similarity")
        return self.similarity_figure_of(key, self.handle(key).native_grid)

    @shows_errors
    def pos_similarity(self, key: CacheKey, height: object, width: object, progress=gr.Progress()):
        """Position-embedding similarity at another input size, interpolated as the model does it."""
        handle = self.handle(key)
        ph, pw = handle.patch_size
        height = finite_int(height, "The input height (pixels)", ph, MAX_INPUT_SIDE, clamp=False)
        width = finite_int(width, "The input width (pixels)", pw, MAX_INPUT_SIDE, clamp=False)
        layout = handle.layout((height, width))
        if max(layout.grid_h, layout.grid_w) > MAX_SIMILARITY_GRID:
            raise InputError(f"{height}×{width} pixels make a {layout.grid_h}×{layout.grid_w} grid; the "
                             f"figure draws at most {MAX_SIMILARITY_GRID} patches per side "
                             f"(up to {MAX_SIMILARITY_GRID * ph}×{MAX_SIMILARITY_GRID * pw} pixels for this model).")
        progress(0, desc=f"Drawing a {layout.grid_h}×{layout.grid_w} grid")
        return self.similarity_figure_of(key, (layout.grid_h, layout.grid_w))

    def _similarity_figure(self, key: CacheKey, grid: tuple[int, int]) -> np.ndarray:
        handle = self.handle(key)
        similarity = pos_similarity_at(handle, grid)
        if similarity is None:
            raise InputError("This model has no learned position embeddings to compare.")
        fig = plotting.pos_similarity_figure(
            similarity, title=f"Position-embedding similarity, {grid[0]}×{grid[1]} patches "
                              f"({grid[0] * handle.patch_size[0]}×{grid[1] * handle.patch_size[1]} pixels)")
        return figure_image(fig)

    @shows_errors
    def downloads(self, session: Session | None, **controls) -> list[str]:
        """The current image's figures as PNG, its numbers as JSON (the CLI's record) and .npz."""
        if session is None:
            raise InputError("Analyse an image first; the downloads are its figures and numbers.")
        result = session.result
        view = View.from_controls(result, **controls)
        cache_dir = Path(gradio_utils.get_upload_folder())  # Gradio serves and cleans files found here
        cache_dir.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="vit_inspect_", dir=cache_dir))
        stem = Path(session.name).stem or "image"
        paths = []
        for name, image in zip(IMAGE_PANELS, draw_panels(IMAGE_PANELS, session, view)):
            if image is not None:
                paths.append(folder / f"{stem}_{name}.png")
                Image.fromarray(image).save(paths[-1])
        record = analysis_record(self.handle(session.model), result, session.name) | {"target": result.target}
        paths.append(folder / f"{stem}.json")
        paths[-1].write_text(json.dumps(record, indent=1))
        arrays = {"attention": result.attention, "mean_distance": result.mean_distance, "probs": result.probs,
                  "rgb": result.rgb, "gradcam": result.gradcam, "chefer": result.chefer, "legrad": result.legrad,
                  "attnlrp": result.attnlrp}
        arrays |= {f"{name}_map": view_map(result, view, name) for name in MAP_NAMES}
        paths.append(folder / f"{stem}.npz")
        np.savez_compressed(paths[-1], **{k: v for k, v in arrays.items() if v is not None})
        return [str(p) for p in paths]


def build_demo(config: AppConfig = AppConfig(), cache: ModelCache | None = None) -> gr.Blocks:
    """The app's Blocks. Loads nothing: the first page load or request loads the model through the cache."""
    app = Inspector(config, cache if cache is not None else ModelCache(config.cache_size))
    models = CURATED_MODELS if config.model in CURATED_MODELS else (app.default_label, *CURATED_MODELS)
    map_out = dict(interactive=False, format="png", height=MAP_BOX_HEIGHT, buttons=["download", "fullscreen"])
    figure_out = dict(interactive=False, format="png", show_label=False, buttons=["download"])
    panel: dict[str, gr.Image] = {}
    with gr.Blocks(title="vit_inspect", delete_cache=CACHE_SECONDS) as demo:
        key = gr.State(app.default_key)
        session = gr.State(None, time_to_live=config.session_ttl_s)
        gr.Markdown("# vit_inspect\nLook inside a Vision Transformer: what it predicts, where it attends and "
                    "how it sees. Upload an image or pick an example; every slider and click redraws instantly "
                    "from one pass of the model. In the maps, brighter means more (each map is scaled to its own "
                    "range).")
        status = gr.Markdown("Loading the model…")
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                image = gr.Image(label="Image (upload, drop, paste or webcam)", type="filepath", height=320,
                                 sources=["upload", "clipboard", "webcam"], elem_id="input-image")
                gr.Examples([[str(ASSETS / name)] for name, _ in EXAMPLES], inputs=image, label="Examples",
                            examples_per_page=len(EXAMPLES))
                gr.Markdown("Examples, left to right: " + "; ".join(c for _, c in EXAMPLES) + ".")
                with gr.Accordion("Change model", open=False) as model_box:
                    model_name = gr.Dropdown(list(models), value=app.default_label, label="Model", allow_custom_value=True,
                                             info="Or type any timm ViT name, or a Hugging Face id such as "
                                                  "google/vit-base-patch16-224.")
                    weights = gr.File(label="Own weights (.safetensors, for a timm name; leave empty otherwise)",
                                      file_types=[".safetensors"], type="filepath", height=100)
                    load_button = gr.Button("Load model", variant="primary")
            with gr.Column(scale=2):
                with gr.Tabs():
                    with gr.Tab("Predictions"):
                        with gr.Row():
                            predictions = gr.Label(num_top_classes=5, label="Top-5 classes", elem_id="predictions")
                            crop = gr.Image(label="What the model sees (its input crop)", **map_out)
                    with gr.Tab("Attention"):
                        with gr.Row():
                            panel["attention"] = gr.Image(label="Attention map: click a patch to query from it",
                                                          elem_id="attention-map", **map_out)
                            with gr.Column():
                                layer = gr.Slider(0, 11, value=11, step=1, label="Layer", elem_id="layer-slider")
                                head = gr.Slider(0, 2, value=0, step=1, label="Head")
                                mean_heads = gr.Checkbox(False, label="Mean of heads (instead of one head)")
                                query = gr.Radio([READOUT, PATCH], value=READOUT, label="Query token", elem_id="query",
                                                 info="Whose attention: the token the classifier reads, or the "
                                                      "patch you click on the map.")
                                with gr.Row():
                                    row = gr.Number(0, label="Patch row", precision=0, minimum=0, maximum=13,
                                                    elem_id="patch-row")
                                    col = gr.Number(0, label="Patch column", precision=0, minimum=0, maximum=13,
                                                    elem_id="patch-col")
                    with gr.Tab("Rollout"):
                        with gr.Row():
                            panel["rollout"] = gr.Image(label="Attention rollout (Abnar & Zuidema 2020)",
                                                        elem_id="rollout-map", **map_out)
                            with gr.Column():
                                head_fusion = gr.Radio(list(HEAD_FUSIONS), value="mean", label="Head fusion")
                                discard_ratio = gr.Slider(0.0, 0.95, value=0.0, step=0.05, label="Discard ratio",
                                                          info="Lowest attention dropped per row before rolling out.",
                                                          elem_id="discard-slider")
                                first_layer = gr.Slider(0, 11, value=0, step=1, label="From layer")
                                last_layer = gr.Slider(0, 11, value=11, step=1, label="To layer (included)")
                    with gr.Tab("Grad-CAM"):
                        with gr.Row():
                            target = gr.Dropdown([], label="Target class", allow_custom_value=True, scale=2,
                                                 info="One of the top 5, or type any class index and press Enter.")
                            gradcam_layer = gr.Slider(0, 11, value=11, step=1, label="Grad-CAM block", scale=1)
                        with gr.Row():
                            panel["gradcam"] = gr.Image(label="Grad-CAM (ReLU)", **map_out)
                            panel["relevance"] = gr.Image(label="Gradient-weighted attention (Chefer et al. 2021)",
                                                          **map_out)
                    with gr.Tab("All maps") as compare_tab:
                        gr.Markdown("Every map on the same input crop, each with the options set in its own tab: "
                                    "layer, head and query under **Attention**, fusion and layers under **Rollout**, "
                                    "class and block under **Grad-CAM**.")
                        panel["compare"] = gr.Image(label="All maps", elem_id="compare-maps", **figure_out)
                    with gr.Tab("Faithfulness"):
                        faithfulness = FaithfulnessTab()
                    with gr.Tab("Attention distance") as distance_tab:
                        gr.Markdown("Mean attention distance per head (ViT paper, Fig. 7 right): how far, in pixels, "
                                    "each head looks. The red dot is the layer and head chosen under **Attention**.")
                        with gr.Row():
                            panel["distance"] = gr.Image(label="This image", elem_id="distance-plot", **figure_out)
                            dataset_plot = gr.Image(label="Averaged over your images", **figure_out)
                        with gr.Row():
                            dataset_files = gr.File(label=f"Images to average (up to {MAX_DATASET_IMAGES})",
                                                    file_count="multiple", file_types=["image"], type="filepath",
                                                    height=120, scale=3)
                            dataset_button = gr.Button("Average over these images", scale=1)
                        dataset_note = gr.Markdown()
                    with gr.Tab("Model") as model_tab:
                        gr.Markdown("The model's own parameters, no image needed (ViT paper, Fig. 7 left and centre).")
                        pca = gr.Image(label="Patch-embedding filters: principal components", **figure_out)
                        gr.Markdown("Position-embedding similarity at the model's own input size (left) and, "
                                    "resampled as the model does it, at another input size (right):")
                        with gr.Row(equal_height=True):
                            height = gr.Number(160, label="Other input height (pixels)", precision=0, minimum=1)
                            width = gr.Number(320, label="Other input width (pixels)", precision=0, minimum=1)
                            similarity_button = gr.Button("Compare at this input size")
                        with gr.Row():
                            similarity = gr.Image(label="Position-embedding similarity at the model's own size",
                                                  **figure_out)
                            similarity_other = gr.Image(label="Position-embedding similarity at the other size",
                                                        **figure_out)
                    with gr.Tab("Downloads"):
                        gr.Markdown("The current image's figures as PNG, its numbers as JSON (the command line's "
                                    "record) and NumPy `.npz` (attention, Grad-CAM, relevance, mean distance, and "
                                    "the maps as shown). Each image above also has its own download button.")
                        download_button = gr.Button("Prepare downloads", variant="primary")
                        download_files = gr.File(label="Files", file_count="multiple", interactive=False)
                    compare_ui.compare_tab(app, image, key, models, model_pass=dict(concurrency_id="model_pass", concurrency_limit=1),
                                           upload_source=upload_source, shows_errors=shows_errors)

        controls = dict(layer=layer, head=head, mean_heads=mean_heads, query=query, row=row, col=col,
                        head_fusion=head_fusion, discard_ratio=discard_ratio, first_layer=first_layer,
                        last_layer=last_layer, gradcam_layer=gradcam_layer)
        geometry = [layer, head, first_layer, last_layer, gradcam_layer, row, col]
        model_outputs = [pca, similarity, similarity_other]
        model_pass = dict(concurrency_id="model_pass", concurrency_limit=1)
        # Handlers get the client's raw values and check them themselves (vit_inspect.ui.untrusted), so
        # that a NaN, a string or a forged file reference gets a sentence rather than Gradio's bare "Error".
        raw = dict(preprocess=False)

        gr.on([demo.load], app.startup, outputs=[status, model_box, *geometry], api_name="startup")
        gr.on([load_button.click, model_name.select], app.load_model, inputs=[model_name, weights],
              outputs=[key, status, model_box, *geometry, *model_outputs], api_name="load_model", **raw)
        gr.on([image.change, key.change], app.analyze, inputs=[image, key], inputs_kwargs=controls,
              outputs=[session, predictions, crop, target, *[panel[n] for n in IMAGE_PANELS]],
              api_name="analyze", **raw, **model_pass)
        # Each panel redraws when a control it shows changes; the last two panels have no controls of their
        # own (they show those of other tabs), so they redraw when their tab opens.
        redraws = {"attention": [layer.input, head.input, mean_heads.input, query.input, row.input, col.input],
                   "rollout": [head_fusion.input, discard_ratio.input, first_layer.input, last_layer.input],
                   "gradcam": [gradcam_layer.input],
                   "distance": [distance_tab.select],
                   "compare": [compare_tab.select]}
        for name, triggers in redraws.items():
            gr.on(triggers, app.redraw(name), inputs=[session], inputs_kwargs=controls, outputs=panel[name],
                  api_name=name, trigger_mode="always_last", show_progress="hidden",
                  concurrency_limit=DRAW_CONCURRENCY, **raw)
        gr.on([panel["attention"].select], app.pick_patch, inputs=[session], inputs_kwargs=controls,
              outputs=[row, col, query, panel["attention"]], api_name="pick_patch", show_progress="hidden",
              concurrency_limit=DRAW_CONCURRENCY, **raw)
        gr.on([target.input], app.set_target, inputs=[session, target], inputs_kwargs=controls,
              outputs=[session, panel["gradcam"], panel["relevance"]], api_name="set_target", **raw, **model_pass)
        faithfulness.wire(app.handle, session, controls, **raw, **model_pass)
        gr.on([dataset_button.click], app.dataset_distance, inputs=[dataset_files, key],
              outputs=[dataset_plot, dataset_note], api_name="dataset_distance", **raw, **model_pass)
        gr.on([model_tab.select], app.filter_figure, inputs=[key], outputs=pca, api_name="filter_figure")
        gr.on([model_tab.select], app.native_similarity, inputs=[key], outputs=similarity,
              api_name="native_similarity")
        gr.on([similarity_button.click], app.pos_similarity, inputs=[key, height, width], outputs=[similarity_other],
              api_name="pos_similarity", **raw)
        gr.on([download_button.click], app.downloads, inputs=[session], inputs_kwargs=controls,
              outputs=[download_files], api_name="downloads", **raw)
    return demo


if __name__ != "__main__":
    demo = build_demo()  # for importers (gradio's reload mode, tests); `python app.py` builds from its flags


def launch_limits(config: AppConfig) -> dict:
    """The `launch()` arguments that bound what one server holds: upload size and sessions in memory."""
    return dict(max_file_size=f"{config.max_upload_mb:g}mb", state_session_capacity=config.max_sessions)


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
    parser.add_argument("--max-sessions", type=int, default=AppConfig.max_sessions,
                        help=f"sessions kept in memory; the oldest is dropped beyond this (default {AppConfig.max_sessions})")
    args = parser.parse_args(argv)
    try:
        model = model_file_name(args.model_file) if args.model_file else args.model
    except VitInspectError as exc:
        parser.error(str(exc))
    config = AppConfig(model=model, weights=args.weights, device=args.device, model_file=args.model_file,
                       cache_size=args.cache_size,
                       max_upload_mb=args.max_upload_mb, max_image_pixels=args.max_image_pixels,
                       max_sessions=args.max_sessions)
    return config, args


def main() -> None:
    config, args = parse_args()
    cache = ModelCache(config.cache_size)
    try:  # load the default model now so the first visitor does not wait; the page explains a failure
        Inspector(config, cache).handle(CacheKey.of(config.model, config.weights, config.device))
    except (VitInspectError, ValueError) as exc:
        print(f"warning: {exc}")
    build_demo(config, cache).launch(server_name=args.host, server_port=args.port, share=args.share,
                                     **launch_limits(config))


if __name__ == "__main__":
    main()
