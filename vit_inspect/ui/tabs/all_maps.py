"""The All maps tab: every map of the image side by side, each with the options set in its own tab, and the
toggle that adds LeGrad and AttnLRP to the session's passes (`ui.relevance`).

Its figure redraws with the other panels (`build_demo`); the toggle is its own event."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from vit_inspect.ui.common import FIGURE_OUT, MODEL_PASS, RAW, OutputImage, says_refusals
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.relevance import toggle_label


@dataclass(frozen=True)
class AllMapsView:
    """The All maps tab's components."""

    tab: gr.Tab
    relevance_toggle: gr.Checkbox
    panel: gr.Image

    @property
    def redraw_on(self) -> list:
        """The changes the figure redraws on: the tab opening (it shows every other tab's choices)."""
        return [self.tab.select]


def layout(settings: PageSettings) -> AllMapsView:
    """The tab, its toggle and its figure, inside the page's ``gr.Tabs``."""
    with gr.Tab("All maps", elem_id="all-maps-tab") as tab:
        gr.Markdown("Every map on the same input, each with the options set in its own tab: "
                    "layer, head and query under **Attention**, method and layers under **Rollout**, "
                    "class and block under **Grad-CAM**.")
        relevance_toggle = gr.Checkbox(False, label=toggle_label(), elem_id="relevance-toggle",
                                       info="LeGrad and AttnLRP for this image and class, and for "
                                            "later passes while ticked. Off, a pass is one forward "
                                            "and one backward.")
        panel = OutputImage(label="All maps", elem_id="compare-maps", **FIGURE_OUT)
    return AllMapsView(tab, relevance_toggle, panel)


def wire(view: AllMapsView, ctx: TabContext) -> None:
    """The tab's events: the figure redrawn when the tab opens; the toggle adds LeGrad and AttnLRP to the pass shown, or leaves them out of later
    passes (the page's `Inspector` ``app``: ``set_relevance``), and redraws the figure; a refusal is a sentence
    in the page's ``notice`` line."""
    ctx.redraw("compare", view.redraw_on)
    gr.on([view.relevance_toggle.input], says_refusals(ctx.app.set_relevance, ctx.notice, appended=""),
          inputs=[ctx.session, view.relevance_toggle], inputs_kwargs=ctx.controls,
          outputs=[ctx.session, view.panel, ctx.notice],
          api_name="relevance", show_progress_on=[view.panel], **RAW, **MODEL_PASS)  # on the maps, not the notice
