"""The Concepts tab: which parts the model sees in this image, by deep feature factorisation of one block's patch
tokens (Collins et al. 2018; `passes.concepts.image_concepts`), each concept's heatmap with its colour bar, its
area, its share of the class logit and the classes it reads as.

The figure is drawn from the session's pass: the tokens of every block are kept in the result where they are
small (`passes.block_tokens`), so a new block or k factorises them again without the model (a larger model's
result keeps none, and each draw runs one forward without gradients). It records what it was drawn from
(``made_from``: model, image and class); another image, model or class clears it through the page's
stale-result check (`ui.stale`), and it is drawn again at once while the tab is shown (`ctx.after_check`)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import gradio as gr

from vit_inspect.core.errors import InputError
from vit_inspect.passes.concepts import DEFAULT_CONCEPTS, MAX_CONCEPTS, ImageConcepts, image_concepts
from vit_inspect.plots import maps as map_plots
from vit_inspect.plots.concepts import CONCEPT_UNIT, concept_caption, concepts_title
from vit_inspect.ui.common import FIGURE_OUT, MODEL_PASS, RAW, OutputImage, says_refusals, shows_errors
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.model_cache import CacheKey
from vit_inspect.ui.panels import mosaic_columns
from vit_inspect.ui.stale import NOTE, Basis, Tracked
from vit_inspect.ui.untrusted import finite_int

LABEL = "Concepts"  # the tab's label, as the page records the view in sight
SEED = 0  # the NMF's random initialisation, named in the figure's title
SKIPPED = (gr.skip(),) * 4  # made_from, figure, note, block slider


def default_block(depth: int) -> int:
    """The block the tab opens on: the middle of the model, where DeiT-Ti's concepts are object parts (the later
    blocks' may be a few high-norm patches: docs/concepts.md)."""
    return depth // 2 - 1 if depth > 1 else 0


def concept_note(concepts: ImageConcepts, image_words: str) -> str:
    """The line under the figure: what was factorised, and how to read the numbers."""
    logits = ("" if concepts.target is None else
              " The logit is the head's reading of the concept alone (every token it reads set to the concept), "
              "not its share of the model's own logit: the area is the safer number.")
    return (f"{concepts.k} concepts of {image_words} at the output of block {concepts.layer} (seed {concepts.seed}), "
            f"{100 * concepts.error:.0f} % of the shifted tokens left out, {concepts.iterations} NMF iterations. "
            f"Each heatmap has its own colour bar: it compares patches within one concept only.{logits}")


class ConceptsTab:
    """The tab's handlers. ``app`` is the page's `Inspector` (the model cache)."""

    def __init__(self, app):
        self.app = app

    def concepts(self, session, block: object, k: object) -> ImageConcepts:
        """The session's image's concepts for the raw block and k values (each clamped to the model's range)."""
        result = session.result
        handle = self.app.handle(session.model)
        layer = finite_int(block, "The block", 0, result.depth - 1, default=default_block(result.depth))
        most = min(MAX_CONCEPTS, result.layout.num_patches, handle.embed_dim)
        k = finite_int(k, "The number of concepts", 1, most, default=DEFAULT_CONCEPTS)
        return image_concepts(handle, result, k, layer, seed=SEED)

    @shows_errors
    def draw(self, session, key: CacheKey | None, block: object, k: object, progress=gr.Progress()):
        if session is None:
            raise InputError("Analyse an image first; its concepts are found in its own tokens.")
        progress(0, desc="Factorising the block's tokens")
        concepts = self.concepts(session, block, k)
        handle = self.app.handle(session.model)
        result = session.result
        label = handle.label
        shown = replace(concepts, model_name=session.model_label)  # the model as every caption names it
        picture = map_plots.maps_panel(
            result.rgb, {concept_caption(concepts, j, label): heatmap for j, heatmap in enumerate(concepts.heatmaps)},
            units={concept_caption(concepts, j, label): CONCEPT_UNIT for j in range(concepts.k)},
            title=concepts_title(shown, session.image_words, label), columns=mosaic_columns(result))
        slider = gr.update(maximum=result.depth - 1, value=concepts.layer)  # fitted to the model, the block drawn
        return Basis.of(session, key or session.model), picture, concept_note(concepts, session.image_words), slider

    def draw_if_shown(self, session, key: CacheKey | None, shown: object, block: object, k: object,
                      made_from: Basis | None, progress=gr.Progress()):
        """After the page's stale-result check: the figure for the page as it now is, when the tab is shown and
        what it shows was drawn for another model, image or class (or nothing is shown); else nothing. (A new
        block or k is drawn by its own event.)"""
        if shown != LABEL or session is None:
            return SKIPPED
        now = Basis.of(session, key or session.model)
        if made_from is not None and made_from.key("class") == now.key("class"):
            return SKIPPED
        return self.draw(session, key, block, k, progress=progress)


@dataclass(frozen=True)
class ConceptsView:
    """The Concepts tab's components."""

    tab: gr.Tab
    block: gr.Slider
    k: gr.Slider
    figure: gr.Image
    note: gr.Markdown
    made_from: gr.State  # the `stale.Basis` (model, image, class) of the figure shown


def layout(settings: PageSettings) -> ConceptsView:
    """The tab, its two controls and its figure, inside the How it sees section's ``gr.Tabs``."""
    with gr.Tab(LABEL, elem_id="concepts-tab") as tab:
        gr.Markdown("Which parts does the model see in this image? One block's patch tokens are split into k "
                    "non-negative parts (deep feature factorisation, Collins et al. 2018), each shown where it lies. "
                    "Under each: its area (its share of the factorisation), the logit of the class when the head "
                    "reads the concept alone, and the classes it reads as. No gradient, no new pass for DeiT-sized "
                    "models: every block's tokens come with the image's pass.")
        with gr.Row():
            block = gr.Slider(0, 11, value=5, step=1, label="Block (0-based; its output tokens)",
                              elem_id="concepts-block")
            k = gr.Slider(1, MAX_CONCEPTS, value=DEFAULT_CONCEPTS, step=1, label="Concepts (k)", elem_id="concepts-k")
        figure = OutputImage(label="Concepts of this image", elem_id="concepts-figure", **FIGURE_OUT)
        note = gr.Markdown(elem_id="concepts-note")
        made_from = gr.State(None)
    return ConceptsView(tab, block, k, figure, note, made_from)


def wire(view: ConceptsView, ctx: TabContext) -> None:
    """The tab's events: the figure drawn when the tab or its section opens and when the block or k is let go,
    on the model-pass queue (the concepts' logits read the head, which the sanity checks re-draw while they run);
    a refusal is a sentence in the note. The figure is under the page's stale-result check, and drawn again
    after each check while the tab is shown."""
    handlers = ConceptsTab(ctx.app)
    inputs = [ctx.session, ctx.key, view.block, view.k]
    outputs = [view.made_from, view.figure, view.note, view.block]
    gr.on([*ctx.opened(view.tab), view.block.release, view.k.release],
          says_refusals(handlers.draw, view.note), inputs=inputs, outputs=outputs, api_name="concepts",
          show_progress_on=[view.figure], trigger_mode="always_last", **RAW, **MODEL_PASS)
    ctx.track(Tracked("concepts", view.made_from, (view.figure, view.note), (None, NOTE), "class",
                      "nothing: they are drawn again when this tab opens"))
    ctx.after_check(says_refusals(handlers.draw_if_shown, view.note),
                    [ctx.session, ctx.key, ctx.shown_tab, view.block, view.k, view.made_from], outputs,
                    "concepts_redrawn")

