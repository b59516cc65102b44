"""The first view (Explain → Overview): what the model looks at, with no control touched. Three maps side by
side, each at the crop's own size with its settings fixed (`panels.first_view`): the last layer's attention
from the readout token, attention rollout over every layer, and gradient-weighted attention (Chefer et al.
2021), of the maps one pass draws the most faithful on 200 ImageNet photos (the documentation's "Which map to
trust"; AttnLRP and LeGrad, ahead of it there, cost a further pass); under each, a one-line
faithfulness verdict once the maps are scored (`plots.faithfulness.verdict`), with the button that scores
them; then the input as the model saw it and the region of the upload it is. The top-5 and the class
explained sit in the page's input column, beside every section.

The image pass fills it (`Inspector.analyze`); its Score button is a trigger of the Faithfulness tab's event
(`build_demo`), which writes the verdicts."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from vit_inspect.ui.common import DRAW_CONCURRENCY, MAP_OUT, RAW, OutputImage, progress_slot
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.panels import FIRST_VIEW

NOT_SCORED = "*Faithfulness: not scored yet (press Score faithfulness, below).*"
VERDICT_METHODS = {"first_attention": "attention", "first_rollout": "rollout", "first_chefer": "chefer"}
SCORE_LABEL = "Score faithfulness (about 30 batched forward passes per map)"


@dataclass(frozen=True)
class OverviewView:
    """The first view's components: its maps (`panels.FIRST_VIEW`), their verdicts, the Score button, the
    model's input and the upload's seen region."""

    tab: gr.Tab
    maps: tuple[gr.Image, ...]
    verdicts: tuple[gr.Markdown, ...]
    score: gr.Button
    progress: gr.Markdown  # where scoring shows its progress (`common.progress_slot`), not over the verdicts
    crop: gr.Image
    seen: gr.Image

    @property
    def not_scored(self) -> str:
        """What a verdict says before its map is scored."""
        return NOT_SCORED

    @property
    def score_label(self) -> str:
        return SCORE_LABEL


def layout(settings: PageSettings) -> OverviewView:
    """The tab, inside the Explain section's ``gr.Tabs``."""
    with gr.Tab("Overview", elem_id="overview-tab") as tab:
        maps, verdicts = [], []
        with gr.Row(equal_height=False):
            for name in FIRST_VIEW:
                with gr.Column(min_width=280):
                    maps.append(OutputImage(label=name, elem_id=name.replace("_", "-"), **MAP_OUT))
                    verdicts.append(gr.Markdown(NOT_SCORED, elem_id=f"verdict-{name.removeprefix('first_')}",
                                                elem_classes=["verdict"]))
        score = gr.Button(SCORE_LABEL, elem_id="overview-score", size="md")
        progress = progress_slot("overview-progress")
        with gr.Row():
            with gr.Column(min_width=240):
                gr.Markdown("**What the model sees** (its input)")
                crop = OutputImage(elem_id="crop", height=240, **MAP_OUT)
            with gr.Column(min_width=240):
                gr.Markdown("**Your upload**: the outlined region is what the model saw")
                seen = OutputImage(elem_id="seen-region", height=240, **MAP_OUT)
    return OverviewView(tab, tuple(maps), tuple(verdicts), score, progress, crop, seen)


def wire(view: OverviewView, ctx: TabContext) -> None:
    """The first view's maps redrawn when the colour scale changes; the image pass draws them
    (`Inspector.analyze`) and the Faithfulness tab's event writes the verdicts (its Score button is a trigger)."""
    gr.on([ctx.scale.input], ctx.app.redraw_many(FIRST_VIEW), inputs=[ctx.session], inputs_kwargs=ctx.controls,
          outputs=list(view.maps), api_name="first_view", trigger_mode="always_last", show_progress="hidden",
          concurrency_limit=DRAW_CONCURRENCY, **RAW)
