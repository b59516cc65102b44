"""What a user waits for after an upload: the app's answer to a new image (`Inspector.analyze`: the pass,
then the maps it shows at once), against the pass alone and against drawing every per-image panel and
the distance scatter before answering, as the app did before the figures moved to the events that follow
the answer (`LATER_PANELS`: the distance scatter, all maps side by side, all heads of a layer).

6. answer to a new image ÷ the pass alone                       (drawing the first maps is what it adds)
6b. every panel drawn before answering ÷ answer                 (what moving the figures saves)
6c. the figures drawn afterwards, each ÷ the pass               (what the page fills in after the answer)
6d. with ``--before-tree``: each figure as another version draws it ÷ as this checkout does (that version's
    `vit_inspect.ui.panels.draw_panels` on the same session and view, its own scatter rendered afresh; e.g.
    the distance scatter, all maps and all heads as matplotlib figures in afcd7f7, PIL panels now:
    `distance_plots.attention_distance_panel`, `maps_panel`, `heads_panel`), and one Heads-tab
    heatmap as a change of layer or head redraws it (`vit_inspect.ui.tabs.heads.heatmap` on the pass's
    first-order values, another cell outlined each time: a matplotlib figure in afcd7f7,
    `head_plots.head_heatmap_panel` now)
6e. the Heads tab's logit-lens plot as a matplotlib figure (`plots.heads.lens_figure`, the CLI's, which the app
    drew before) ÷ as the app draws it now (`head_plots.lens_panel`), on this pass's lens
6f. the Compare tab's aligned maps (the model against itself, the image's four maps) as a matplotlib figure
    (`compare_plots.aligned_maps_figure`, the CLI's, which the app drew before) ÷ as the app draws them now
    (`compare_plots.aligned_maps_panel`), what a change of model A's layer redraws
6g. the Model tab's patch-embedding filter components as a matplotlib figure (`model_plots.filter_pca_figure`, the
    CLI's, which the app drew before) ÷ as the app draws them now (`model_plots.filter_pca_panel`): the tab's
    first picture, and one per model in a Compare run
6h. the same for the position-embedding similarity at the model's grid (`model_plots.pos_similarity_figure` ÷
    `model_plots.pos_similarity_panel`)
6i. the Compare tab's last-layer heads with their DINO mass sets, one model, as a matplotlib figure
    (`compare_plots.dino_heads_figure`, the CLI's) ÷ as the app draws them now (`compare_plots.dino_heads_panel`):
    what a move of the mass slider redraws, per model
6j. the same for the feature PCA of one image, background removed (`compare_plots.feature_pca_figure` ÷
    `compare_plots.feature_pca_panel`): what a change of the background setting redraws, per model
6k. the Compare tab's mean attention distance of both models (the model against itself) as a matplotlib figure
    (`compare_plots.compare_distance_figure`, the CLI's) ÷ as the app draws it now
    (`compare_plots.compare_distance_panel`): once per Compare run
6l. the dataset-level mean attention distance (this image's distances stand in for a folder's mean) as a
    matplotlib figure (`distance_plots.attention_distance_figure`) ÷ as the app draws it now
    (`distance_plots.attention_distance_panel(selectable=False)`): once per dataset job
6m. the Faithfulness tab's deletion and insertion curves of the scored maps (seven maps' curves, made up:
    drawing does not depend on the values) as a matplotlib figure (the app's before this change, kept here as
    `faithfulness_figure`) ÷ as the app draws them now (`faithfulness_plot.curves_panel`): once per scoring

One process, the app's own handler and session (an upload as a base64 data URL, as a client may send it),
candidates interleaved (bench.common.measure). With ``--weights`` (default: the DeiT-Ti file in checkpoints/
or the data folder beside the checkout when present) the real model, else random weights.

    python -m bench.bench_upload [--repeats 7] [--threads 2] [--image assets/chelsea.png] [--before-tree DIR]

    git archive REV vit_inspect | tar -x -C /tmp/before_tree   # REV: the version to compare with
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import itertools
from pathlib import Path

import numpy as np

from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.inspector import LATER_PANELS, Inspector
from vit_inspect.ui.panels import IMAGE_PANELS
from vit_inspect.ui.view import View

from .common import REPO, SHARED, THREADS, figure_image, markdown_table, measure, other_module, print_header, set_threads


class _Quiet:
    """A stand-in for gr.Progress outside an event."""

    def __call__(self, *args, **kwargs) -> None:
        return None


CONTROLS = dict(layer=11, head=0, mean_heads=False, query="class / readout token", row=0, col=0, head_fusion="mean",
                discard_ratio=0.0, first_layer=0, last_layer=11, gradcam_layer=11)


def faithfulness_figure(curves: dict, title: str):
    """The Faithfulness tab's curves as the app drew them before `faithfulness_plot.curves_panel`: a matplotlib
    Figure, deletion and insertion side by side, the random map dashed, "method (AUC)" legends."""
    from matplotlib.figure import Figure

    from vit_inspect.analysis.faithfulness import DEL_INS_FRACTIONS
    from vit_inspect.plots.faithfulness import PANELS, RANDOM

    fig = Figure(figsize=(10, 4), layout="constrained")
    fig.suptitle(title, fontsize="medium")
    for position, (field, name, verb) in enumerate(PANELS, 1):
        ax = fig.add_subplot(1, 2, position)
        for method, c in curves.items():
            style = dict(color="black", linestyle="--") if method == RANDOM else {}
            area = c.auc("del" if field == "deletion" else "ins")
            ax.plot(DEL_INS_FRACTIONS, getattr(c, field), label=f"{method} ({area:.3f})", **style)
        ax.set(title=name, xlabel=f"fraction of patches {verb}", ylabel="probability of the explained class",
               xlim=(0, 1), ylim=(0, None))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", title="method (AUC)", title_fontsize="x-small")
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--image", type=Path, default=REPO / "assets" / "chelsea.png")
    parser.add_argument("--weights", type=Path, default=None)
    parser.add_argument("--before-tree", type=Path, default=None,
                        help="a folder holding another version's vit_inspect, whose figures are timed too (6d)")
    args = parser.parse_args()
    set_threads(args.threads)

    from vit_inspect.analysis.dino import BACKGROUND_THRESHOLD, DINO_MASS, feature_pca
    from vit_inspect.analysis.faithfulness import DEL_INS_FRACTIONS, Curves
    from vit_inspect.analysis.logit_lens import lens_probs, lens_ranks
    from vit_inspect.core.geometry import InputGeometry
    from vit_inspect.core.images import load_image
    from vit_inspect.plots import compare as compare_plots
    from vit_inspect.plots import distance as distance_plots
    from vit_inspect.plots import faithfulness as faithfulness_plot
    from vit_inspect.plots import heads as head_plots
    from vit_inspect.plots import model as model_plots
    from vit_inspect.studies.comparison import aligned_maps, compare_images, last_layer_heads
    from vit_inspect.studies.model_report import model_report
    from vit_inspect.ui.model_cache import ModelCache
    from vit_inspect.ui.panels import draw_panels
    from vit_inspect.ui.tabs import heads as heads_ui

    weights = args.weights or next((p for p in (REPO / "checkpoints" / "deit_tiny_patch16_224.safetensors",
                                                SHARED / "models" / "deit_tiny_patch16_224.safetensors")
                                    if p.is_file()), None)
    config = AppConfig(weights=str(weights) if weights else None, device="cpu")
    inspector = Inspector(config, ModelCache(1) if weights else ModelCache(1, loader=_random_loader))
    handle = inspector.handle(inspector.default_key)
    upload = {"url": "data:image/png;base64," + base64.b64encode(args.image.read_bytes()).decode(),
              "orig_name": args.image.name}
    controls = dict(CONTROLS, last_layer=handle.depth - 1, layer=handle.depth - 1, gradcam_layer=handle.depth - 1)
    answered = inspector.analyze(upload, inspector.default_key, None, None, progress=_Quiet(), **controls)
    session = answered[0]
    view = View.from_controls(session.result, **controls)
    picture = session.source

    def answer():
        return inspector.analyze(upload, inspector.default_key, None, None, progress=_Quiet(), **controls)

    def pass_alone():
        return inspector._pass(handle, picture, InputGeometry(), relevance=False)

    def everything_first():  # the earlier answer: the pass, then every panel and the scatter before answering
        result = inspector._pass(handle, picture, InputGeometry(), relevance=False)
        scatter = distance_plots.attention_distance_panel(result.mean_distance, result.layout.input_size[1], "t")
        return scatter, draw_panels(IMAGE_PANELS, session, view)

    def figure(name, panels=draw_panels, holder=distance_plots.DistanceScatterOnce):
        def draw():
            fresh = holder(session.distance.distances, session.distance.image_width, "t")
            shown = dataclasses.replace(session, distance=fresh)  # each call renders its scatter, as a new image's does
            return panels((name,), shown, view)
        return draw

    def lens(draw):
        readout = session.result.heads.lens["readout"]
        final = int(readout[-1].argmax())
        ranks, probs = lens_ranks(readout, final), lens_probs(readout)[:, final]
        return lambda: draw(ranks, probs, "title: logit lens, final class")

    pair = compare_images(handle, handle, load_image(args.image), None, None)
    layers = itertools.cycle(range(handle.depth))

    def aligned(draw):
        return lambda: draw(pair, aligned_maps(pair, layer_a=next(layers)), "A", "B")

    report = model_report(handle)
    model_title = "model: patch-embedding filters"

    def filters_figure():
        fig = model_plots.filter_pca_figure(report.filter_pca)
        fig.suptitle(f"{model_title}\n{fig.get_suptitle()}")
        return figure_image(fig)

    heads_maps, heads_masks = last_layer_heads(pair.a, DINO_MASS)
    fit = feature_pca((pair.a.patch_features.astype(np.float32),), BACKGROUND_THRESHOLD)
    dino = (pair.a, heads_maps, heads_masks, "A", DINO_MASS)
    pca = ([pair.a.rgb], fit, [args.image.name], "A")

    distances = ([pair.a.mean_distance] * 2, ["A", "B"], [pair.a.layout.input_size[1]] * 2, "title")
    falling = np.exp(-np.outer(np.arange(2, 9), DEL_INS_FRACTIONS))  # (7, 11): seven maps' curves
    curves = {name: Curves(pos=np.ones(10), neg=np.ones(10), deletion=d, insertion=1 - d)
              for name, d in zip(("attention", "rollout", "gradcam", "chefer", "legrad", "attnlrp", "random"), falling)}
    curves_title = f"{handle.name}: class 'x' (#0); removed patches = mean colour, insertion from a Gaussian blur"

    candidates = {"answer": answer, "pass": pass_alone, "everything first": everything_first,
                  "Compare distance": lambda: compare_plots.compare_distance_panel(*distances),
                  "Compare distance as a matplotlib figure": lambda: figure_image(
                      compare_plots.compare_distance_figure(*distances)),
                  "dataset distance": lambda: distance_plots.attention_distance_panel(
                      pair.a.mean_distance, 224, "title", selectable=False).background,
                  "dataset distance as a matplotlib figure": lambda: figure_image(distance_plots.attention_distance_figure(
                      pair.a.mean_distance, image_width=224, title="title")),
                  "faithfulness curves": lambda: faithfulness_plot.curves_panel(curves, curves_title),
                  "faithfulness curves as a matplotlib figure": lambda: figure_image(
                      faithfulness_figure(curves, curves_title)),
                  "DINO heads": lambda: compare_plots.dino_heads_panel(*dino),
                  "DINO heads as a matplotlib figure": lambda: figure_image(compare_plots.dino_heads_figure(*dino)),
                  "feature PCA": lambda: compare_plots.feature_pca_panel(*pca),
                  "feature PCA as a matplotlib figure": lambda: figure_image(compare_plots.feature_pca_figure(*pca)),
                  "filters": lambda: model_plots.filter_pca_panel(report.filter_pca, model_title),
                  "filters as a matplotlib figure": filters_figure,
                  "similarity": lambda: model_plots.pos_similarity_panel(report.pos_similarity, model_title),
                  "similarity as a matplotlib figure": lambda: figure_image(model_plots.pos_similarity_figure(
                      report.pos_similarity, model_title)),
                  "aligned maps": aligned(compare_plots.aligned_maps_panel),
                  "aligned maps as a matplotlib figure": aligned(
                      lambda *a: figure_image(compare_plots.aligned_maps_figure(*a))),
                  "lens plot": lens(head_plots.lens_panel),
                  "lens plot as a matplotlib figure": lens(lambda *a: figure_image(head_plots.lens_figure(*a)))}
    candidates |= {f"later: {name}": figure(name) for name in LATER_PANELS}
    before = {}
    if args.before_tree is not None:  # the other version's drawing of the same session and view
        import importlib

        from .bench_rollout_redraw import load_package

        package = load_package(args.before_tree.resolve())
        other = importlib.import_module(f"{package.__name__}.ui.panels")
        other_scatter = other_module(package, "plots.distance", "plotting").DistanceScatterOnce
        before = {name: f"later: {name}, the other version" for name in ("distance", "compare", "heads")}
        candidates |= {label: figure(name, other.draw_panels, other_scatter) for name, label in before.items()}
        other_heads = other_module(package, "ui.tabs.heads", "ui.heads")
        first_order = session.result.heads.first_order
        cells = itertools.cycle([(layer, head) for layer in range(handle.depth) for head in range(handle.num_heads)])

        def heatmap_of(module):
            return lambda: module.heatmap(first_order, "title\nfirst-order estimate", "logits", next(cells))
        candidates |= {"heads heatmap": heatmap_of(heads_ui), "heads heatmap, the other version": heatmap_of(other_heads)}
        before["heads heatmap"] = "heads heatmap, the other version"
    times = measure(candidates, args.repeats)
    base, answer_ms = times["pass"].median, times["answer"].median
    print_header(f"The answer to a new image ({handle.name}, {'real' if weights else 'random'} weights, "
                 f"{args.threads} thread(s), {args.repeats} interleaved repeats, medians)")
    rows = [[name, timing.ms(), f"{timing.median / base:.2f}"] for name, timing in times.items()]
    print(markdown_table(("candidate", "ms (min–max)", "÷ the pass alone"), rows))
    print()
    print(markdown_table(("measure", "ratio"), [
        ["6. answer ÷ the pass alone", f"**{answer_ms / base:.2f}**"],
        ["6b. every panel drawn before answering ÷ answer", f"**{times['everything first'].median / answer_ms:.2f}**"],
        *[[f"6c. later: {name} ÷ the pass", f"{times[f'later: {name}'].median / base:.2f}"]
          for name in LATER_PANELS],
        *[[f"6d. {name}: the other version ÷ this one",
           f"**{times[label].median / times[name if name in times else f'later: {name}'].median:.1f}**"]
          for name, label in before.items()],
        ["6e. lens plot: matplotlib figure ÷ PIL panel",
         f"**{times['lens plot as a matplotlib figure'].median / times['lens plot'].median:.1f}**"],
        ["6f. aligned maps: matplotlib figure ÷ PIL picture",
         f"**{times['aligned maps as a matplotlib figure'].median / times['aligned maps'].median:.1f}**"],
        ["6g. Model tab filters: matplotlib figure ÷ PIL picture",
         f"**{times['filters as a matplotlib figure'].median / times['filters'].median:.1f}**"],
        ["6h. Model tab position similarity: matplotlib figure ÷ PIL picture",
         f"**{times['similarity as a matplotlib figure'].median / times['similarity'].median:.1f}**"],
        ["6i. Compare tab DINO heads: matplotlib figure ÷ PIL picture",
         f"**{times['DINO heads as a matplotlib figure'].median / times['DINO heads'].median:.1f}**"],
        ["6j. Compare tab feature PCA: matplotlib figure ÷ PIL picture",
         f"**{times['feature PCA as a matplotlib figure'].median / times['feature PCA'].median:.1f}**"],
        *[[f"6{row}. {words}: matplotlib figure ÷ PIL picture",
           f"**{times[f'{name} as a matplotlib figure'].median / times[name].median:.1f}**"]
          for row, name, words in (("k", "Compare distance", "Compare tab mean attention distance"),
                                   ("l", "dataset distance", "dataset mean attention distance"),
                                   ("m", "faithfulness curves", "Faithfulness tab curves"))]]))


def _random_loader(name, weights, device, **kwargs):
    from vit_inspect.core.load import load_model

    return load_model(name, device=device, pretrained=False)


if __name__ == "__main__":
    main()
