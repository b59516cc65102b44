"""The Faithfulness tab: which map can be trusted for this image, by deletion and insertion curves.

On demand (a button, with a progress bar) it scores every map of the current image and class, plus the
current Grad-CAM block, rollout options and attention layer/head when they differ from the defaults, by
deletion/insertion and positive/negative perturbation (`vit_inspect.studies.faithfulness.score_maps`). The curves
of every map already scored for this image and class stay in the session, so scoring a new choice costs
only that map's perturbed inputs. LeGrad and AttnLRP, which the app's pass leaves out unless asked
(`ui.relevance`), are added first (one more forward and backward pass); a map this model cannot give is
named as not scored.

Below them, on demand with a progress bar and Cancel, the sanity checks of the same maps (`ui.sanity`): the
cascading strip of maps, the similarity curves, the random-logit similarity, max-sensitivity and infidelity,
and a verdict per map (passes or fails the randomisation test, the threshold stated) in a column of the
faithfulness table, so that both questions are answered side by side.

The scores and the checks record what they were computed from (`Scored.basis`, `sanity.Checked.basis`: model,
image and class); another image, model or class clears them, and the verdicts under the first view's maps,
through the page's one stale-result check (`ui.stale`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import gradio as gr
import numpy as np

from vit_inspect.analysis.faithfulness import Curves
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.open_clip_models import prompt_view
from vit_inspect.methods import MethodFailure
from vit_inspect.plots.faithfulness import SORTED_BY, curves_panel, paper_name, ranked_rows, verdict
from vit_inspect.studies.faithfulness import (faithfulness_methods, image_permutation, model_scorer, prompt_scorer,
                                              score_maps, scored_maps)
from vit_inspect.ui import sanity
from vit_inspect.ui.common import (FIGURE_OUT, MODEL_PASS, RAW, OutputImage, progress_slot, public_message, public_name,
                                   says_refusals, shows_errors)
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.stale import NOTE, Basis, Tracked, result_key
from vit_inspect.ui.untrusted import finite_float, finite_int, flag, redact_paths
from vit_inspect.ui.view import SWAPPED

HEADERS = ["map", "mean rank ↓", "pos ↓", "neg ↑", "del ↓", "ins ↑", "vs random", sanity.VERDICT_HEADER]
VERDICT_ORDER = ("attention", "rollout", "chefer")  # the first view's maps (`panels.FIRST_VIEW`), as scored here
NO_VERDICT = "*Faithfulness: this map could not be scored for this model.*"
MAX_SCORED_MAPS = 24  # maps kept per session for one image and class
TABLE_LABEL = f"Areas under the curves, sorted by {SORTED_BY}"  # before anything is scored, and once cleared


def explained_words(handle, result) -> str:
    """What the curves score: "class 'tabby' (#281)" (its probability), or for a text prompt "prompt 'a photo
    of a cat'" and its versus prompt (their similarity's difference)."""
    if result.prompt is None and result.versus is None:
        return f"class {handle.label(result.target)!r} (#{result.target})"
    words = f"prompt {result.prompt.text!r}" if result.prompt is not None else f"label {handle.label(result.target)!r}"
    if result.contrast is not None:
        words += (f" versus prompt {result.versus.text!r}" if result.versus is not None
                  else f" versus label {handle.label(result.contrast)!r}")
    return words


@dataclass(frozen=True, eq=False)
class Scored:
    """The curves scored so far for one image, model and class (held in gr.State)."""

    key: tuple  # (model key, image digest, class)
    curves: dict[str, Curves]  # map name -> its curves
    basis: Basis | None = None  # what they were computed from, for the page's stale-result check
    words: str = ""  # what they score: "class 'tabby' (#281)", or "prompt 'a photo of a cat'" (`explained_words`)

    def __hash__(self) -> int:
        """Its basis's: Gradio hashes a state to tell whether an event changed it, and the page checks a result
        again when what it was computed from changes (`build_demo`)."""
        return hash(self.basis)


def with_verdicts(rows: list[list], key: tuple, checked: sanity.Checked | None) -> list[list]:
    """The ranked rows with the randomisation verdict of each map appended: from ``checked`` when it was run
    for the same model, image and class (``key``), "not run" before; "–" for the maps the checks do not
    recompute (the random map, the other tabs' choices)."""
    verdicts = checked.verdicts if checked is not None and checked.key == key else {}
    checked_names = {paper_name(m) for m in sanity.SANITY_METHODS}
    return [row + [verdicts.get(row[0], sanity.NOT_RUN) if row[0] in checked_names else sanity.NOT_CHECKED]
            for row in rows]


def table_of(scored: Scored | None, checked: sanity.Checked | None):
    """The faithfulness table for ``scored`` with the verdict column of ``checked``; left as shown when
    nothing is scored for the image and class the checks ran on."""
    if scored is None or checked is None or scored.key != checked.key:
        return gr.skip()
    return with_verdicts(ranked_rows(scored.curves), scored.key, checked)


def chosen_maps(result, rng: np.random.Generator, handle=None, *, layer=None, head=None, mean_heads=True,
                head_fusion="mean", discard_ratio=0.0, first_layer=0, last_layer=None, gradcam_layer=None, **_
                ) -> tuple[dict[str, np.ndarray], dict[str, MethodFailure]]:
    """(maps, failures): every registered method the faithfulness study scores (`faithfulness_methods`, the
    random floor and the plugins included; one with passes of its own runs on ``handle``, once per pass), plus
    the choices made in the other tabs (raw client values, checked as the other tabs check them) where they
    differ from the defaults; a method that failed is in ``failures`` with its sentence, left out of the maps."""
    maps, failures = scored_maps(result, tuple(faithfulness_methods()), rng, handle)
    last = result.depth - 1
    block = finite_int(gradcam_layer, "Grad-CAM block", 0, last, default=last)
    if result.gradcam is not None and block != last:
        maps[f"Grad-CAM, block {block} (signed)"] = result.gradcam[block].astype(np.float64)
    given = (finite_int(first_layer, "From layer", 0, last, default=0),
             finite_int(last_layer, "To layer", 0, last, default=last))
    first, final = sorted(given)  # a backward range is swapped, as the Rollout tab swaps it
    fusion = head_fusion if isinstance(head_fusion, str) and head_fusion in ("mean", "max", "min") else "mean"
    discard = finite_float(discard_ratio, "Discard ratio", 0.0, 0.95, default=0.0)
    if (fusion, discard, first, final) != ("mean", 0.0, 0, last):
        swapped = SWAPPED if given[0] > given[1] else ""
        maps[f"attention rollout ({fusion} of heads), layers {first}-{final}{swapped}, discard {discard:.2f}"] = (
            result.rollout(fusion, discard, start_layer=first, end_layer=final + 1))
    chosen_layer = finite_int(layer, "Layer", 0, last, default=last)
    chosen_head = None if flag(mean_heads, "Mean of heads") else finite_int(head, "Head", 0, result.num_heads - 1,
                                                                             default=0)
    if (chosen_layer, chosen_head) != (last, None):
        heads = "mean of heads" if chosen_head is None else f"head {chosen_head}"
        maps[f"raw attention, layer {chosen_layer}, {heads}"] = result.attention_map(chosen_layer, chosen_head)
    return maps, failures


@dataclass(frozen=True)
class FaithfulnessView:
    """The Faithfulness tab's components (``scored`` holds the session's `Scored` curves)."""

    tab: gr.Tab
    button: gr.Button
    progress: gr.Markdown  # where scoring shows its progress (`common.progress_slot`)
    figure: gr.Image
    table: gr.Dataframe
    note: gr.Markdown
    scored: gr.State
    sanity_button: gr.Button
    sanity_cancel: gr.Button
    sanity_progress: gr.Markdown  # where the sanity checks show their progress
    sanity_strip: gr.Image  # the cascading strip of maps
    sanity_curves: gr.Image  # the similarity curves
    sanity_table: gr.Dataframe
    sanity_note: gr.Markdown
    checked: gr.State  # the session's `sanity.Checked`

    @property
    def outputs(self) -> list:
        """What scoring writes here (the first view's verdicts follow these)."""
        return [self.scored, self.figure, self.table, self.note]

    @property
    def sanity_outputs(self) -> list:
        """What the sanity checks write here, the faithfulness table's verdict column last."""
        return [self.checked, self.sanity_strip, self.sanity_curves, self.sanity_table, self.sanity_note, self.table]


def layout(settings: PageSettings) -> FaithfulnessView:
    """The tab, its button and its results, inside the page's ``gr.Tabs``."""
    with gr.Tab("Faithfulness", elem_id="faithfulness-tab") as tab:
        gr.Markdown("Which map can you trust for this image? Each map's most relevant patches are removed "
                    "(deletion, positive perturbation) or inserted into a blurred copy (insertion), and the "
                    "model's score for the explained target is recorded (the class's probability, or for a "
                    "CLIP-style model the prompt's similarity; Petsiuk et al. 2018; Chefer et al. 2021). "
                    "The random map is the floor: a map marked **⚠** does worse than chance. "
                    "Changing the Grad-CAM block, the rollout options or the attention layer/head adds that "
                    "choice at the next **Score**, named with its settings; maps already scored are kept. "
                    "AttnLRP and LeGrad are computed first when the pass lacks them (one more forward and "
                    "backward pass). The verdicts under the **Overview** maps come from the same scores.")
        button = gr.Button("Score the maps (about 30 batched forward passes per map)", variant="primary",
                           elem_id="faithfulness-score")
        progress = progress_slot("faithfulness-progress")
        figure = OutputImage(label="Deletion and insertion curves", elem_id="faithfulness-curves", **FIGURE_OUT)
        table = gr.Dataframe(headers=HEADERS, label=TABLE_LABEL, interactive=False, wrap=True,
                             column_widths=["26%", *["9%"] * 6, "20%"],
                             elem_id="faithfulness-table")
        note = gr.Markdown(elem_id="faithfulness-note")
        scored = gr.State(None)
        gr.Markdown("**Does the map depend on the model, and on the class?** Sanity checks (Adebayo et al. 2018; "
                    "Sixt et al. 2020; Yeh et al. 2019): the model's blocks are re-drawn at random, the last one "
                    "first, down to the patch embedding, and every map is recomputed for the same class (or prompt); "
                    "a map that stays alike explains the image, not the model. Then the map for a random other "
                    "class (a zero-shot label, for a prompt), and the maps of slightly noisy inputs. The weights "
                    "are restored afterwards.",
                    elem_id="sanity-intro")
        with gr.Row():
            sanity_button = gr.Button(sanity.press_label(), variant="primary",
                                      elem_id="sanity-run")
            sanity_cancel = gr.Button("Cancel", elem_id="sanity-cancel")
        sanity_progress = progress_slot("sanity-progress")
        sanity_strip = OutputImage(label="Cascading randomisation", elem_id="sanity-strip", **FIGURE_OUT)
        sanity_curves = OutputImage(label="Similarity to the trained map", elem_id="sanity-curves", **FIGURE_OUT)
        sanity_table = gr.Dataframe(headers=sanity.HEADERS, label="Sanity checks of each map", interactive=False,
                                    wrap=True, column_widths=["30%", "12%", "20%", "12%", "14%", "12%"],
                                    elem_id="sanity-table")  # each header's longest word fits at 1366 pixels
        sanity_note = gr.Markdown(elem_id="sanity-note")
        checked = gr.State(None)
    return FaithfulnessView(tab, button, progress, figure, table, note, scored, sanity_button, sanity_cancel,
                            sanity_progress, sanity_strip, sanity_curves, sanity_table, sanity_note, checked)


class FaithfulnessTab:
    """The tab's handler. ``handle_of`` gives the model of a cache key; ``relevance(session, progress) ->
    session`` adds LeGrad and AttnLRP to the pass shown (the app's `Inspector.with_relevance`); without it
    they are scored only when the pass already holds them."""

    def __init__(self, handle_of: Callable, relevance: Callable | None = None):
        self.handle_of = handle_of
        self.relevance = relevance

    # Scores the maps of the session's image and class; ``values`` are the other tabs' raw controls.
    # (A comment, not a docstring: Gradio would publish a docstring as the endpoint's API description.)
    @shows_errors  # anything unforeseen is a sentence too, its traceback in the operator's log
    def score(self, current, scored: Scored | None, key=None, checked: sanity.Checked | None = None,
              progress=gr.Progress(), **values):
        try:
            scored, image, rows, note = self._score(self.handle_of, current, scored, progress, values, self.relevance)
            return (replace(scored, basis=Basis.of(current, key or current.model)), image,
                    with_verdicts(rows, scored.key, checked), note,
                    *[verdict(scored.curves, method) if method in scored.curves else NO_VERDICT
                      for method in VERDICT_ORDER])
        except VitInspectError as exc:  # its public sentence, server paths cut (a model reload's missing file)
            raise gr.Error(public_message(exc), print_exception=False) from None
        except ValueError as exc:
            raise gr.Error(redact_paths(str(exc)), print_exception=False) from None

    @staticmethod
    def _score(handle_of: Callable, current, scored: Scored | None, progress, values: dict,
               relevance: Callable | None = None):
        if current is None:
            raise ValueError("Analyse an image first; its maps are what gets scored.")
        if relevance is not None and current.result.target is not None:
            current = relevance(current, progress)
        result = current.result
        if result.target is None:
            raise ValueError("This model has no classification head, so there is no class score to perturb.")
        handle = handle_of(current.model)
        key = result_key(current)  # the same key as the sanity checks' (`with_verdicts`)
        known = dict(scored.curves) if scored is not None and scored.key == key else {}
        rng = image_permutation(result.rgb, result.layout.num_patches)
        permutation = rng.permutation(result.layout.num_patches)
        maps, failures = chosen_maps(result, rng, handle, **values)
        todo = {name: m for name, m in maps.items() if name not in known}
        if todo:
            progress(0, desc=f"Scoring {len(todo)} map(s)")
            pixels = handle.preprocess.normalize(result.rgb).to(handle.device)
            if result.prompt is not None or result.versus is not None:  # the prompt's similarity, as explained
                view, column, other, _, _ = prompt_view(handle, result.prompt or result.target,
                                                        result.versus or result.contrast)
                scorer = prompt_scorer(view, column, other, result.score)
            else:
                scorer = model_scorer(handle)
            known |= score_maps(scorer, pixels, result.layout, todo, result.target, result.target,
                                permutation, progress=lambda done, total: progress((done, total), unit="inputs"))
        standard = faithfulness_methods()
        while len(known) > MAX_SCORED_MAPS:  # drop the oldest extra choices, never a standard map
            extra = next((name for name in known if name not in standard), None)
            if extra is None:
                break
            known.pop(extra)
        explained = explained_words(handle, result)
        upload = getattr(current, "image_words", "")  # the upload and its geometry, as the session words them
        title = (f"{public_name(handle.name)}: {explained}; removed patches = mean colour, "
                 f"insertion from a Gaussian blur (kernel 11, σ 5)" + (f"\n{upload}" if upload else ""))
        score = ("cosine similarity" + (" minus the versus's" if result.contrast is not None else "")
                 if result.prompt is not None or result.versus is not None else "probability of the explained class")
        image = curves_panel(known, title, score)  # PIL: 7 ms, against 280 ms for a matplotlib figure (bench_upload 6m)
        rows = ranked_rows(known)
        flagged = [row[0] for row in rows if row[-1].startswith("⚠")]
        if result.prompt is not None or result.versus is not None:
            how = ("pos/neg: the prompt's cosine similarity with the image" + (", minus the versus prompt's,"
                   if result.contrast is not None else "") + " while the most/least relevant patches are removed "
                   "(area ×100 over 0–0.9); del/ins: the same similarity (area over 0–1). A similarity is not a "
                   "probability: compare each row with the random map's.")
        else:
            how = ("pos/neg: top-1 still the explained class while the most/least relevant patches are removed "
                   "(area ×100 over 0–0.9); del/ins: its probability (area over 0–1). One image is noisy: the "
                   "documentation's table over 200 images (Which map to trust) is steadier.")
        note = f"Scored {len(known)} maps for {explained}" + (f" of {upload}" if upload else "") + f". {how}"
        absent = [paper_name(name) for name in ("legrad", "attnlrp") if name not in maps]
        if absent:
            note += (f"\n\nNot scored: {'; '.join(absent)} ("
                     + ("not available for this model)" if relevance is not None else "not computed for this pass)"))
        if failures:
            note += "\n\nLeft out: " + "; ".join(f"{paper_name(name)}: {failure.public}"
                                                   for name, failure in failures.items())
        if flagged:
            note += f"\n\n**⚠ Worse than the random map on at least two of the four scores: {'; '.join(flagged)}.**"
        return Scored(key=key, curves=known, words=explained), image, rows, note


def wire(view: FaithfulnessView, ctx: TabContext) -> None:
    """The tab's events: its button (and the first view's Score) scores the session's maps on the model-pass
    queue, writing the tab's figure, table and note and the first view's verdicts, then the table's label, its
    progress shown in the tab's slot and the first view's; the sanity checks' button runs `sanity.SanityChecks`
    on the same queue (they change the model's weights while they run), writing their pictures, table and note
    and the faithfulness table's verdict column; Cancel stops them before their next pass, off the queue. A
    refusal is a sentence in the note under the button pressed, every result left as it was. Both results are
    under the page's stale-result check."""
    handlers = FaithfulnessTab(ctx.app.handle, ctx.app.with_relevance)
    checks = sanity.SanityChecks(ctx.app.handle, ctx.app.store)
    first = ctx.page.overview  # the first view: its Score button, its verdicts and its progress slot
    session, key, controls = ctx.session, ctx.key, ctx.controls
    also, verdicts, also_progress = [first.score.click], list(first.verdicts), [first.progress]
    scored = gr.on([view.button.click, *also], says_refusals(handlers.score, view.note),
                   inputs=[session, view.scored, key, view.checked],
                   inputs_kwargs=controls, outputs=[*view.outputs, *verdicts], api_name="faithfulness",
                   show_progress_on=[view.progress, *also_progress], **RAW, **MODEL_PASS)
    scored.success(table_label, inputs=[view.scored], outputs=[view.table], api_name="faithfulness_table_label",
                   show_progress="hidden")
    gr.on([view.sanity_button.click], says_refusals(checks.handler(table_of), view.sanity_note),
          inputs=[session, view.checked, view.scored, key],
          outputs=view.sanity_outputs, api_name="sanity_checks", show_progress_on=[view.sanity_progress], **RAW,
          **MODEL_PASS)
    gr.on([view.sanity_cancel.click], shows_errors(checks.cancel), outputs=[view.sanity_note],
          api_name="cancel_sanity_checks", show_progress="hidden", queue=False, **RAW)
    ctx.track(Tracked("faithfulness", view.scored, (view.figure, view.table, view.note, *verdicts),
                      (None, None, NOTE, *(first.not_scored,) * len(verdicts)), "class",
                      f"**{first.score_label}** (Overview) or **Score the maps**"))
    ctx.track(Tracked("sanity", view.checked, (view.sanity_strip, view.sanity_curves, view.sanity_table,
                                               view.sanity_note), (None, None, None, NOTE), "class",
                      f"**{sanity.PRESS}**", reset=sanity.released))
    ctx.after_check(table_label, [view.scored], [view.table], "faithfulness_label")  # scores cleared: its label


def table_label(scored: Scored | None):
    """The table's label names what its rows score (a class, or a prompt and its versus prompt)."""
    words = getattr(scored, "words", "")
    return gr.update(label=f"Areas under the curves for {words}, sorted by {SORTED_BY}" if words else TABLE_LABEL)
