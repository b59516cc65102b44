"""The Attention distance tab: mean attention distance per head (Dosovitskiy et al. 2021, Fig. 7 right), how
far in pixels each head looks, for this image and averaged over images the user uploads.

This image's scatter redraws with the other panels (`build_demo`); the average is its own event, one pass
per image without gradients (`jobs.distance.dataset_attention_distance`), recording the model it used
(``made_from``): another model clears it (`ui.stale`)."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from vit_inspect.core.errors import InputError
from vit_inspect.jobs.distance import dataset_attention_distance
from vit_inspect.plots import distance as distance_plots
from vit_inspect.ui.common import (FIGURE_OUT, MODEL_PASS, RAW, OutputImage, says_refusals, shown_model, shows_errors,
                                   upload_folders)
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.model_cache import CacheKey
from vit_inspect.ui.stale import NOTE, Basis, Tracked
from vit_inspect.ui.untrusted import client_files, redact_paths

MAX_DATASET_IMAGES = 64  # images per attention-distance average


@dataclass(frozen=True)
class DistanceView:
    """The Attention distance tab's components."""

    tab: gr.Tab
    panel: gr.Image
    dataset_plot: gr.Image
    dataset_files: gr.File
    dataset_button: gr.Button
    dataset_note: gr.Markdown
    made_from: gr.State  # the `stale.Basis` (the model) of the average shown

    @property
    def redraw_on(self) -> list:
        """The changes this image's scatter redraws on: the tab opening (its red dot is the Attention tab's head)."""
        return [self.tab.select]


def layout(settings: PageSettings) -> DistanceView:
    """The tab, its two plots and the images to average, inside the How it sees section's ``gr.Tabs``."""
    with gr.Tab("Attention distance", elem_id="distance-tab") as tab:
        gr.Markdown("Mean attention distance per head (ViT paper, Fig. 7 right): how far, in pixels, "
                    "each head looks. The red dot is the layer and head chosen under **Explain → Attention** "
                    "(the legend prints them).")
        with gr.Row():  # side by side where both fit at their own size, else one under the other
            with gr.Column(min_width=540):
                panel = OutputImage(label="This image", elem_id="distance-plot", **FIGURE_OUT)
            with gr.Column(min_width=540):
                dataset_plot = OutputImage(label="Averaged over your images", elem_id="dataset-plot", **FIGURE_OUT)
        with gr.Row():
            dataset_files = gr.File(label=f"Images to average (up to {MAX_DATASET_IMAGES})",
                                    file_count="multiple", file_types=["image"], type="filepath",
                                    height=120, scale=3, elem_id="dataset-files")
            dataset_button = gr.Button("Average over these images", scale=1)
        dataset_note = gr.Markdown(elem_id="dataset-note")
        made_from = gr.State(None)
    return DistanceView(tab, panel, dataset_plot, dataset_files, dataset_button, dataset_note, made_from)


class DistanceTab:
    """The tab's handler. ``app`` is the page's `Inspector` (model cache, image limits)."""

    def __init__(self, app):
        self.app = app

    @shows_errors
    def dataset_distance(self, files: object, key: CacheKey, progress=gr.Progress()):
        uploads = client_files(files, upload_folders(), self.app.config.limits.max_bytes, MAX_DATASET_IMAGES)
        if not uploads:
            raise InputError("Upload a few images first (they are averaged; the more, the steadier).")
        if any(isinstance(source, bytes) for source, _ in uploads):
            raise InputError("Upload the images to average as files.")
        files = [source for source, _ in uploads]
        progress(0, desc="Loading the model")
        handle = self.app.handle(key)
        stats = dataset_attention_distance(
            handle, files, limits=self.app.config.limits,
            progress=lambda done, total: progress((done, total), unit="images"))
        image = distance_plots.attention_distance_panel(  # PIL: 2 ms, against 150 ms for a matplotlib figure (bench_upload 6l)
            stats.distances, image_width=handle.input_size[1],
            title=f"{shown_model(handle)} · mean over {stats.num_images} images", selectable=False).background
        note = f"Averaged over {stats.num_images} image(s) with {shown_model(handle)}."
        if stats.skipped:
            note += " Skipped: " + redact_paths("; ".join(f"{name}: {reason}" for name, reason in stats.skipped))
        return Basis(model=key, model_words=shown_model(handle)), image, note


def wire(view: DistanceView, ctx: TabContext) -> None:
    """The tab's events: this image's scatter redrawn from the session's pass when the tab or its section
    opens; its button averages the uploaded images' attention distance with the page's model, a refusal a
    sentence in the note under it, the average under the page's stale-result check."""
    handlers, key = DistanceTab(ctx.app), ctx.key
    ctx.redraw("distance", [*view.redraw_on, *ctx.opened(view.tab)[1:]])
    gr.on([view.dataset_button.click], says_refusals(handlers.dataset_distance, view.dataset_note),
          inputs=[view.dataset_files, key],
          outputs=[view.made_from, view.dataset_plot, view.dataset_note], api_name="dataset_distance",
          show_progress_on=[view.dataset_plot], **RAW, **MODEL_PASS)  # on the plot it draws, not over the note
    ctx.track(Tracked("dataset_distance", view.made_from, (view.dataset_plot, view.dataset_note), (None, NOTE),
                      "model", "**Average over these images**"))
