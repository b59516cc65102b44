"""The Downloads tab: the current image's figures as PNG, its numbers as JSON (the command line's record plus
every setting) and NumPy `.npz` (the arrays of the pass, the maps as shown, and the same settings), written
by the page's `Inspector.downloads`. The files record what they were made from (``made_from``, down to the
settings); any change to it clears them, with a sentence (`ui.stale`)."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from vit_inspect.ui.common import RAW, progress_slot, says_refusals
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.stale import NOTE, Tracked
from vit_inspect.ui.view import download_options

PRESS = "Prepare downloads"


@dataclass(frozen=True)
class DownloadsView:
    """The Downloads tab's components (``made_from``: the `stale.Basis` of the files listed)."""

    tab: gr.Tab
    button: gr.Button
    progress: gr.Markdown  # where writing the files shows its progress (`common.progress_slot`)
    files: gr.File
    note: gr.Markdown
    made_from: gr.State


def layout(settings: PageSettings) -> DownloadsView:
    """The tab, its button and its files, inside the page's sections."""
    with gr.Tab("Downloads", elem_id="downloads-tab") as tab:
        gr.Markdown("The current image's figures as PNG, its numbers as JSON (the command line's "
                    "record plus every setting: model, weights, input geometry, layer, head, query, "
                    "rollout options, class) and NumPy `.npz` (attention, Grad-CAM, relevance, mean "
                    "distance, the maps as shown, and the same settings as `settings_json`).")
        button = gr.Button(PRESS, variant="primary", elem_id="downloads-button")
        progress = progress_slot("downloads-progress")
        note = gr.Markdown(elem_id="downloads-note")
        files = gr.File(label="Files", file_count="multiple", interactive=False, elem_id="download-files")
        made_from = gr.State(None)
    return DownloadsView(tab, button, progress, files, note, made_from)


def wire(view: DownloadsView, ctx: TabContext) -> None:
    """The tab's event: its button writes the session's downloads for the controls as they are (the page's
    `Inspector` ``app``: ``downloads``, which draws every panel of the session's image); a refusal is a sentence
    in the tab's note."""
    gr.on([view.button.click], says_refusals(ctx.app.downloads, view.note), inputs=[ctx.session, ctx.key],
          inputs_kwargs=ctx.controls,
          outputs=[view.made_from, view.files, view.note], api_name="downloads", show_progress_on=[view.progress],
          **RAW)
    ctx.track(Tracked("downloads", view.made_from, (view.files, view.note), (None, NOTE), "options", f"**{PRESS}**",
                      options=download_options))
