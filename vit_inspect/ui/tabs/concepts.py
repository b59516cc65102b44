"""The Concepts tab: which parts the model sees in this image, by deep feature factorisation of one block's patch
tokens (Collins et al. 2018; `passes.concepts.image_concepts`), each concept's heatmap with its colour bar, its
area, its share of the class logit and the classes it reads as.

The figure is drawn from the session's pass: the tokens of every block are kept in the result where they are
small (`passes.block_tokens`), so a new block or k factorises them again without the model (a larger model's
result keeps none, and each draw runs one forward without gradients). It records what it was drawn from
(``made_from``: model, image and class); another image, model or class clears it through the page's
stale-result check (`ui.stale`), and it is drawn again at once while the tab is shown (`ctx.after_check`).

Below it, on demand, the concepts of a class (CRAFT, Fel et al. 2023; `studies.class_concepts`) over images the
user uploads (and the example photos if ticked), with a progress bar and the app's one Cancel (`ui.cancel`):
their galleries by importance, kept in the byte-bounded store and cleared when the model changes, and, on a
button, their heatmaps on the page's image, cleared when the image or model changes."""
from __future__ import annotations

from dataclasses import dataclass, replace

import gradio as gr
import numpy as np

from vit_inspect.core.errors import Cancelled, InputError
from vit_inspect.core.images import load_image
from vit_inspect.passes.concepts import DEFAULT_CONCEPTS, MAX_CONCEPTS, ImageConcepts, image_concepts
from vit_inspect.plots import maps as map_plots
from vit_inspect.plots.concepts import CONCEPT_UNIT, concept_caption, concepts_title, gallery_panel
from vit_inspect.studies import class_concepts as craft
from vit_inspect.ui.cancel import Cancels
from vit_inspect.ui.classes import find_class
from vit_inspect.ui.common import (FIGURE_OUT, MODEL_PASS, RAW, OutputImage, progress_slot, says_refusals,
                                   shown_model, shows_errors, upload_folders)
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.inputs import EXAMPLE_PATHS
from vit_inspect.ui.model_cache import CacheKey
from vit_inspect.ui.panels import mosaic_columns
from vit_inspect.ui.session_store import Slot
from vit_inspect.ui.stale import NOTE, Basis, Tracked
from vit_inspect.ui.untrusted import client_files, finite_int, flag, plain_markdown, text
from vit_inspect.ui.zerogpu import gpu_pass

LABEL = "Concepts"  # the tab's label, as the page records the view in sight
SEED = 0  # the NMF's random initialisation, named in the figure's title
SKIPPED = (gr.skip(),) * 4  # made_from, figure, note, block slider
MAX_CLASS_IMAGES = 50  # images of one class per run (50 take about a minute on two CPU cores: docs/concepts.md)
CLASS_CONCEPTS = 8  # k of a class run by default (the galleries of 8 concepts fit one screen)
CLASS_PRESS = "**Find the class's concepts**"
MAPS_PRESS = "**Map them on this image**"


@dataclass(frozen=True, eq=False)
class ClassRun:
    """One run of class concepts (held in gr.State): what it was computed from, and its result in the store."""

    basis: Basis  # the model (the images and class are the run's own inputs, named in ``words``)
    slot: Slot  # the `ClassConcepts`, in the byte-bounded store
    words: str  # "class 'tabby' (#281), 12 images, block 10"


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
        self.cancels = Cancels("Nothing to cancel: no class concepts are being found for you.",
                               "Cancelling: the class concepts stop before their next step.")
        self.run_craft = gpu_pass(craft.class_concepts)  # on a ZeroGPU Space: under spaces.GPU

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
        return (Basis.of(session, key or session.model), picture,
                concept_note(concepts, plain_markdown(session.image_words)), slider)

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

    def class_run(self, files: object, examples: object, wanted: object, k: object, session, key: CacheKey | None,
                  request: gr.Request | None, progress=gr.Progress()):
        """(ClassRun, galleries, note) of CRAFT over the uploaded images (and the example photos when ticked) for
        the class typed (empty: the class the page explains); `Cancelled` when Cancel was pressed."""
        key = key or (session.model if session is not None else self.app.default_key)
        handle = self.app.handle(key)
        if not handle.has_head:
            raise InputError("This model has no classification head, so there is no class logit to explain.")
        limits = self.app.config.limits
        uploads = client_files(files, upload_folders(), limits.max_bytes, MAX_CLASS_IMAGES)
        sources = [source for source, _ in uploads] + (list(EXAMPLE_PATHS) if flag(examples, "The examples choice")
                                                       else [])
        if len(sources) < 2:
            raise InputError("Upload at least two images of the class (or tick the example photos); its concepts "
                             "are what its images share.")
        if len(sources) > MAX_CLASS_IMAGES:
            raise InputError(f"At most {MAX_CLASS_IMAGES} images per run ({len(sources)} given).")
        probs = session.result.probs if session is not None else np.zeros(len(handle.labels))
        target = find_class(handle.labels, probs, text(wanted, "The class", 100), "class concepts")
        if target is None:
            current = session.target[0] if session is not None else None
            if not isinstance(current, int):
                raise InputError("Type the class whose concepts to find (a name or an index).")
            target = current
        k = finite_int(k, "The number of concepts", 2, craft.MAX_CONCEPTS, default=CLASS_CONCEPTS)
        progress(0, desc=f"Reading {len(sources)} images")
        pictures = [load_image(source, limits) for source in sources]
        with self.cancels.run(request) as stop:
            found = self.run_craft(handle, pictures, target, k, cancelled=stop.is_set,
                                   progress=lambda done, total: progress((done, total), unit="steps"))
        words = (f"class {handle.label(target)!r} (#{target}), {len(pictures)} images, block {found.layer}, "
                 f"k={found.k}, seed {found.seed}")
        slot = self.app.store.put(found, found.galleries.nbytes + found.crop_coefficients.nbytes + found.bank.nbytes)
        run = ClassRun(Basis(model=key, model_words=shown_model(handle)), slot, words)
        captions = [f"concept {j + 1} · importance {found.importance[j]:.2f} · logit drop {found.logit_drop[j]:+.2f}"
                    f" · its {found.galleries.shape[1]} crops of highest coefficient" for j in range(found.k)]
        picture = gallery_panel(found.galleries, captions, f"{shown_model(handle)} · {words}\nCRAFT concepts, "
                                                           "by importance (total Sobol index of the class logit)")
        note = (f"{found.k} concepts of {words}, ranked by importance: the share of the class logit's variance lost "
                f"when the concept alone is held fixed (0: the logit never depends on it). The logit drop is what "
                f"the class logit loses when the concept is taken out of every patch (mean class logit "
                f"{found.logit_model:.2f} for the model, {found.logit_rebuilt:.2f} with every patch rebuilt from the "
                f"{found.k} concepts" + (" and what they leave out of it, so that taking a concept out is the only "
                                          "change" if found.residual else "") +
                f"; {100 * found.error:.0f} % of the crops' activations left out by the concepts). Averaged over "
                f"{len(found.explained)} of the images.")
        return run, picture, note

    @shows_errors
    def find_class_concepts(self, files: object, examples: object, wanted: object, k: object, session,
                            key: CacheKey | None = None, request: gr.Request = None, progress=gr.Progress()):
        try:
            return self.class_run(files, examples, wanted, k, session, key, request, progress)
        except Cancelled as exc:
            return gr.skip(), gr.skip(), f"{exc.public} Nothing was changed."

    @shows_errors
    def cancel(self, request: gr.Request = None) -> str:
        return self.cancels.cancel(request)

    @shows_errors
    def map_class_concepts(self, run: ClassRun | None, session, key: CacheKey | None = None):
        return self.class_maps(run, session, key)

    def class_maps(self, run: ClassRun | None, session, key: CacheKey | None):
        """(basis, heatmaps of the run's concepts on the page's image, note)."""
        if run is None:
            raise InputError(f"Find the class's concepts first ({CLASS_PRESS}); then they are mapped on the image.")
        if session is None:
            raise InputError("Analyse an image first; the concepts are mapped on it.")
        found = run.slot.get()
        handle = self.app.handle(session.model)
        if run.basis.model != (key or session.model):
            raise InputError(f"These concepts were found with another model; press {CLASS_PRESS} again.")
        picture = load_image(session.source, self.app.config.limits)
        heatmaps = craft.class_concept_heatmaps(handle, found, picture)
        _, rgb = handle.preprocess.apply(picture)
        names = [f"concept {j + 1} · importance {found.importance[j]:.2f}" for j in range(found.k)]
        panel = map_plots.maps_panel(
            rgb, dict(zip(names, heatmaps)), units={name: "concept coefficient (NNLS)" for name in names},
            title=f"{session.model_label} · {session.name} (model's centre crop) · {run.words}",
            columns=mosaic_columns(session.result))
        note = (f"The concepts of {run.words} on {plain_markdown(session.image_words)}: each patch's "
                "token projected on the concept bank; each heatmap has its own colour bar.")
        return Basis.of(session, key or session.model), panel, note


@dataclass(frozen=True)
class ConceptsView:
    """The Concepts tab's components."""

    tab: gr.Tab
    block: gr.Slider
    k: gr.Slider
    figure: gr.Image
    note: gr.Markdown
    made_from: gr.State  # the `stale.Basis` (model, image, class) of the figure shown
    class_files: gr.File  # the images of one class
    class_examples: gr.Checkbox  # the example photos too
    class_name: gr.Textbox
    class_k: gr.Slider
    class_button: gr.Button
    class_cancel: gr.Button
    class_progress: gr.Markdown
    class_figure: gr.Image  # the galleries, by importance
    class_note: gr.Markdown
    class_run: gr.State  # the `ClassRun` shown
    maps_button: gr.Button
    maps_figure: gr.Image  # the class's concepts on the page's image
    maps_note: gr.Markdown
    maps_made_from: gr.State  # the `stale.Basis` (model, image) of the maps shown


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
        gr.Markdown("**Concepts of a class** (CRAFT, Fel et al. 2023): the concepts many images of one class share, "
                    "ranked by how much the class logit depends on them, each shown by the crops that hold it most. "
                    f"Up to {MAX_CLASS_IMAGES} images; one run takes about a second per image on a CPU.",
                    elem_id="class-concepts-intro")
        with gr.Row():
            class_files = gr.File(label=f"Images of one class (2 to {MAX_CLASS_IMAGES})", file_count="multiple",
                                  file_types=["image"], type="filepath", height=120, scale=3,
                                  elem_id="class-concepts-files")
            with gr.Column(scale=2, min_width=260):
                class_examples = gr.Checkbox(False, label="Add the example photos", elem_id="class-concepts-examples")
                class_name = gr.Textbox(label="Class (name or index; empty: the class explained above)",
                                        max_length=100, elem_id="class-concepts-class")
                class_k = gr.Slider(2, craft.MAX_CONCEPTS, value=CLASS_CONCEPTS, step=1, label="Concepts (k)",
                                    elem_id="class-concepts-k")
        with gr.Row():
            class_button = gr.Button("Find the class's concepts", variant="primary", elem_id="class-concepts-run")
            class_cancel = gr.Button("Cancel", elem_id="class-concepts-cancel")
        class_progress = progress_slot("class-concepts-progress")
        class_figure = OutputImage(label="Concepts of the class", elem_id="class-concepts-figure", **FIGURE_OUT)
        class_note = gr.Markdown(elem_id="class-concepts-note")
        class_run = gr.State(None)
        maps_button = gr.Button("Map them on this image", elem_id="class-concepts-map")
        maps_figure = OutputImage(label="The class's concepts on this image", elem_id="class-concepts-maps",
                                  **FIGURE_OUT)
        maps_note = gr.Markdown(elem_id="class-concepts-maps-note")
        maps_made_from = gr.State(None)
    return ConceptsView(tab, block, k, figure, note, made_from, class_files, class_examples, class_name, class_k,
                        class_button, class_cancel, class_progress, class_figure, class_note, class_run, maps_button,
                        maps_figure, maps_note, maps_made_from)


def wire(view: ConceptsView, ctx: TabContext) -> None:
    """The tab's events: the figure drawn when the tab or its section opens and when the block or k is let go,
    on the model-pass queue (the concepts' logits read the head, which the sanity checks re-draw while they run);
    a refusal is a sentence in the note. The figure is under the page's stale-result check, and drawn again
    after each check while the tab is shown. The class concepts' button runs CRAFT on the same queue, its
    progress in its slot, its Cancel off the queue; their heatmaps on the image come on their own button. Both
    are under the stale-result check (the run at the model's level, its heatmaps at the image's)."""
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
    gr.on([view.class_button.click], says_refusals(handlers.find_class_concepts, view.class_note),
          inputs=[view.class_files, view.class_examples, view.class_name, view.class_k, ctx.session, ctx.key],
          outputs=[view.class_run, view.class_figure, view.class_note], api_name="class_concepts",
          show_progress_on=[view.class_progress], **RAW, **MODEL_PASS)
    gr.on([view.class_cancel.click], handlers.cancel, outputs=[view.class_note], api_name="cancel_class_concepts",
          show_progress="hidden", queue=False, **RAW)
    gr.on([view.maps_button.click], says_refusals(handlers.map_class_concepts, view.maps_note),
          inputs=[view.class_run, ctx.session, ctx.key], outputs=[view.maps_made_from, view.maps_figure, view.maps_note],
          api_name="class_concept_maps", show_progress_on=[view.maps_figure], **RAW, **MODEL_PASS)
    ctx.track(Tracked("class_concepts", view.class_run, (view.class_figure, view.class_note), (None, NOTE), "model",
                      CLASS_PRESS))
    ctx.track(Tracked("class_concept_maps", view.maps_made_from, (view.maps_figure, view.maps_note), (None, NOTE),
                      "image", MAPS_PRESS))

