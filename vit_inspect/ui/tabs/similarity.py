"""The Patch similarity tab: click a patch of the image and see the cosine similarity of its token to every patch of
the same image and, optionally, of a second image, at any block (the DINO viewers' patch matching;
`passes.concepts.patch_similarity`), on the fixed range [-1, 1].

The maps are drawn from the session's pass (every block's tokens come with it where they are small,
`passes.block_tokens`). A second image gets one pass of its own without gradients, through the same model and
input geometry as the image, kept in the byte-bounded session store and run again when the model or geometry
changes, so its tokens are always the page's model's. What is shown records its model and image
(``made_from``); the page's stale-result check clears it, and it is drawn again at once while the tab is shown."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import numpy as np

from vit_inspect.core.errors import InputError
from vit_inspect.passes.concepts import patch_similarity
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.plots import maps as map_plots
from vit_inspect.plots.concepts import SIMILARITY_CMAP, SIMILARITY_UNIT
from vit_inspect.ui.common import MAP_OUT, MODEL_PASS, RAW, OutputImage, says_refusals, shows_errors, upload_source
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.model_cache import CacheKey
from vit_inspect.ui.panels import main_scale
from vit_inspect.ui.session_store import Slot
from vit_inspect.ui.stale import NOTE, Basis, Tracked
from vit_inspect.ui.untrusted import finite_float, finite_int, plain_markdown

LABEL = "Patch similarity"  # the tab's label, as the page records the view in sight
MAP_ID = "similarity-map"  # the clickable map of the image itself
SKIPPED = (gr.skip(),) * 6  # made_from, the two maps, the note, row, column


@dataclass(frozen=True, eq=False)
class Other:
    """The second image (held in gr.State): the upload, and its pass kept in the store for one model and geometry."""

    source: str | bytes  # the upload (a file in Gradio's folder, or its bytes)
    name: str  # its file name, for captions
    slot: Slot  # {(model key, geometry): ImageAnalysis}: its pass without gradients, once drawn


@dataclass(frozen=True)
class Similarity:
    """One query's maps: this image's and the second image's (None without one), with what they show."""

    layer: int  # the block whose output tokens are compared
    patch: tuple[int, int]  # the query patch (row, column)
    own: np.ndarray  # (grid_h, grid_w) cosine similarity over this image
    other: np.ndarray | None  # (grid_h', grid_w') over the second image
    other_result: ImageAnalysis | None  # the second image's pass


class SimilarityTab:
    """The tab's handlers. ``app`` is the page's `Inspector` (model cache, passes, store, image limits)."""

    def __init__(self, app):
        self.app = app

    def other_pass(self, session, other: Other | None) -> ImageAnalysis | None:
        """The second image's pass for the session's model and geometry: the one kept, or one forward without
        gradients kept in its place."""
        if other is None:
            return None
        wanted = (session.model, session.geometry)
        kept = other.slot.get()
        if wanted not in kept:
            handle = self.app.handle(session.model)
            result = self.app.run_pass(handle, other.source, None, self.app.options.replace(
                geometry=session.geometry, gradients=False, relevance=False))
            kept = {wanted: result}
            other.slot.set(kept, result.nbytes())
        return kept[wanted]

    def similarity(self, session, other: Other | None, block: object, row: object, col: object) -> Similarity:
        """The maps for the raw block, row and column values (each clamped to the model's range and grid)."""
        result = session.result
        layout = result.layout
        layer = finite_int(block, "The block", 0, result.depth - 1, default=result.depth // 2)
        patch = (finite_int(row, "The patch row", 0, layout.grid_h - 1, default=layout.grid_h // 2),
                 finite_int(col, "The patch column", 0, layout.grid_w - 1, default=layout.grid_w // 2))
        second = self.other_pass(session, other)
        own, theirs = patch_similarity(self.app.handle(session.model), result, patch, layer, second)
        return Similarity(layer, patch, own, theirs, second)

    @shows_errors
    def draw(self, session, key: CacheKey | None, other: Other | None, block: object, row: object, col: object,
             progress=gr.Progress()):
        if session is None:
            raise InputError("Analyse an image first; then click one of its patches.")
        progress(0, desc="Comparing the patch's token with every patch")
        found = self.similarity(session, other, block, row, col)
        result = session.result
        row, col = found.patch
        where = f"block {found.layer} output · patch (row {row}, column {col})"
        own = map_plots.map_panel(
            result.rgb, found.own, f"{session.model_label} · {session.image_words} · {where}: cosine similarity of "
                                   f"its token (outlined) to every patch of this image · colour −1 to 1",
            SIMILARITY_UNIT, vmin=-1.0, vmax=1.0, marker=found.patch, cmap=SIMILARITY_CMAP, scale=main_scale(result))
        theirs = None
        if found.other is not None:
            second = found.other_result
            theirs = map_plots.map_panel(
                second.rgb, found.other, f"{session.model_label} · {other.name} "
                                         f"({session.geometry.describe(second.layout.input_size)}) · similarity to "
                                         f"{where} of {session.image_words} · colour −1 to 1",
                SIMILARITY_UNIT, vmin=-1.0, vmax=1.0, cmap=SIMILARITY_CMAP, scale=main_scale(second))
        note = (f"Patch (row {row}, column {col}) of {plain_markdown(session.image_words)} at block {found.layer}: "
                f"similarity 1 on itself; the most similar other patch of this image is at "
                f"{self._most_similar(found)}.")
        return Basis.of(session, key or session.model), own, theirs, note, row, col, other

    @staticmethod
    def _most_similar(found: Similarity) -> str:
        values = found.own.copy()
        values[found.patch] = -np.inf
        r, c = np.unravel_index(int(np.argmax(values)), values.shape)
        return f"(row {r}, column {c}), {found.own[r, c]:.2f}" if np.isfinite(values[r, c]) else "none (one patch)"

    @shows_errors
    def pick(self, evt: gr.SelectData, session, key: CacheKey | None, other: Other | None, block: object,
             progress=gr.Progress()):
        """A click on the image's map (x, y in the map's pixels): that patch becomes the query; a click on the
        colour bar or the caption does nothing."""
        if session is None or evt.index is None:
            return (*SKIPPED, gr.skip())
        if not isinstance(evt.index, (list, tuple)) or len(evt.index) < 2:
            raise InputError("A click gives the (x, y) pixel it landed on; this one gave none.")
        result = session.result
        height, width = result.layout.input_size
        scale = main_scale(result)
        x = finite_float(evt.index[0], "The clicked x", -1e6, 1e6) / scale
        y = finite_float(evt.index[1], "The clicked y", -1e6, 1e6) / scale
        if not (0 <= x < width and 0 <= y < height):
            return (*SKIPPED, gr.skip())
        row, col = result.layout.patch_at(y, x)
        return self.draw(session, key, other, block, row, col, progress=progress)

    @shows_errors
    def upload(self, image: object, session, key: CacheKey | None, block: object, row: object, col: object,
               progress=gr.Progress()):
        """A second image (None: removed), checked as the page's own upload is, then the maps with it."""
        upload = upload_source(image, self.app.config.limits.max_bytes)
        other = None if upload is None else Other(upload[0], plain_markdown(upload[1]), self.app.store.put({}, 0))
        if session is None:
            return (*SKIPPED, other)
        return self.draw(session, key, other, block, row, col, progress=progress)

    def draw_on_open(self, session, key: CacheKey | None, other: Other | None, block: object, row: object,
                     col: object, made_from: Basis | None, progress=gr.Progress()):
        """When the tab or its section opens: the maps, unless those shown were drawn for this model and image.
        ``made_from`` is the server's own state when the event runs, and the row and column are the browser's when
        it was sent: a click on the map that ran between them is not drawn over with the patch from before it."""
        if session is not None and made_from is not None and \
                made_from.key("image") == Basis.of(session, key or session.model).key("image"):
            return (*SKIPPED, gr.skip())
        return self.draw(session, key, other, block, row, col, progress=progress)

    def draw_if_shown(self, session, key: CacheKey | None, shown: object, other: Other | None, block: object,
                      row: object, col: object, made_from: Basis | None, progress=gr.Progress()):
        """After the page's stale-result check: the maps for the page as it now is, when the tab is shown and they
        were drawn for another model or image (or none are shown); else nothing."""
        if shown != LABEL or session is None:
            return (*SKIPPED, gr.skip())
        if made_from is not None and made_from.key("image") == Basis.of(session, key or session.model).key("image"):
            return (*SKIPPED, gr.skip())
        return self.draw(session, key, other, block, row, col, progress=progress)


@dataclass(frozen=True)
class SimilarityView:
    """The Patch similarity tab's components."""

    tab: gr.Tab
    panel: gr.Image  # this image's map: click a patch
    other_panel: gr.Image  # the second image's map
    block: gr.Slider
    row: gr.Number
    col: gr.Number
    other_image: gr.Image  # the optional second image
    note: gr.Markdown
    made_from: gr.State  # the `stale.Basis` (model, image) of the maps shown
    other: gr.State  # the second image (`Other`)

    @property
    def outputs(self) -> list:
        """What a draw writes, in `SimilarityTab.draw`'s order."""
        return [self.made_from, self.panel, self.other_panel, self.note, self.row, self.col, self.other]


def layout(settings: PageSettings) -> SimilarityView:
    """The tab, its maps and controls, inside the How it sees section's ``gr.Tabs``."""
    with gr.Tab(LABEL, elem_id="similarity-tab") as tab:
        gr.Markdown("Which patches does the model treat alike? **Click a patch** of the image (or type its row and "
                    "column): each patch is coloured by the cosine similarity of its token to the clicked patch's "
                    "token at the chosen block, red alike, blue opposite. Add a second image to find the patch's "
                    "match there (one more pass, without gradients, through the same model).")
        with gr.Row():
            with gr.Column(scale=3, min_width=580):
                panel = OutputImage(elem_id=MAP_ID, **MAP_OUT)
            with gr.Column(scale=2, min_width=260):
                block = gr.Slider(0, 11, value=5, step=1, label="Block (0-based; its output tokens)",
                                  elem_id="similarity-block")
                with gr.Row():
                    row = gr.Number(7, label="Patch row", precision=0, minimum=0, elem_id="similarity-row")
                    col = gr.Number(7, label="Patch column", precision=0, minimum=0, elem_id="similarity-col")
                other_image = gr.Image(label="Second image (optional)", type="filepath", sources=["upload"],
                                       height=200, elem_id="similarity-other-image")
        other_panel = OutputImage(elem_id="similarity-other-map", **MAP_OUT)
        note = gr.Markdown(elem_id="similarity-note")
        made_from = gr.State(None)
        other = gr.State(None)
    return SimilarityView(tab, panel, other_panel, block, row, col, other_image, note, made_from, other)


def wire(view: SimilarityView, ctx: TabContext) -> None:
    """The tab's events, each on the model-pass queue (a second image's pass, and a model without kept tokens, run
    the model): the maps drawn when the tab or its section opens, when the block is let go or a row or column
    typed, on a click on the image's map, and with a second image when one is uploaded; a refusal is a sentence
    in the note. The maps are under the page's stale-result check, and drawn again after each check while the
    tab is shown."""
    handlers, session, key = SimilarityTab(ctx.app), ctx.session, ctx.key
    settings = [view.block, view.row, view.col]
    gr.on(ctx.opened(view.tab), says_refusals(handlers.draw_on_open, view.note),
          inputs=[session, key, view.other, *settings, view.made_from], outputs=view.outputs,
          api_name="patch_similarity_opened", show_progress_on=[view.panel], trigger_mode="always_last", **RAW,
          **MODEL_PASS)
    gr.on([view.block.release, view.row.submit, view.col.submit],
          says_refusals(handlers.draw, view.note), inputs=[session, key, view.other, *settings],
          outputs=view.outputs, api_name="patch_similarity", show_progress_on=[view.panel],
          trigger_mode="always_last", **RAW, **MODEL_PASS)
    gr.on([view.panel.select], says_refusals(handlers.pick, view.note),
          inputs=[session, key, view.other, view.block], outputs=view.outputs, api_name="pick_similar_patch",
          show_progress="hidden", **RAW, **MODEL_PASS)
    gr.on([view.other_image.change], says_refusals(handlers.upload, view.note),
          inputs=[view.other_image, session, key, *settings], outputs=view.outputs, api_name="similarity_other_image",
          show_progress_on=[view.other_panel], **RAW, **MODEL_PASS)
    ctx.track(Tracked("patch_similarity", view.made_from, (view.panel, view.other_panel, view.note),
                      (None, None, NOTE), "image", "nothing: they are drawn again when this tab opens"))
    ctx.after_check(says_refusals(handlers.draw_if_shown, view.note),
                    [session, key, ctx.shown_tab, view.other, *settings, view.made_from], view.outputs,
                    "patch_similarity_redrawn")
