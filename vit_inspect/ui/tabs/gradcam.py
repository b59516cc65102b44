"""The Grad-CAM tab: Grad-CAM of one block and gradient-weighted attention (Chefer et al. 2021) for the class
to explain, found by name or index, optionally against a second class (logit A − logit B).

A new class runs one pass for it (or none, if the session has seen it) through the page's class switching
(`Inspector.set_target`, `Inspector.search_class`), which redraws every panel that depends on the class."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from vit_inspect.ui.common import MAP_OUT, MODEL_PASS, RAW, OutputImage


@dataclass(frozen=True)
class GradcamView:
    """The Grad-CAM tab's components (``relevance``: the gradient-weighted attention map)."""

    tab: gr.Tab
    class_search: gr.Textbox
    target: gr.Dropdown
    versus: gr.Textbox
    layer: gr.Slider
    panel: gr.Image
    relevance: gr.Image

    @property
    def redraw_on(self) -> list:
        """The changes the Grad-CAM map redraws on (besides the page's colour scale)."""
        return [self.layer.input]


def layout() -> GradcamView:
    """The tab, its class pickers and its maps, inside the page's ``gr.Tabs``."""
    with gr.Tab("Grad-CAM") as tab:
        with gr.Row():
            class_search = gr.Textbox(label="Find a class: name or index, then Enter",
                                      placeholder="e.g. 1 (goldfish) or beagle", elem_id="class-search",
                                      max_lines=1, scale=2)
            target = gr.Dropdown([], label="Class to explain", scale=2, elem_id="target",
                                 info="The top 5 first, then what the search found.")
            versus = gr.Textbox(label="Versus class (optional): name or index, then Enter",
                                placeholder="e.g. tabby", elem_id="versus", max_lines=1, scale=2,
                                info="Gradients of logit A − logit B: why A and not B?")
            layer = gr.Slider(0, 11, value=11, step=1, label="Grad-CAM block", scale=1)
        with gr.Row():
            panel = OutputImage(label="Grad-CAM", elem_id="gradcam-map", **MAP_OUT)
            relevance = OutputImage(label="Gradient-weighted attention (Chefer et al. 2021)",
                                    elem_id="relevance-map", **MAP_OUT)
    return GradcamView(tab, class_search, target, versus, layer, panel, relevance)


def wire(view: GradcamView, app, session: gr.State, controls: dict, class_outputs: list) -> tuple:
    """The tab's events: a class picked in the list, a versus class typed, or a class searched, each switching
    the session to that class (the page's `Inspector` ``app``) and redrawing ``class_outputs`` (the session,
    the class list, then the panels that depend on the class). Returns both events, for what follows them."""
    retargeted = gr.on([view.target.input, view.versus.submit], app.set_target,
                       inputs=[session, view.target, view.versus], inputs_kwargs=controls, outputs=class_outputs,
                       api_name="set_target", **RAW, **MODEL_PASS)
    searched = gr.on([view.class_search.submit], app.search_class, inputs=[session, view.class_search, view.versus],
                     inputs_kwargs=controls, outputs=class_outputs, api_name="search_class", **RAW, **MODEL_PASS)
    return retargeted, searched
