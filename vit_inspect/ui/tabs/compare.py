"""The Compare tab: the same image through a second model, aligned views and agreement numbers.

The handlers (`CompareTab`) take the page's `Inspector` (model cache, limits, and the validated
`load_model`). Both passes run on the model-pass queue through the app's pass (`app.run_pass`, under ZeroGPU
when available, without LeGrad and AttnLRP, which this tab does not show); the comparison lives in the app's
byte-bounded session store (`app.store`) and gr.State holds only its slot, so sliders redraw from there and
an evicted comparison says so.

Both models explain one class by default, so that the agreement of their gradient maps answers one question:
the class explained on the page (A's top class until another is chosen), named in every caption. Where the
label sets differ (another label set, or a model without a head) the tab says so and each model explains its
own top class, which can also be asked for explicitly. A comparison records what it was made from (model A,
image, class, and model B); a change to any of them clears it (`ui.stale`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import gradio as gr
import numpy as np
from gradio import utils as gradio_utils

from vit_inspect.analysis.compare import matching_layer
from vit_inspect.analysis.dino import BACKGROUND_THRESHOLD, DINO_MASS, feature_pca
from vit_inspect.core.errors import InputError, VitInspectError
from vit_inspect.core.geometry import parse_size
from vit_inspect.core.images import load_image
from vit_inspect.passes.options import STUDY_OPTIONS
from vit_inspect.plots import compare as compare_plots
from vit_inspect.plots import model as model_plots
from vit_inspect.studies.comparison import (Comparison, aligned_maps, compare_images, comparison_label,
                                            last_layer_heads, layer_words, same_labels, token_agreement)
from vit_inspect.studies.model_report import model_report
from vit_inspect.ui.common import (MAP_OUT, MODEL_PASS, RAW, OutputImage, progress_slot, public_name, says_refusals,
                                   shows_errors, upload_source)
from vit_inspect.ui.context import PageSettings, TabContext
from vit_inspect.ui.session_store import Slot
from vit_inspect.ui.stale import KEEP, NOTE, Basis, Tracked
from vit_inspect.ui.untrusted import client_files, finite_float, finite_int, flag, text

MAX_PCA_IMAGES = 8  # images in one joint feature PCA, the comparison's own included
MAX_PATCHES = 1024  # patches of B's input at most (32x32): attention memory grows with its square
TABLE_HEADERS = ["map", "layers (A ↔ B)", "Spearman ρ", "top-10 % overlap", "common grid"]
SAME_CLASS, OWN_CLASS = "the same class for both", "each model's own top class"  # the class choices
PRESS = "Compare"


@dataclass(frozen=True)
class CompareSession:
    """One user's comparison, held in the app's session store: both passes (memory is their sum) and the PCA
    inputs."""

    comparison: Comparison
    labels: tuple[str, str]  # "A: name (H×W)", "B: name (H×W)"
    features: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]  # per model: (grid_h, grid_w, D) per image
    crops: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]  # per model: the crop of each PCA image
    names: tuple[str, ...]  # file names of the PCA images
    classes: tuple[str, str] = ("", "")  # the class each model explains, in words: "tabby, tabby cat (#281)"
    class_note: str = ""  # which classes are explained, and why

    def nbytes(self) -> int:
        """Bytes held: both passes, the PCA features and crops."""
        return self.comparison.nbytes() + sum(a.nbytes for group in (*self.features, *self.crops) for a in group)


def _rho(value: float) -> str:
    return "n/a (constant map)" if np.isnan(value) else f"{value:.3f}"


def agreement_rows(state: CompareSession, layer: int) -> list[list[str]]:
    """The agreement table: every map kind at model A's `layer` and its aligned layer, then the
    class-vs-distillation rows of a distilled model."""
    comparison = state.comparison
    rows = []
    for item in aligned_maps(comparison, layer_a=layer):
        score = item.agreement
        layers = f"{item.layer_a} ↔ {item.layer_b}" if item.layered else "all"
        rows.append([item.title, layers, _rho(score.spearman), f"{score.top_overlap:.2f}",
                     f"{score.grid[0]}×{score.grid[1]}"])
    for label, result in zip(state.labels, (comparison.a, comparison.b)):
        if result.layout.num_dist_tokens and result.layout.has_class_token:
            for name, score in token_agreement(result).items():
                kind = "rollout" if name == "rollout" else "attention (mean of heads)"
                rows.append([f"{label[:1]}: class vs distillation token, {kind}", name, _rho(score.spearman),
                             f"{score.top_overlap:.2f}", f"{score.grid[0]}×{score.grid[1]}"])
    return rows


def mapping_note(state: CompareSession, layer: int) -> str:
    a, b = state.comparison.a, state.comparison.b
    other = matching_layer(layer, a.depth, b.depth)
    return (f"{state.class_note}\n\n" if state.class_note else "") + (
            f"**Relative depth** (l+1)/L, layers numbered from 0: A's {layer_words(layer, a.depth)} ↔ "
            f"B's {layer_words(other, b.depth)}. B's layer = ceil((l+1)·{b.depth}/{a.depth}) − 1, the shallowest at "
            "or beyond A's relative depth. Agreement is measured over the part of the photo both crops cover, both "
            "maps resampled bilinearly to the finer grid.")


def layer_views(state: CompareSession, layer: int) -> tuple[np.ndarray, list[list[str]], str]:
    """(aligned maps figure, agreement table, mapping note) at model A's `layer`."""
    aligned = aligned_maps(state.comparison, layer_a=layer)
    figure = compare_plots.aligned_maps_panel(state.comparison, aligned, *state.labels,  # PIL: ≈ 30x a figure's speed
                                              classes=state.classes if all(state.classes) else None)
    return figure, agreement_rows(state, layer), mapping_note(state, layer)


def dino_views(state: CompareSession, mass: float) -> list[np.ndarray]:
    """Both models' last-layer heads with the masks holding `mass` of the attention."""
    images = []
    for result, label in zip((state.comparison.a, state.comparison.b), state.labels):
        maps, masks = last_layer_heads(result, mass)
        images.append(compare_plots.dino_heads_panel(result, maps, masks, label, mass))  # PIL: see its docstring
    return images


def pca_views(state: CompareSession, remove_background: bool, threshold: float) -> list[np.ndarray]:
    """Each model's feature PCA of the session's images (fitted jointly over them)."""
    try:
        fits = [feature_pca(state.features[index], threshold if remove_background else None) for index in range(2)]
    except ValueError as exc:  # e.g. fewer than two foreground patches at this threshold
        raise InputError(f"{str(exc).capitalize()}.") from None
    return [compare_plots.feature_pca_panel(list(state.crops[index]), fits[index], list(state.names), state.labels[index])
            for index in range(2)]


def _mass(value: object) -> float:
    return finite_float(value, "The share of attention mass", 0.05, 1.0, default=DINO_MASS, clamp=False)


def _background(remove: object, threshold: object) -> tuple[bool, float]:
    return (flag(remove, "Remove the background"),
            finite_float(threshold, "The background threshold", 0.0, 1.0, default=BACKGROUND_THRESHOLD))


class CompareTab:
    """The tab's handlers: UI values in, library calls, UI values out."""

    def __init__(self, app, upload_source):
        self.app = app  # the page's Inspector: model cache, limits, validated model loading
        self.upload_source = upload_source  # the reading of a raw gr.Image value (`common.upload_source`)

    def load_second(self, name: str | None, weights: str | None, progress=gr.Progress()):
        key, described = self.app.load_model(name, weights, progress)[:2]  # the first model's checks and messages
        return key, described.replace("**Model**", "**Model B**", 1)

    @staticmethod
    def targets(session, key_a, handle_a, handle_b, wanted: object) -> tuple[int | None, int | None, str]:
        """(A's class, B's class, a line saying which classes are explained and why): by default both the
        page's class (A's top class until another is chosen), where the label sets agree; else, or when
        ``wanted`` is OWN_CLASS, each model's own top class (None: the pass picks it)."""
        own = wanted == OWN_CLASS
        if not (handle_a.has_head and handle_b.has_head):
            which = "A" if not handle_a.has_head else "B"
            return None, None, (f"**Model {which} has no classification head**: there is no class to share, so only "
                                "the maps that need none (attention, rollout) are compared.")
        target = None if own or session is None or session.model != key_a else session.target[0]
        if isinstance(target, str):  # a prompt: asked of both where both have a text tower
            if handle_a.clip is not None and handle_b.clip is not None:
                return target, target, (f"**Both models explain the prompt {target!r}**, so the agreement "
                                        "compares the models alone.")
            return None, None, (f"**Model B has no text tower**, so it cannot read the prompt {target!r}: each "
                                "model explains its own top class, and the agreement of their gradient maps mixes "
                                "the question with the model.")
        if not same_labels(handle_a, handle_b):
            return target, None, (f"**A and B have different label sets** ({len(handle_a.labels)} and "
                                  f"{len(handle_b.labels)} classes{' named differently' if len(handle_a.labels) == len(handle_b.labels) else ''}): "
                                  "one class cannot be asked of both, so each explains its own top class, and the "
                                  "agreement of their gradient maps mixes the class with the model.")
        if own:
            return None, None, ("**Each model explains its own top class** (asked for above): the agreement of "
                                "the gradient maps then mixes the class with the model.")
        return target, target, "**Both models explain the same class**, so the agreement compares the models alone."

    def run(self, image: dict | None, key_a, key_b, size_b: str | None, mass, remove_background, threshold,
            session=None, wanted: object = SAME_CLASS, progress=gr.Progress()):
        upload = self.upload_source(image, self.app.config.limits.max_bytes)
        if upload is None:
            raise InputError("Upload an image first (left), then press Compare.")
        if key_b is None:
            raise InputError("Load model B first (above).")
        source, name = upload
        mass, (remove_background, threshold) = _mass(mass), _background(remove_background, threshold)
        try:
            size = parse_size(text(size_b, "B's input size", 20) or None)
        except VitInspectError:
            raise InputError("B's input size must look like 224x320 (height × width in pixels).") from None
        picture = load_image(source, self.app.config.limits)
        progress(0.1, desc="Loading both models")
        handle_a, handle_b = self.app.handle(key_a), self.app.handle(key_b)
        if size is not None:
            ph, pw = handle_b.patch_size
            if size[0] < ph or size[1] < pw:
                raise InputError(f"B's input {size[0]}×{size[1]} is smaller than one {ph}×{pw} patch.")
            if handle_b.layout(size).num_patches > MAX_PATCHES:
                raise InputError(f"{size[0]}×{size[1]} pixels make more than {MAX_PATCHES} patches of {ph}×{pw}; "
                                 "choose a smaller input size for B.")
        target_a, target_b, class_note = self.targets(session, key_a, handle_a, handle_b, wanted)
        progress(0.3, desc="One pass per model (forward and backward)")
        comparison = compare_images(handle_a, handle_b, picture, None, size,  # no LeGrad/AttnLRP shown here
                                    run_pass=functools.partial(self.app.run_pass, relevance=False),
                                    target_a=target_a, target_b=target_b)
        labels = (comparison_label(handle_a, "A", None, public_name(handle_a.name)),  # a server folder by its base name
                  comparison_label(handle_b, "B", size, public_name(handle_b.name)))
        classes = tuple("" if r.target is None else f"prompt {r.prompt.text!r}" if r.prompt is not None
                        else f"{h.label(r.target)} (#{r.target})"
                        for h, r in ((handle_a, comparison.a), (handle_b, comparison.b)))
        state = CompareSession(comparison=comparison, labels=labels,
                               features=((comparison.a.patch_features.astype(np.float32),),
                                         (comparison.b.patch_features.astype(np.float32),)),
                               crops=((comparison.a.rgb,), (comparison.b.rgb,)), names=(name,), classes=classes,
                               class_note=class_note + "".join(f" {k}: {v}." for k, v in zip("AB", classes) if v))
        progress(0.7, desc="Drawing")
        layer = comparison.a.depth - 1
        figure, rows, note = layer_views(state, layer)
        results = (comparison.a, comparison.b)
        distance, _ = compare_plots.compare_distance_panel(
            [r.mean_distance for r in results], list(labels), [r.layout.input_size[1] for r in results],
            title=f"mean attention distance: {name}")
        top = [{f"{t['label']} (#{t['index']})": t["prob"] for t in h.top_labels(r.probs, 5)} if r.probs.size else None
               for h, r in ((handle_a, comparison.a), (handle_b, comparison.b))]
        reports = [model_report(h) for h in (handle_a, handle_b)]
        filters = compare_plots.side_by_side([model_plots.filter_pca_panel(r.filter_pca, label)
                                              for r, label in zip(reports, labels)])
        similarity = [model_plots.pos_similarity_panel(r.pos_similarity, f"{label}: position embedding similarity")
                      for r, label in zip(reports, labels) if r.pos_similarity is not None]
        heads = dino_views(state, mass)
        pca = pca_views(state, remove_background, threshold)
        slot = self.app.store.put(state, state.nbytes())
        made_from = Basis.of(session, key_a, extra=key_b)
        return (made_from, slot, gr.update(maximum=layer, value=layer), note, *top, figure, rows, distance, filters,
                compare_plots.side_by_side(similarity) if similarity else None, *heads, *pca)

    def relayer(self, slot: Slot | None, layer):
        if slot is None:
            return gr.skip(), gr.skip(), gr.skip()
        state = slot.get()
        last = state.comparison.a.depth - 1
        return layer_views(state, finite_int(layer, "A's layer", 0, last, default=last))

    def remask(self, slot: Slot | None, mass):
        if slot is None:
            return gr.skip(), gr.skip()
        return dino_views(slot.get(), _mass(mass))

    def repca(self, slot: Slot | None, remove_background, threshold):
        if slot is None:
            return gr.skip(), gr.skip()
        return pca_views(slot.get(), *_background(remove_background, threshold))

    def joint_pca(self, slot: Slot | None, files: list[str] | None, key_a, key_b, remove_background,
                  threshold, progress=gr.Progress()):
        """Add the uploaded images to both models' feature PCA (one forward pass each, no gradients)."""
        if slot is None:
            raise InputError("Press Compare first; the joint PCA adds images to that comparison.")
        state = slot.get()
        background = _background(remove_background, threshold)
        if isinstance(files, (list, tuple)) and len(files) > MAX_PCA_IMAGES - 1:
            raise InputError(f"Upload between 1 and {MAX_PCA_IMAGES - 1} more images for a joint PCA.")
        uploads = client_files(files, [gradio_utils.get_upload_folder()], self.app.config.limits.max_bytes,
                               MAX_PCA_IMAGES - 1)
        if not uploads:
            raise InputError(f"Upload between 1 and {MAX_PCA_IMAGES - 1} more images for a joint PCA.")
        handles = (self.app.handle(key_a), self.app.handle(key_b))
        sizes = (state.comparison.a.layout.input_size, state.comparison.b.layout.input_size)
        features, crops = [list(f[:1]) for f in state.features], [list(c[:1]) for c in state.crops]
        names = [state.names[0]]
        for done, (source, file_name) in enumerate(uploads, 1):
            progress((done, len(uploads)), unit="images")
            picture = load_image(source, self.app.config.limits)
            for index in range(2):
                result = self.app.run_pass(handles[index], picture, None,
                                           STUDY_OPTIONS.replace(input_size=sizes[index], gradients=False))
                features[index].append(result.patch_features.astype(np.float32))
                crops[index].append(result.rgb)
            names.append(file_name)
        state = replace(state, features=tuple(map(tuple, features)), crops=tuple(map(tuple, crops)), names=tuple(names))
        slot.set(state, state.nbytes())
        return slot, *pca_views(state, *background)


@dataclass(frozen=True)
class CompareView:
    """The Compare tab's components (``key_b``: model B's cache key; ``state``: the session's comparison slot)."""

    tab: gr.Tab
    key_b: gr.State
    state: gr.State
    made_from: gr.State  # the `stale.Basis` of the comparison shown (model A, image, class; model B as its extra)
    classes: gr.Radio
    name_b: gr.Dropdown
    weights_b: gr.File
    size_b: gr.Textbox
    load_b: gr.Button
    run: gr.Button
    progress: gr.Markdown  # where loading model B and comparing show their progress (`common.progress_slot`)
    status_b: gr.Markdown
    top_a: gr.Label
    top_b: gr.Label
    layer: gr.Slider
    note: gr.Markdown
    table: gr.Dataframe
    maps: gr.Image
    distance: gr.Image
    filters: gr.Image
    similarity: gr.Image
    mass: gr.Slider
    heads_a: gr.Image
    heads_b: gr.Image
    remove_background: gr.Checkbox
    threshold: gr.Slider
    pca_files: gr.File
    pca_button: gr.Button
    pca_a: gr.Image
    pca_b: gr.Image

    @property
    def results(self) -> list:
        """What Compare shows of a comparison, in `CompareTab.run`'s order after ``made_from`` and the slot."""
        return [self.layer, self.note, self.top_a, self.top_b, self.maps, self.table, self.distance, self.filters,
                self.similarity, self.heads_a, self.heads_b, self.pca_a, self.pca_b]


def layout(settings: PageSettings) -> CompareView:
    """The tab, its controls and figures, inside the page's sections; ``settings.models`` are the choices model
    B's picker offers."""
    models, session_ttl_s = settings.models, settings.session_ttl_s
    figure_out = MAP_OUT | dict(buttons=["download"])  # figures title themselves
    with gr.Tab("Compare", elem_id="compare-tab") as tab:
        gr.Markdown("The same image through a second model (B), next to the model loaded on the left (A). Both "
                    "passes stay in your session, so it holds both (memory is the sum, counted in the server's "
                    "memory budget).")
        key_b = gr.State(None)
        state = gr.State(None, time_to_live=session_ttl_s)
        made_from = gr.State(None)
        with gr.Row():
            name_b = gr.Dropdown(list(models), value=None, label="Model B", allow_custom_value=True, scale=2,
                                 info="Curated list, any timm ViT name, or a Hugging Face id.", elem_id="compare-model")
            weights_b = gr.File(label="Own weights for B (.safetensors, with a timm name)", file_types=[".safetensors"],
                                type="filepath", height=100, scale=2, elem_id="compare-weights")
            size_b = gr.Textbox(label="B's input size (H×W, blank: its own)", placeholder="e.g. 224x320", scale=1,
                                elem_id="compare-size")
        classes = gr.Radio([SAME_CLASS, OWN_CLASS], value=SAME_CLASS, label="Class the gradient maps explain",
                           info="The same class: the one under Class to explain (left), A's top class until "
                                "another is chosen. Where the label sets differ, each model's own top class.",
                           elem_id="compare-classes")
        with gr.Row():
            load_b = gr.Button("Load model B", elem_id="compare-load")
            run = gr.Button("Compare", variant="primary", elem_id="compare-run")
        progress = progress_slot("compare-progress")
        status_b = gr.Markdown("No model B yet.", elem_id="compare-status")
        with gr.Row():
            top_a = gr.Label(num_top_classes=5, label="A: top-5", elem_id="compare-top-a")
            top_b = gr.Label(num_top_classes=5, label="B: top-5", elem_id="compare-top-b")
        layer = gr.Slider(0, 11, value=11, step=1, label="A's layer (B's follows at the same relative depth)",
                          elem_id="compare-layer")
        note = gr.Markdown(elem_id="compare-note")
        table = gr.Dataframe(headers=TABLE_HEADERS, label="Agreement between the maps", interactive=False, wrap=True,
                             column_widths=["40%", "15%", "15%", "15%", "15%"],
                             elem_id="compare-table")
        maps = OutputImage(label="Aligned maps", elem_id="compare-maps-ab", **figure_out)
        distance = OutputImage(label="Mean attention distance against relative depth (ViT Fig. 7 right, both models)",
                               elem_id="compare-distance", **figure_out)
        filters = OutputImage(label="Patch-embedding filters (ViT Fig. 7 left), A | B", **figure_out)
        similarity = OutputImage(label="Position-embedding similarity (ViT Fig. 7 centre), A | B", **figure_out)
        mass = gr.Slider(0.1, 1.0, value=DINO_MASS, step=0.05, label="DINO masks: share of attention mass kept",
                         elem_id="compare-mass")
        heads_a = OutputImage(label="A: last-layer heads (Caron et al. 2021)", elem_id="compare-heads-a",
                              **figure_out)  # one under the other: each at its own size, its text never shrunk
        heads_b = OutputImage(label="B: last-layer heads", elem_id="compare-heads-b", **figure_out)
        with gr.Row():
            remove_background = gr.Checkbox(False, label="Feature PCA: remove the background (first component)")
            threshold = gr.Slider(0.0, 1.0, value=BACKGROUND_THRESHOLD, step=0.05, label="Background threshold")
        with gr.Row():
            pca_files = gr.File(label=f"More images for a joint feature PCA (up to {MAX_PCA_IMAGES - 1})",
                                file_count="multiple", file_types=["image"], type="filepath", height=100, scale=3)
            pca_button = gr.Button("Fit the PCA jointly", scale=1)
        pca_a = OutputImage(label="A: PCA of patch features (Oquab et al. 2023)", elem_id="compare-pca-a",
                            **figure_out)
        pca_b = OutputImage(label="B: PCA of patch features", elem_id="compare-pca-b", **figure_out)
    return CompareView(tab, key_b, state, made_from, classes, name_b, weights_b, size_b, load_b, run, progress,
                       status_b, top_a, top_b, layer, note, table, maps, distance, filters, similarity, mass, heads_a,
                       heads_b, remove_background, threshold, pca_files, pca_button, pca_a, pca_b)


def wire(view: CompareView, ctx: TabContext) -> None:
    """The tab's events: model B loaded on its button, both passes on Compare (the page's ``image`` through
    model A of ``key`` and model B), the slider and PCA options redrawn from the session's comparison, and
    more images added to the joint PCA; every handler's library exceptions become one sentence (a refused
    load in model B's status line, a refused comparison or PCA in the tab's note, every result left as it was).
    The comparison is under the page's stale-result check, which model B's loading triggers too."""
    handlers, image, key, session = CompareTab(ctx.app, upload_source), ctx.image, ctx.key, ctx.session
    loaded = gr.on([view.load_b.click], says_refusals(handlers.load_second, view.status_b),
                   inputs=[view.name_b, view.weights_b],
                   outputs=[view.key_b, view.status_b], api_name="compare_load_model",
                   show_progress_on=[view.progress], **RAW)
    gr.on([view.run.click], says_refusals(handlers.run, view.note),
          inputs=[image, key, view.key_b, view.size_b, view.mass, view.remove_background, view.threshold, session,
                  view.classes],
          outputs=[view.made_from, view.state, *view.results], api_name="compare_models",
          show_progress_on=[view.progress], **RAW, **MODEL_PASS)
    gr.on([view.layer.input], shows_errors(handlers.relayer), inputs=[view.state, view.layer],
          outputs=[view.maps, view.table, view.note], api_name="compare_layer", trigger_mode="always_last",
          show_progress="hidden", **RAW)
    gr.on([view.mass.input], shows_errors(handlers.remask), inputs=[view.state, view.mass],
          outputs=[view.heads_a, view.heads_b], api_name="compare_mass", trigger_mode="always_last",
          show_progress="hidden", **RAW)
    gr.on([view.remove_background.input, view.threshold.input], shows_errors(handlers.repca),
          inputs=[view.state, view.remove_background, view.threshold], outputs=[view.pca_a, view.pca_b],
          api_name="compare_pca", trigger_mode="always_last", show_progress="hidden", **RAW)
    gr.on([view.pca_button.click], says_refusals(handlers.joint_pca, view.note, appended=gr.skip()),
          inputs=[view.state, view.pca_files, key, view.key_b, view.remove_background, view.threshold],
          outputs=[view.state, view.pca_a, view.pca_b, view.note], api_name="compare_joint_pca",
          show_progress_on=[view.pca_a, view.pca_b], **RAW, **MODEL_PASS)  # on the pictures it draws, not the note
    ctx.events["model_b"] = loaded
    ctx.track(Tracked("compare", view.made_from, (view.state, *view.results),
                      (None, KEEP, NOTE, *[None] * (len(view.results) - 2)), "class", f"**{PRESS}**",
                      extra=view.key_b))
