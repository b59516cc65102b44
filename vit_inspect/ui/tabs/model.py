"""The Model tab: what a ViT learned before it sees any image (Dosovitskiy et al. 2021, Fig. 7 left and
centre): the principal components of the patch-embedding filters and the cosine similarity of the
position embeddings, at the model's own grid or at another input size. Each figure depends only on the
model, so it is drawn once per model (and grid) and kept beside the model cache. What the tab shows records
its model (``made_from``); another model redraws it while the tab is shown, and clears it otherwise
(`ui.stale`)."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Callable

import gradio as gr
import numpy as np
from PIL import Image

from vit_inspect.analysis import filter_pca
from vit_inspect.core.errors import InputError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.plots import model as model_plots
from vit_inspect.studies.model_report import pos_similarity_at
from vit_inspect.ui.common import (FIGURE_OUT, MODEL_PASS, RAW, OutputImage, download_folder, progress_slot,
                                   public_name, says_refusals, shown_model, shows_errors, weights_label)
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.model_cache import CacheKey
from vit_inspect.ui.stale import NOTE, Basis, Tracked
from vit_inspect.ui.untrusted import finite_int

MAX_SIMILARITY_GRID = 20  # patches per side in a position-similarity figure (one tile per patch)
MAX_INPUT_SIDE = 100_000  # pixels: a larger height or width typed by a client is refused as such


class ModelTab:
    """The Model tab's handlers. `handle` gives the model of a cache key (loading it through the cache)."""

    def __init__(self, handle: Callable[[CacheKey], ViTHandle], cache_size: int):
        self.handle = handle
        self.filter_figure_of = functools.lru_cache(maxsize=cache_size)(self._filter_figure)
        self.similarity_figure_of = functools.lru_cache(maxsize=4 * cache_size)(self._similarity_figure)

    @shows_errors
    def figures(self, key: CacheKey, progress=gr.Progress()):
        """The tab's two figures of the model of ``key`` (each drawn once per model), and that model's basis."""
        progress(0, desc="Drawing the patch-embedding filters and position embeddings")
        return self._figures(key)

    def _figures(self, key: CacheKey) -> tuple:
        handle = self.handle(key)
        return (Basis(model=key, model_words=shown_model(handle)), self.filter_figure_of(key),
                self.similarity_figure_of(key, handle.native_grid))

    def recompute(self, session, key: CacheKey, controls: dict) -> tuple:
        """For the page's stale-result check (`stale.Tracked.recompute`): the figures of the model now, the
        other-size figure and the files cleared, and a line saying so."""
        return (*self._figures(key), None, None,
                "*The model changed: its figures were redrawn; press **Compare at this input size** or "
                "**Download these figures** again for the others.*")

    def _filter_figure(self, key: CacheKey) -> np.ndarray:
        handle = self.handle(key)
        return model_plots.filter_pca_panel(filter_pca(handle.patch_embed_weight()), title=shown_model(handle))

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
        return model_plots.pos_similarity_panel(
            similarity, title=f"{shown_model(handle)}\nposition-embedding similarity, {grid[0]}×{grid[1]} patches "
                              f"({grid[0] * handle.patch_size[0]}×{grid[1] * handle.patch_size[1]} pixels)")

    @shows_errors
    def model_downloads(self, key: CacheKey, height: float | None, width: float | None) -> list[str]:
        """The Model tab's figures as PNG and its numbers as .npz: filter components and explained
        variance, position-embedding similarity at the model's own grid."""
        handle = self.handle(key)
        folder = download_folder()
        shown = public_name(handle.name)  # an operator's folder by its base name, as everywhere on the page
        stem = shown.replace("/", "_")
        pca = filter_pca(handle.patch_embed_weight())
        paths = [folder / f"{stem}_filters.png"]
        Image.fromarray(self.filter_figure_of(key)).save(paths[-1])
        arrays = {"filter_components": pca.components, "explained_variance_ratio": pca.explained_variance_ratio,
                  "settings_json": np.array(json.dumps({"model": shown, "weights": weights_label(handle),
                                                        "grid": list(handle.native_grid)}))}
        similarity = pos_similarity_at(handle, handle.native_grid)
        if similarity is not None:
            paths.append(folder / f"{stem}_position_similarity.png")
            Image.fromarray(self.similarity_figure_of(key, handle.native_grid)).save(paths[-1])
            arrays["pos_similarity"] = similarity
        paths.append(folder / f"{stem}_model.npz")
        np.savez_compressed(paths[-1], **arrays)
        return [str(p) for p in paths]


@dataclass(frozen=True)
class ModelView:
    """The Model tab's components."""

    tab: gr.Tab
    pca: gr.Image
    similarity: gr.Image
    height: gr.Number
    width: gr.Number
    similarity_button: gr.Button
    similarity_other: gr.Image
    download_button: gr.Button
    progress: gr.Markdown  # where writing the files shows its progress (`common.progress_slot`)
    files: gr.File
    note: gr.Markdown
    made_from: gr.State  # the `stale.Basis` (the model) of the figures shown

    @property
    def figure_outputs(self) -> list:
        """What the stale-result check clears or redraws, after ``made_from``, in `ModelTab.recompute`'s order."""
        return [self.pca, self.similarity, self.similarity_other, self.files, self.note]


def layout(settings: PageSettings) -> ModelView:
    """The tab and its figures, inside the How it sees section's ``gr.Tabs``."""
    with gr.Tab("Filters & positions", elem_id="model-tab") as tab:
        gr.Markdown("The model's own parameters, no image needed (ViT paper, Fig. 7 left and centre).")
        pca = OutputImage(label="Patch-embedding filters: principal components", elem_id="filters", **FIGURE_OUT)
        gr.Markdown("Position-embedding similarity at the model's own input size, and, resampled "
                    "as the model does it, at another input size (each full width; use the "
                    "fullscreen button to zoom):")
        similarity = OutputImage(label="Position-embedding similarity at the model's own size",
                                 elem_id="similarity", **FIGURE_OUT)
        with gr.Row(equal_height=True):
            height = gr.Number(160, label="Other input height (pixels)", precision=0, minimum=1)
            width = gr.Number(320, label="Other input width (pixels)", precision=0, minimum=1)
            similarity_button = gr.Button("Compare at this input size")
        similarity_other = OutputImage(label="Position-embedding similarity at the other size",
                                       elem_id="similarity-other", **FIGURE_OUT)
        download_button = gr.Button("Download these figures (PNG) and numbers (npz)",
                                    elem_id="model-downloads-button")
        progress = progress_slot("model-downloads-progress")
        files = gr.File(label="Model files", file_count="multiple", interactive=False, elem_id="model-files")
        note = gr.Markdown(elem_id="model-note")
        made_from = gr.State(None)
    return ModelView(tab, pca, similarity, height, width, similarity_button, similarity_other, download_button,
                     progress, files, note, made_from)


def wire(view: ModelView, ctx: TabContext) -> None:
    """The tab's events: its figures drawn when the tab or its section opens, the other-size figure and the
    downloads on their buttons, each for the page's model. They read the model's weights, so they run on the
    model-pass queue: never while the sanity checks hold re-drawn weights in the model. A refusal is a sentence
    in the tab's note (a success of a button clears it). The figures are under the page's stale-result check:
    another model redraws them while the tab is shown."""
    handlers, key, opened = ModelTab(ctx.app.handle, ctx.app.cache.max_size), ctx.key, ctx.opened(view.tab)
    gr.on(opened, says_refusals(handlers.figures, view.note, appended=gr.skip()), inputs=[key],
          outputs=[view.made_from, view.pca, view.similarity, view.note], api_name="model_figures",
          show_progress_on=[view.pca, view.similarity], **MODEL_PASS)  # on the figures, not the note
    gr.on([view.similarity_button.click], says_refusals(handlers.pos_similarity, view.note, appended=""),
          inputs=[key, view.height, view.width], outputs=[view.similarity_other, view.note], api_name="pos_similarity",
          show_progress_on=[view.similarity_other], **RAW, **MODEL_PASS)
    gr.on([view.download_button.click], says_refusals(handlers.model_downloads, view.note, appended=""),
          inputs=[key, view.height, view.width], outputs=[view.files, view.note], api_name="model_downloads",
          show_progress_on=[view.progress], **RAW, **MODEL_PASS)
    ctx.track(Tracked("model", view.made_from, tuple(view.figure_outputs), (None, None, None, None, NOTE), "model",
                      "nothing: they are drawn again when this tab opens", tab=view.tab.label,
                      recompute=handlers.recompute))
