"""The Downloads tab: the current image's figures as PNG, its numbers as JSON (the command line's record plus
every setting) and NumPy `.npz` (the arrays of the pass, the maps as shown, and the same settings), written
by the page's `Inspector.downloads`."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from vit_inspect.ui.common import RAW


@dataclass(frozen=True)
class DownloadsView:
    """The Downloads tab's components."""

    tab: gr.Tab
    button: gr.Button
    files: gr.File


def layout() -> DownloadsView:
    """The tab, its button and its files, inside the page's ``gr.Tabs``."""
    with gr.Tab("Downloads") as tab:
        gr.Markdown("The current image's figures as PNG, its numbers as JSON (the command line's "
                    "record plus every setting: model, weights, input geometry, layer, head, query, "
                    "rollout options, class) and NumPy `.npz` (attention, Grad-CAM, relevance, mean "
                    "distance, the maps as shown, and the same settings as `settings_json`).")
        button = gr.Button("Prepare downloads", variant="primary", elem_id="downloads-button")
        files = gr.File(label="Files", file_count="multiple", interactive=False, elem_id="download-files")
    return DownloadsView(tab, button, files)


def wire(view: DownloadsView, app, session: gr.State, controls: dict) -> None:
    """The tab's event: its button writes the session's downloads for the controls as they are (the page's
    `Inspector` ``app``: ``downloads``, which draws every panel of the session's image)."""
    gr.on([view.button.click], app.downloads, inputs=[session], inputs_kwargs=controls,
          outputs=[view.files], api_name="downloads", **RAW)
