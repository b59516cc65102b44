"""The All heads tab: every head of the layer chosen under Attention, from the same query, on one colour scale
(DINO, Caron et al. 2021, Fig. 3), optionally masked to the smallest set of patches holding a chosen share of
each head's attention (`panels.heads_figure`).

It has no events of its own: its figure redraws with the other panels (`build_demo`)."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from vit_inspect.ui.common import FIGURE_OUT, OutputImage
from vit_inspect.ui.context import PageSettings, TabContext


@dataclass(frozen=True)
class AllHeadsView:
    """The All heads tab's components."""

    tab: gr.Tab
    threshold_on: gr.Checkbox
    threshold: gr.Slider
    panel: gr.Image

    @property
    def redraw_on(self) -> list:
        """The changes the figure redraws on (besides the page's colour scale): the tab opening, the mask."""
        return [self.tab.select, self.threshold_on.input, self.threshold.release]


def layout(settings: PageSettings) -> AllHeadsView:
    """The tab, its mask controls and its figure, inside the page's ``gr.Tabs``."""
    with gr.Tab("All heads", elem_id="all-heads-tab") as tab:
        gr.Markdown("Every head of the layer chosen under **Explain → Attention**, from the same query (the "
                    "title prints both), on "
                    "one colour scale (DINO, Caron et al. 2021, Fig. 3). Each title gives the share "
                    "of the head's attention that goes to the prefix tokens, which the maps leave out.")
        with gr.Row():
            threshold_on = gr.Checkbox(False, label="Threshold mask", elem_id="threshold-on",
                                       info="Keep bright only the smallest set of patches holding "
                                            "the chosen share of each head's attention.")
            threshold = gr.Slider(10, 100, value=60, step=5, label="Attention mass kept (%)", elem_id="threshold")
        panel = OutputImage(label="All heads", elem_id="heads-grid", **FIGURE_OUT)
    return AllHeadsView(tab, threshold_on, threshold, panel)


def wire(view: AllHeadsView, ctx: TabContext) -> None:
    """Every head redrawn from the session's pass when its options change, the tab or its section opens, or
    the colour scale changes."""
    ctx.redraw("heads", [*view.redraw_on, *ctx.opened(view.tab)[1:], ctx.scale.input])
