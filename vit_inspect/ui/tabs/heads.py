"""The Heads tab: ablate heads live, rank them for this image, read the logit lens.

For the session's model, image and class:
- **Ablation** (`ablation.analyze_ablated`: one forward, one backward): the new top-5 beside the original,
  the change of the class's probability and logit (`ablation.ablation_effect`) and the ablated model's
  attention, rollout and Grad-CAM, captioned "ablated: heads ..., mode ...". Redraws for another layer or
  head use the cached ablated pass.
- **Importance** (`ablation.head_importance`: 1 + L·H rows, batched) with a progress bar and a Cancel button
  that stops it before its next batch; beside it the first-order estimate from the pass already made
  (`HeadPass.first_order`) and their Spearman ρ.
- Clicking a heatmap cell sets the app's shared layer and head: in the page at once (`PICK_CELL_JS`, with
  the cells' place sent beside the heatmaps, `cell_geometry`), so a redraw the page sends before the
  server's answer draws the clicked head, and on the server (`cell_at`, the same arithmetic).
- The logit lens table from the cached pass (`passes.records.lens_record`).

Per session only the latest ablated pass, the latest importance grid (two (depth, heads) arrays) and the
heads' mean outputs of one reference set are kept; the ablated pass and the means sit in the app's
byte-bounded session store (`session_store`), so they count against `--memory-budget` and may be
dropped to make room (the session is then told so, and the means are averaged again).
"""
from __future__ import annotations

import json
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import gradio as gr
import numpy as np

from vit_inspect.analysis.logit_lens import lens_probs, lens_ranks
from vit_inspect.analysis.rank_correlation import spearman
from vit_inspect.core.errors import Cancelled, InputError
from vit_inspect.passes.interventions import ABLATION_MODES, HeadMeans, mean_head_outputs, model_heads, parse_heads
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.plots import heads as head_plots
from vit_inspect.studies.ablation import HeadImportance, ablation_effect, analyze_ablated, head_importance
from vit_inspect.ui.clicks import HEATMAP_IDS, clicked_pixel
from vit_inspect.ui.cancel import Cancels
from vit_inspect.ui.common import (FIGURE_OUT, MAP_OUT, MODEL_PASS, RAW, OutputImage, progress_slot, says_refusals,
                                   shows_errors, still_showing, upload_folders)
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.inputs import EXAMPLE_PATHS
from vit_inspect.ui.inspector import LATER_PANELS
from vit_inspect.ui.lens_table import lens_table, lens_widths
from vit_inspect.ui.panels import draw_panels
from vit_inspect.ui.session_store import DROPPED, Detached, ResultDropped, Slot
from vit_inspect.ui.stale import Basis, Tracked, own_sentence, result_key
from vit_inspect.ui.untrusted import client_files, finite_float, text
from vit_inspect.ui.view import View
from vit_inspect.ui.zerogpu import gpu_pass

MAX_REFERENCE_IMAGES = 32  # uploaded images one mean ablation averages over
IMPORTANCE_BATCH = 16  # rows per forward of head importance
ABLATED_PANELS = ("attention", "rollout", "gradcam")
TOP_HEADERS = ["rank", "original: class", "original: prob", "ablated: class", "ablated: prob"]
Box = tuple[float, float, float, float]  # (x0, y0, x1, y1) of a heatmap's axes in the image's pixels

# On a heatmap's select event, in the page: the remembered pixel -> (layer, head, not "mean of heads") with
# the cells' box and grid the server sent (`cell_geometry`), the arithmetic of `cell_at`; a click on the
# title, the colour bar or the margins, or before any heatmap, leaves the controls as they are.
PICK_CELL_JS = """(geometry, layer, head, mean) => {
  %(clicked)s
  const cells = click && geometry ? geometry[%(which)s] : null;
  if (!cells) return [layer, head, mean];
  const [x0, y0, x1, y1] = cells.box, [depth, heads] = cells.grid;
  if (!(x0 <= click.x && click.x < x1 && y0 <= click.y && click.y < y1)) return [layer, head, mean];
  return [Math.min(Math.floor((click.y - y0) / (y1 - y0) * depth), depth - 1),
          Math.min(Math.floor((click.x - x0) / (x1 - x0) * heads), heads - 1), false];
}"""


@dataclass(frozen=True, eq=False)
class HeadsState:
    """One session's ablation and importance results (held in gr.State), for one model, image and class."""

    key: tuple  # (model key, crop digest, class) the results belong to
    ablated_slot: Slot | None = None  # the latest ablated pass, in the app's byte-bounded store
    ablated_heads: tuple[tuple[int, int], ...] = ()  # its (layer, head) pairs
    ablated_words: str = ""  # "ablated: heads 3:1, 5:0, mode zero (...)", for every caption ("": none shown)
    importance: HeadImportance | None = None  # the latest importance grid
    importance_words: str = ""  # its mode and reference set ("": no importance shown)
    means_key: tuple | None = None  # the reference set of the last mean ablation
    means_slot: Slot | None = None  # its head means, in the app's byte-bounded store
    boxes: tuple[tuple[str, Box], ...] = ()  # heatmap name -> where its cells are drawn
    basis: Basis | None = None  # what the ablation or importance shown was computed from (`ui.stale`)

    def __hash__(self) -> int:
        """Its basis's: Gradio hashes a state to tell whether an event changed it, and the page checks a result
        again when what it was computed from changes (`build_demo`), not on every redraw of the tab."""
        return hash(self.basis)

    @property
    def ablated(self) -> ImageAnalysis | None:
        """The latest ablated pass; `ResultDropped` (a sentence) if the store let it go to make room."""
        return None if self.ablated_slot is None else self.ablated_slot.get()

    @property
    def means(self) -> tuple[tuple, HeadMeans] | None:
        """(reference key, head means) of the last mean ablation; `ResultDropped` if the store let them go."""
        return None if self.means_slot is None else (self.means_key, self.means_slot.get())


def importance_of_crop(handle, rgb: np.ndarray, **options) -> HeadImportance:
    """`ablation.head_importance` of the (H, W, 3) uint8 crop a pass saw, on the handle's device (so that
    `zerogpu.gpu_pass` can run it on a lent GPU: it returns numpy arrays only)."""
    pixels = handle.preprocess.normalize(rgb).to(handle.device)  # (1, 3, H, W)
    return head_importance(handle, pixels, **options)


def fresh(state: HeadsState | None, session) -> HeadsState:
    """The session's state if it belongs to this model, image and class; else an empty one (keeping the
    reference means, which depend only on the model and input size, and the basis and words of the results it
    drops, so that the page's stale-result check still says what was cleared: `HeadsTab.reset` lets them go)."""
    key = result_key(session)
    if state is not None and state.key == key:
        return state
    if state is None:
        return HeadsState(key=key)
    if state.ablated_slot is not None:  # another image or class: the old ablated pass is of no use
        state.ablated_slot.release()
    return HeadsState(key=key, means_key=state.means_key, means_slot=state.means_slot, basis=state.basis,
                      ablated_words=state.ablated_words, importance_words=state.importance_words)


NOT_ABLATED = ("*Not ablated yet: type heads above (layer:head) and press **Ablate these heads** for the new top-5 "
               "and the ablated model's maps.*")
NOT_RANKED = "*Not ranked yet: press **Rank every head** for each head's drop of the class logit.*"


# The ablation's and the importance note's lines once the page's stale-result check cleared this tab
cleared_ablation = own_sentence("**Ablate these heads**", "ablated_words", NOT_ABLATED)
cleared_ranking = own_sentence("**Rank every head**", "importance_words", NOT_RANKED)


def parse_head_spec(value: object, depth: int, num_heads: int) -> tuple[tuple[int, int], ...]:
    """A client's "3:1, 5:0" -> ((3, 1), (5, 0)), negative indices counted from the end, duplicates
    dropped; anything unreadable or beyond this model is refused with a sentence."""
    spec = text(value, "The heads to ablate", max_chars=400)
    return tuple(model_heads(parse_heads(spec), depth, num_heads))


def mode_of(value: object) -> str:
    mode = text(value, "The ablation mode", max_chars=20)
    if mode not in ABLATION_MODES:
        raise InputError(f"The ablation mode must be one of {', '.join(ABLATION_MODES)}.")
    return mode


def heads_text(pairs) -> str:
    return ", ".join(f"{layer}:{head}" for layer, head in pairs)


def heatmap(values: np.ndarray, title: str, unit: str, selected: tuple[int, int] | None) -> tuple[np.ndarray, Box]:
    """A diverging layers x heads heatmap as an image (`head_plots.head_heatmap_panel`, drawn with PIL: a slider
    moves its outlined cell in ≈ 4 ms, where a matplotlib figure took ≈ 0.3 s), and where its cells lie
    in it (for clicks)."""
    return head_plots.head_heatmap_panel(values, title, unit, selected=selected)


def cell_at(box: Box, grid: tuple[int, int], x: float, y: float) -> tuple[int, int] | None:
    """(layer, head) of the heatmap cell at pixel (x, y); None outside the cells (title, colour bar)."""
    x0, y0, x1, y1 = box
    if not (x0 <= x < x1 and y0 <= y < y1):
        return None
    depth, heads = grid
    return (min(int((y - y0) / (y1 - y0) * depth), depth - 1), min(int((x - x0) / (x1 - x0) * heads), heads - 1))


def cell_geometry(state: HeadsState, grid: tuple[int, int]) -> dict:
    """{heatmap name: {"box": [x0, y0, x1, y1], "grid": [depth, heads]}} of the heatmaps shown: what the page
    needs to turn a clicked pixel into a cell as `cell_at` does (`PICK_CELL_JS`)."""
    return {name: {"box": [float(v) for v in box], "grid": [int(grid[0]), int(grid[1])]} for name, box in state.boxes}


def pick_cell_js(which: str) -> str:
    """`PICK_CELL_JS` for heatmap `which` ("importance" or "first_order")."""
    return PICK_CELL_JS % {"clicked": clicked_pixel(HEATMAP_IDS[which]), "which": json.dumps(which)}


def top_rows(effect, label: Callable[[int], str]) -> list[list]:
    return [[rank, f"{label(i)} (#{i})", round(p, 4), f"{label(j)} (#{j})", round(q, 4)]
            for rank, ((i, p), (j, q)) in enumerate(zip(effect.top_before, effect.top_after), 1)]


def effect_text(effect, label: Callable[[int], str], words: str) -> str:
    change = "the top class changes" if effect.prediction_changed else "the top class stays"
    return (f"**{words}** · class {label(effect.target)} (#{effect.target}): probability "
            f"{effect.prob_before:.4f} → {effect.prob_after:.4f} (Δ {effect.delta_prob:+.4f}), logit "
            f"{effect.logit_before:.3f} → {effect.logit_after:.3f} (Δ {effect.delta_logit:+.3f}); {change}.")


@dataclass(frozen=True)
class HeadsView:
    """The Heads tab's components (``geometry`` is hidden: where the heatmaps' cells lie, for the browser;
    ``state`` holds the session's `HeadsState`)."""

    tab: gr.Tab
    spec: gr.Textbox
    mode: gr.Radio
    references: gr.File
    ablate_button: gr.Button
    ablate_progress: gr.Markdown  # where the ablation shows its progress (`common.progress_slot`)
    effect: gr.Markdown
    top: gr.Dataframe
    maps: tuple[gr.Image, ...]  # the ablated model's ABLATED_PANELS
    importance_button: gr.Button
    cancel_button: gr.Button
    importance_progress: gr.Markdown  # where head importance shows its progress
    importance: gr.Image
    first_order: gr.Image
    geometry: gr.JSON
    importance_note: gr.Markdown
    lens_note: gr.Markdown
    lens_plot: gr.Image
    lens: gr.Dataframe
    state: gr.State


def layout(settings: PageSettings) -> HeadsView:
    """The tab, its controls and results, inside the page's ``gr.Tabs``; ``settings.examples`` is the number of
    example photos mean ablation averages over when no reference images are uploaded."""
    examples, session_ttl_s = settings.examples, settings.session_ttl_s
    with gr.Tab("Ablate & rank", elem_id="heads-tab") as tab:
        gr.Markdown("What does a head do for this prediction? Ablate heads and see the prediction and maps "
                    "change (one forward and one backward pass), rank every head by the drop of the class's "
                    "logit when it alone is ablated, and read the class token after every block (logit lens). "
                    "**Click a heatmap cell** to choose that layer and head everywhere (**Explain → Attention**). "
                    "The class is the one under **Class to explain** (left); the ablated maps use the layer, "
                    "head and query of **Explain → Attention** and print them.")
        with gr.Row():
            spec = gr.Textbox(label="Heads to ablate (layer:head, comma-separated, 0-based)",
                              placeholder="e.g. 3:1, 5:0", max_lines=1, scale=3, elem_id="ablate-heads")
            mode = gr.Radio(list(ABLATION_MODES), value="zero", label="Ablation mode", scale=2,
                            elem_id="ablate-mode",
                            info="zero: the head's output is 0; mean: its mean over the reference images; "
                                 "uniform: the head attends uniformly to every token.")
        references = gr.File(label=f"Reference images for mean ablation (up to {MAX_REFERENCE_IMAGES}; "
                                   f"none: the {examples} example photos)",
                             file_count="multiple", file_types=["image"], type="filepath", height=100,
                             elem_id="ablate-references")
        ablate_button = gr.Button("Ablate these heads", variant="primary", elem_id="ablate-button")
        ablate_progress = progress_slot("ablate-progress")
        effect = gr.Markdown(NOT_ABLATED, elem_id="ablate-effect")
        top = gr.Dataframe(headers=TOP_HEADERS, label="Top-5, original and ablated", interactive=False,
                           wrap=True, elem_id="ablate-top")
        with gr.Row():
            maps = tuple(OutputImage(label=f"Ablated model: {name}", elem_id=f"ablated-{name}", **MAP_OUT)
                         for name in ABLATED_PANELS)
        with gr.Row():
            importance_button = gr.Button(
                "Rank every head (one ablation per head, batched forward passes)", variant="primary",
                elem_id="importance-button")
            cancel_button = gr.Button("Cancel", elem_id="importance-cancel")
        importance_progress = progress_slot("importance-progress")
        with gr.Row():
            importance = OutputImage(label="Drop of the class logit, each head ablated alone",
                                     elem_id=HEATMAP_IDS["importance"], **FIGURE_OUT)
            first_order = OutputImage(label="First-order estimate (attention × gradient)",
                                      elem_id=HEATMAP_IDS["first_order"], **FIGURE_OUT)
        geometry = gr.JSON(None, visible=False, elem_id="heads-geometry")  # `cell_geometry`, for the page
        importance_note = gr.Markdown(NOT_RANKED, elem_id="importance-note")
        lens_note = gr.Markdown(elem_id="lens-note")
        lens_plot = OutputImage(label="Logit lens", elem_id="lens-plot", **FIGURE_OUT)
        lens = gr.Dataframe(label="Logit lens: the readout after every block through the model's final norm and head",
                            interactive=False, wrap=True, pinned_columns=1, elem_id="lens-table")
        state = gr.State(None, time_to_live=session_ttl_s)
    return HeadsView(tab, spec, mode, references, ablate_button, ablate_progress, effect, top, maps, importance_button,
                     cancel_button, importance_progress, importance, first_order, geometry, importance_note, lens_note,
                     lens_plot, lens, state)


class HeadsTab:
    """The tab's handlers. ``app`` is the page's `Inspector` (model cache, session store, limits)."""

    def __init__(self, app, reference_images: tuple[Path, ...], upload_folders: Callable[[], list[str]],
                 view_of: Callable):
        self.app = app
        self.view_of = view_of  # View.from_controls: raw controls -> what to draw
        self.reference_images = reference_images  # the default reference set of mean ablation
        self.upload_folders = upload_folders
        self.cancels = Cancels("Nothing to cancel: no head importance is running for you.",
                               "Cancelling: head importance stops before its next batch.")
        self.run_ablated = gpu_pass(analyze_ablated)  # the ablated pass, under ZeroGPU like the main pass
        self.run_importance = gpu_pass(importance_of_crop)  # and the importance forwards

    # ------------------------------------------------------------------------------------------ handlers

    def _means(self, state: HeadsState, handle, session, files: object, progress) -> tuple[HeadsState, HeadMeans, str]:
        """The heads' mean outputs over the uploaded references (or the example photos), at this input size."""
        uploads = client_files(files, self.upload_folders(), self.app.config.limits.max_bytes, MAX_REFERENCE_IMAGES)
        if any(isinstance(source, bytes) for source, _ in uploads):
            raise InputError("Upload the reference images as files.")
        sources = [source for source, _ in uploads] or [str(p) for p in self.reference_images]
        size = session.result.layout.input_size
        key = (session.model, size, tuple(sources))
        held = None
        if state.means_slot is not None and state.means_key == key:
            with suppress(ResultDropped):  # dropped to make room: averaged again
                held = state.means_slot.get()
        if held is not None:
            means = held
        else:
            progress(0.1, desc=f"Mean head outputs over {len(sources)} reference images")
            means = mean_head_outputs(handle, sources, batch_size=IMPORTANCE_BATCH, input_size=size,
                                      limits=self.app.config.limits)
            state = replace(state, means_key=key, means_slot=self._keep(state.means_slot, means, means.values.nbytes))
        kind = "your uploaded images" if uploads else "the app's example photos"
        return state, means, f"mean over {means.num_images} of {kind}"

    def ablate(self, session, state: HeadsState | None, spec: object, mode: object, files: object,
               progress=gr.Progress(), **controls):
        """Ablate the typed heads: new top-5, the class's change, the ablated model's maps. A refusal's sentence
        (which replaces the ablation's line) says which ablation the table and maps still show."""
        shown = state.ablated_words if state is not None and state.ablated_slot is not None else ""
        with still_showing(f"the table and maps below still show {shown}" if shown else ""):
            return self._ablate(session, state, spec, mode, files, progress, controls)

    def _ablate(self, session, state: HeadsState | None, spec: object, mode: object, files: object, progress,
                controls: dict):
        handle = self._handle_with_head(session, "the ablation runs on it",
                                        "Ablation effects are measured on the prediction: this model has no classification head.")
        pairs = parse_head_spec(spec, handle.depth, handle.num_heads)
        self.view_of(session.result, **controls)  # refuse bad controls before the pass, not after
        mode, state, means, reference = self._reference(state, handle, session, mode, files, progress)
        progress(0.5, desc="The ablated model: one forward and one backward pass")
        result = session.result
        ablated = self.run_ablated(handle, session.source, pairs, mode, means, target=result.target,
                                  limits=self.app.config.limits, geometry=session.geometry,
                                  relevance=False)  # its panels show attention, rollout and Grad-CAM only
        words = f"ablated: heads {heads_text(pairs)}, mode {mode}" + (f" ({reference})" if reference else "")
        state = replace(state, ablated_slot=self._keep(state.ablated_slot, ablated, ablated.nbytes()),
                        ablated_heads=pairs, ablated_words=words, basis=Basis.of(session, None),
                        importance_words=state.importance_words if state.importance is not None else "")
        effect = ablation_effect(result, ablated)
        return (state, effect_text(effect, handle.label, words), top_rows(effect, handle.label),
                *self.ablated_maps(session, state, controls))

    def _handle_with_head(self, session, purpose: str, no_head: str):
        """The session's model handle, refused (with these sentences) without an analysed image or a head."""
        if session is None:
            raise InputError(f"Analyse an image first; {purpose}.")
        handle = self.app.handle(session.model)
        if not handle.has_head:
            raise InputError(no_head)
        if any(isinstance(value, str) for value in session.target):
            raise InputError("Heads are ablated and ranked on a zero-shot label's logit, not on a prompt: pick a "
                             "label from the list (the prompt's maps stay in Explain).")
        return handle

    def _reference(self, state: HeadsState | None, handle, session, mode: object, files: object, progress):
        """(checked mode, this browser session's state, the mean head outputs for mode "mean" or None, their words)."""
        mode = mode_of(mode)
        state = fresh(state, session)
        means, reference = None, ""
        if mode == "mean":
            state, means, reference = self._means(state, handle, session, files, progress)
        return mode, state, means, reference

    def _keep(self, slot: Slot | None, value, nbytes: int) -> Slot:
        """Hold `value` in the app's byte-bounded store, in the session's existing slot if it has one."""
        if slot is None:
            return self.app.store.put(value, nbytes)
        slot.set(value, nbytes)
        return slot

    def ablated_maps(self, session, state: HeadsState, controls: dict) -> list:
        """The ablated pass's attention (shared layer/head/query), rollout and Grad-CAM, from the cache."""
        if state.ablated is None:
            return [None] * len(ABLATED_PANELS)
        target = (session.target[0], None)  # the ablated pass explains the class alone, never "versus"
        shown = replace(session, slot=Detached({target: state.ablated}), target=target,
                        model_label=f"{session.model_label} · {state.ablated_words}")
        # at the crop's own size, as the first view's maps: three fit side by side at 1366 pixels
        return draw_panels(ABLATED_PANELS, shown, self.view_of(state.ablated, **controls), scale=1)

    def redraw(self, session, state: HeadsState | None, **controls):
        """Another layer or head: the ablated maps and the heatmaps' outlined cell, from the cache."""
        if session is None or state is None or state.key != result_key(session):
            return [gr.skip()] * (len(ABLATED_PANELS) + 2)
        images, _ = self.heatmaps(session, state, self.selected(controls))
        return *self.ablated_maps(session, state, controls), *images

    def redraw_if_shown(self, tab: str):
        """`redraw` when the page shows ``tab`` (the browser's record of its open tab, a client's word that
        only decides whether to draw now); otherwise nothing: the tab's opening draws it all (`overview`)."""
        def handler(session, state: HeadsState | None, shown: object, **controls):
            if shown == tab:
                return self.redraw(session, state, **controls)
            return [gr.skip()] * (len(ABLATED_PANELS) + 2)
        return handler

    def rank(self, session, state: HeadsState | None, mode: object, files: object, request: gr.Request,
             progress=gr.Progress(), **controls):
        """Head importance for this image and class, stoppable with Cancel between batches; a refusal's sentence
        says which ranking the heatmap still shows, as `ablate`'s does."""
        shown = state.importance_words if state is not None and state.importance is not None else ""
        with still_showing(f"the heatmap below still shows the earlier ranking, {shown}" if shown else ""):
            return self._rank(session, state, mode, files, request, progress, controls)

    def _rank(self, session, state: HeadsState | None, mode: object, files: object, request: gr.Request, progress,
              controls: dict):
        handle = self._handle_with_head(session, "head importance is measured on it",
                                        "Head importance needs a classification head: this model has none.")
        mode, state, means, reference = self._reference(state, handle, session, mode, files, progress)
        result = session.result
        try:
            with self.cancels.run(request) as stop:
                ranked = self.run_importance(handle, result.rgb, target=result.target, mode=mode, mean=means,
                                             batch_size=IMPORTANCE_BATCH, cancelled=stop.is_set,
                                             progress=lambda done, total: progress((done, total), unit="rows"))
        except Cancelled as exc:
            return state, gr.skip(), gr.skip(), f"{exc.public} Nothing was changed.", gr.skip()
        words = f"mode {mode}" + (f", {reference}" if reference else "")
        state = replace(state, importance=ranked, importance_words=words, basis=Basis.of(session, None),
                        ablated_words=state.ablated_words if state.ablated_slot is not None else "")
        images, state = self.heatmaps(session, state, self.selected(controls))
        return (state, *images, self.importance_text(session, state, handle.label),
                cell_geometry(state, (result.depth, result.num_heads)))

    def cancel(self, request: gr.Request) -> str:
        """Stop this browser session's importance run before its next batch."""
        return self.cancels.cancel(request)

    def selected(self, controls: dict) -> tuple[int, int] | None:
        return None if controls.get("mean_heads") is True else (controls.get("layer"), controls.get("head"))

    def heatmaps(self, session, state: HeadsState, selected) -> tuple[list, HeadsState]:
        """The importance and first-order heatmaps (None where absent) and where their cells lie."""
        result = session.result
        depth, heads = result.depth, result.num_heads
        if selected is not None:
            try:
                layer, head = (int(finite_float(v, "The layer or head", -1, 10**6)) for v in selected)
                selected = (layer, head) if 0 <= layer < depth and 0 <= head < heads else None
            except InputError:
                selected = None
        what = f"{session.model_label}, {session.target_text(session.target[0])}"
        images, boxes = [], {}
        ranked = state.importance
        if ranked is not None:
            image, boxes["importance"] = heatmap(
                ranked.logit_drop, f"{what}\ndrop of the class logit, each head {ranked.mode}-ablated alone",
                "logit drop (logits)", selected)
            images.append(image)
        else:
            images.append(None)
        first = result.heads.first_order if result.heads is not None else None
        if first is not None:
            image, boxes["first_order"] = heatmap(first, f"{what}\nfirst-order estimate Σ A·∂y/∂A per head",
                                                  "estimated logit drop (logits)", selected)
            images.append(image)
        else:
            images.append(None)
        return images, replace(state, boxes=tuple(boxes.items()))

    @staticmethod
    def importance_text(session, state: HeadsState, label) -> str:
        ranked = state.importance
        first = session.result.heads.first_order
        text_ = (f"Head importance ({state.importance_words}) for class {label(ranked.target)} (#{ranked.target}), logit "
                 f"{ranked.logit:.3f}: largest drop {ranked.logit_drop.max():.3f} at "
                 f"{heads_text([np.unravel_index(int(ranked.logit_drop.argmax()), ranked.logit_drop.shape)])}; "
                 f"{int(ranked.top_changed.sum())} head(s) change the top class when ablated alone.")
        if first is not None and ranked.mode == "zero":
            text_ += (f" Spearman ρ between the first-order estimate and the real zero-ablation drop on this image: "
                      f"**{spearman(first, ranked.logit_drop):.3f}**.")
        elif first is not None:
            text_ += " The first-order estimate is of zero ablation; ρ is given for zero mode only."
        return text_

    def pick(self, which: str):
        """A click on heatmap `which` selects that cell's layer and head in every tab."""
        def handler(evt: gr.SelectData, session, state: HeadsState | None):
            index = getattr(evt, "index", None)
            if session is None or state is None or index is None or state.key != result_key(session):
                return gr.skip(), gr.skip(), gr.skip()
            if not isinstance(index, (list, tuple)) or len(index) < 2:
                raise InputError("A click gives the (x, y) pixel it landed on; this one gave none.")
            box = dict(state.boxes).get(which)
            x = finite_float(index[0], "The clicked x", -1e6, 1e6)
            y = finite_float(index[1], "The clicked y", -1e6, 1e6)
            cell = None if box is None else cell_at(box, (session.result.depth, session.result.num_heads), x, y)
            if cell is None:  # the title, the colour bar or the margins
                return gr.skip(), gr.skip(), gr.skip()
            return cell[0], cell[1], False
        return handler

    def overview(self, session, state: HeadsState | None, **controls):
        """Everything the tab shows from the cached pass: heatmaps, lens; stale results are cleared, their lines
        left to the page's stale-result check (`cleared_ablation`, `cleared_ranking`), which says what changed."""
        skip = gr.skip()
        if session is None:
            return None, None, None, skip, None, None, "", None, skip, None, *[None] * len(ABLATED_PANELS)
        state = fresh(state, session)
        handle = self.app.handle(session.model)
        images, state = self.heatmaps(session, state, self.selected(controls))
        headers, rows, note = lens_table(handle, session.result)
        lens = session.result.heads.lens if session.result.heads is not None else {}
        plot = None
        if "readout" in lens:
            final = int(np.argmax(session.result.heads.logits))
            plot = head_plots.lens_panel(lens_ranks(lens["readout"], final), lens_probs(lens["readout"])[:, final],
                                       f"{session.model_label}: logit lens, final class {handle.label(final)}")
        stale = state.ablated_slot is None or state.ablated_slot.dropped
        dropped = state.ablated_slot is not None and state.ablated_slot.dropped
        return (state, *images, skip, plot,
                gr.update(value=rows, headers=headers, column_widths=lens_widths(headers)), note,
                None if stale else skip, DROPPED if dropped else skip,
                cell_geometry(state, (session.result.depth, session.result.num_heads)),
                *(self.ablated_maps(session, state, controls) if not stale else [None] * len(ABLATED_PANELS)))

    def overview_if_shown(self, tab: str, outputs: int):
        """`overview` when the page shows ``tab`` (the browser's record of its open tab); otherwise the lens
        and the first-order heatmap of the previous image or class are cleared (the tab draws them when it
        opens), and the page's stale-result check (`ui.stale`) clears an older ablation or importance."""
        def handler(session, state: HeadsState | None, shown: object, **controls):
            if shown == tab or session is None:
                return self.overview(session, state, **controls)
            skip = gr.skip()
            if state is not None and state.key == result_key(session):
                return (skip,) * outputs  # the same pass (a refused upload, the image shown already): nothing changed
            return skip, skip, None, skip, None, None, "", skip, skip, None, *[skip] * (outputs - 10)
        return handler

    @staticmethod
    def reset(state: HeadsState | None, session) -> HeadsState | None:
        """The state once the stale-result check cleared its results: the reference means kept (`fresh`), the
        basis of what was cleared let go."""
        return None if session is None else replace(fresh(state, session), basis=None, ablated_words="",
                                                    importance_words="")


def wire(view: HeadsView, ctx: TabContext) -> None:
    """Events: the tab opening (its and its section's select) and the page's new image or class redraw from
    the cache, the latter only while the page shows the tab (``ctx.shown_tab``), as does a change of layer or
    head (the heatmaps' outlined cell, the ablated maps); a cell click sets layer and head, then redraws the
    Attention and distance panels where they are in view. The ablation and ranking are under the page's
    stale-result check."""
    handlers = HeadsTab(ctx.app, EXAMPLE_PATHS, upload_folders, View.from_controls)
    session, controls, shown_tab, opened = ctx.session, ctx.controls, ctx.shown_tab, ctx.opened(view.tab)
    refreshed = [ctx.events[name] for name in ("image", "class", "search", "prompt")]
    follow = [(name, ctx.app.redraw_if_shown(name, LATER_PANELS.get(name)), ctx.panels[name])
              for name in ("attention", "distance")]
    ctx.track(Tracked("heads", view.state, (view.effect, view.top, *view.maps, view.importance,
                                            view.importance_note),
                      (cleared_ablation, None, *[None] * len(view.maps), None, cleared_ranking), "class",
                      "**Ablate these heads** or **Rank every head**", reset=handlers.reset))
    layer, head, mean_heads = controls["layer"], controls["head"], controls["mean_heads"]
    redrawn = [*view.maps, view.importance, view.first_order]
    overview = dict(fn=shows_errors(handlers.overview), inputs=[session, view.state], inputs_kwargs=controls,
                    outputs=[view.state, view.importance, view.first_order, view.importance_note, view.lens_plot,
                             view.lens, view.lens_note, view.top, view.effect, view.geometry, *view.maps],
                    show_progress="hidden", **RAW)
    gr.on(opened, api_name="heads_overview", **overview)
    if_shown = overview | dict(fn=shows_errors(handlers.overview_if_shown(view.tab.label, len(overview["outputs"]))),
                               inputs=[session, view.state, shown_tab])
    for index, dependency in enumerate(refreshed):
        dependency.success(api_name=f"heads_overview_{index}", **if_shown)
    gr.on([view.ablate_button.click, view.spec.submit], says_refusals(handlers.ablate, view.effect),
          inputs=[session, view.state, view.spec, view.mode, view.references], inputs_kwargs=controls,
          outputs=[view.state, view.effect, view.top, *view.maps], api_name="ablate_heads",
          show_progress_on=[view.ablate_progress], **RAW, **MODEL_PASS)
    gr.on([view.importance_button.click], says_refusals(handlers.rank, view.importance_note),
          inputs=[session, view.state, view.mode, view.references], inputs_kwargs=controls,
          outputs=[view.state, view.importance, view.first_order, view.importance_note, view.geometry],
          api_name="head_importance", show_progress_on=[view.importance_progress], **RAW, **MODEL_PASS)
    gr.on([view.cancel_button.click], shows_errors(handlers.cancel), outputs=[view.importance_note],
          api_name="cancel_head_importance", show_progress="hidden", queue=False, **RAW)
    gr.on([layer.input, head.input, mean_heads.input], shows_errors(handlers.redraw_if_shown(view.tab.label)),
          inputs=[session, view.state, shown_tab], inputs_kwargs=controls, outputs=redrawn, api_name="heads_redraw",
          trigger_mode="always_last", show_progress="hidden", **RAW)
    for which, image in (("importance", view.importance), ("first_order", view.first_order)):
        gr.on([image.select], None, inputs=[view.geometry, layer, head, mean_heads],
              outputs=[layer, head, mean_heads], js=pick_cell_js(which), queue=False)  # in the page, at once
        picked = gr.on([image.select], shows_errors(handlers.pick(which)), inputs=[session, view.state],
                       outputs=[layer, head, mean_heads], api_name=f"pick_head_{which}", show_progress="hidden",
                       **RAW)
        picked = picked.success(shows_errors(handlers.redraw), inputs=[session, view.state], inputs_kwargs=controls,
                                outputs=redrawn, api_name=f"pick_head_{which}_redraw", show_progress="hidden", **RAW)
        for name, handler, output in follow:
            picked = picked.success(handler, inputs=[session, shown_tab], inputs_kwargs=controls,
                                    outputs=output, api_name=f"pick_head_{which}_{name}",
                                    show_progress="hidden", **RAW)
