"""The Grad-CAM tab: Grad-CAM of one block and gradient-weighted attention (Chefer et al. 2021) for the class
explained, chosen in the page's input column (by name or index, optionally against a second class: logit A
− logit B), where it is in view from every section.

It has no events of its own: its maps redraw with the other panels, and a new class redraws every panel that
depends on the class (`Inspector.set_target`, `Inspector.search_class`)."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from vit_inspect.ui.common import MAP_OUT, OutputImage
from vit_inspect.ui.context import PageSettings, TabContext


@dataclass(frozen=True)
class GradcamView:
    """The Grad-CAM tab's components (``chefer``: the gradient-weighted attention map, Chefer et al. 2021)."""

    tab: gr.Tab
    layer: gr.Slider
    panel: gr.Image
    chefer: gr.Image

    @property
    def redraw_on(self) -> list:
        """The changes the Grad-CAM map redraws on (besides the page's colour scale)."""
        return [self.layer.input]


def layout(settings: PageSettings) -> GradcamView:
    """The tab, its block slider and its maps, inside the Explain section's ``gr.Tabs``."""
    with gr.Tab("Grad-CAM", elem_id="gradcam-tab") as tab:
        gr.Markdown("Why this class, or this prompt? Grad-CAM (Selvaraju et al. 2017) of one block, and "
                    "gradient-weighted attention (Chefer et al. 2021), for the target chosen on the left: the "
                    "class under **Class to explain**, or for a CLIP-style model the text prompt.")
        with gr.Row():
            with gr.Column(scale=3, min_width=580):
                panel = OutputImage(elem_id="gradcam-map", **MAP_OUT)
            with gr.Column(scale=2, min_width=260):
                layer = gr.Slider(0, 11, value=11, step=1, label="Grad-CAM block (0-based)", elem_id="gradcam-block")
                gr.Markdown("Grad-CAM is drawn after a ReLU (its positive part), as in the paper; the "
                            "**Faithfulness** tab scores it signed and as drawn.")
        with gr.Row():
            with gr.Column(scale=3, min_width=580):
                chefer = OutputImage(elem_id="chefer-map", **MAP_OUT)
            gr.Column(scale=2, min_width=260)
    return GradcamView(tab, layer, panel, chefer)


def wire(view: GradcamView, ctx: TabContext) -> None:
    """Grad-CAM redrawn from the session's pass when its block, the colour scale or the tab changes; the
    gradient-weighted attention map beside it when the tab opens (it has no options of its own)."""
    ctx.redraw("gradcam", [*view.redraw_on, ctx.scale.input, view.tab.select])
    ctx.redraw("chefer", [view.tab.select], api_name="gradient_weighted_attention")
