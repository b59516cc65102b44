"""The Rollout tab: attention rollout (Abnar & Zuidema 2020) or gradient rollout for the class (vit-explain),
with its head fusion, discard ratio and layer range.

Its map redraws with the other panels (`build_demo`, `Inspector.redraw_rollout`, which swaps a backward
range on the sliders)."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from vit_inspect.ui.common import DRAW_CONCURRENCY, MAP_OUT, RAW, OutputImage
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.view import DISCARDS, HEAD_FUSIONS, ROLLOUTS


@dataclass(frozen=True)
class RolloutView:
    """The Rollout tab's components."""

    tab: gr.Tab
    panel: gr.Image
    method: gr.Radio
    head_fusion: gr.Radio
    discard_ratio: gr.Slider
    discard: gr.Radio
    first_layer: gr.Slider
    last_layer: gr.Slider

    @property
    def redraw_on(self) -> list:
        """The changes the map redraws on (besides the page's colour scale)."""
        return [self.head_fusion.input, self.discard_ratio.input, self.first_layer.input, self.last_layer.input,
                self.method.input, self.discard.input]


def layout(settings: PageSettings) -> RolloutView:
    """The tab, its map and its options, inside the Explain section's ``gr.Tabs``."""
    with gr.Tab("Rollout", elem_id="rollout-tab") as tab:
        gr.Markdown("Attention carried through the layers (Abnar & Zuidema 2020), or weighed by its gradient for "
                    "the class explained (vit-explain). A backward range (**From** after **To**) is swapped, on the "
                    "sliders and in the caption, as **Faithfulness** swaps it.")
        with gr.Row():
            with gr.Column(scale=3, min_width=580):
                panel = OutputImage(elem_id="rollout-map", **MAP_OUT)
            with gr.Column(scale=2, min_width=260):
                method = gr.Radio(list(ROLLOUTS), value=list(ROLLOUTS)[0], label="Method", elem_id="rollout-method",
                                  info="Gradient rollout weighs each layer's attention by "
                                       "its gradient for the class explained (left).")
                head_fusion = gr.Radio(list(HEAD_FUSIONS), value="mean", label="Head fusion",
                                       info="Attention rollout only; gradient rollout averages.")
                discard_ratio = gr.Slider(0.0, 0.95, value=0.0, step=0.05, label="Discard ratio",
                                          info="Fraction of the lowest attention dropped before "
                                               "rolling out.", elem_id="discard-slider")
                discard = gr.Radio(list(DISCARDS), value=list(DISCARDS)[0], label="Discard where",
                                   elem_id="discard-where")
                first_layer = gr.Slider(0, 11, value=0, step=1, label="From layer (0-based)", elem_id="first-layer")
                last_layer = gr.Slider(0, 11, value=11, step=1, label="To layer (included)", elem_id="last-layer")
    return RolloutView(tab, panel, method, head_fusion, discard_ratio, discard, first_layer, last_layer)


def wire(view: RolloutView, ctx: TabContext) -> None:
    """The map redrawn from the session's pass when an option, the colour scale or the tab changes; the layer
    range comes back as drawn (a backward range swapped)."""
    gr.on([*view.redraw_on, ctx.scale.input, view.tab.select], ctx.app.redraw_rollout, inputs=[ctx.session],
          inputs_kwargs=ctx.controls, outputs=[view.panel, view.first_layer, view.last_layer], api_name="rollout",
          trigger_mode="always_last", show_progress="hidden", concurrency_limit=DRAW_CONCURRENCY, **RAW)
