"""Redraws of a large model from the notebook's pass (`vi.analyze`, its defaults) against the app's pass
(`Inspector._pass`: the app's options and its spill folder), each redraw timed on the same image and model.

DINOv2-L/14 at 518 px (N = 1370 tokens, 16 heads, width 1024) with RANDOM weights and a random 1000-class
head, so that the gradient maps exist (`timm.create_model("vit_large_patch14_dinov2.lvd142m",
pretrained=False, img_size=518, num_classes=1000)`; timing does not depend on the weights). Its maps are
too large to keep (`attention_store.keeps_maps`) and dear to rebuild (`spill.worth_spilling`), so the app
spills them to disk, and with the pass's default options (`PassOptions`) so does `vi.analyze`. A third
column, "no spill", is the same pass with ``spill=None``: what `vi.analyze` ran before its defaults were
the app's.

Every common redraw: the attention map of a layer and of one head, rollout at its defaults and with other
options, Grad-CAM of a block, every head of a layer. Rollouts are cached by a result, so each rollout is
timed with that cache emptied (a first draw); the candidates are interleaved (bench.common.measure), so
the ratios hold on a shared machine.

    python -m bench.bench_notebook_redraw [--repeats 3] [--threads 2] [--size 518]
"""
from __future__ import annotations

import argparse
import time

import torch

from .common import REPO, measure, print_header, report, set_threads

MODEL = "vit_large_patch14_dinov2.lvd142m"
TARGET_S = 1.0  # seconds: what a redraw may take


def redraws(analysis, depth: int) -> dict:
    """name -> a callable drawing one map of ``analysis`` (a notebook `Analysis`), as a user redraws it."""
    result = analysis.result
    middle, last = depth // 2, depth - 1

    def fresh_rollout(**options):
        def draw():
            result._rollouts.clear()  # a first draw of these options, not the result's cached copy
            return analysis.map("rollout", **options)
        return draw

    return {
        f"attention, layer {middle}, mean of heads": lambda: analysis.map("attention", layer=middle),
        f"attention, layer {middle}, head 3": lambda: analysis.map("attention", layer=middle, head=3),
        "rollout, default options": fresh_rollout(),
        "rollout, max fusion, discard 0.9": fresh_rollout(head_fusion="max", discard_ratio=0.9),
        f"rollout, layers {middle}-{last}, min fusion": fresh_rollout(head_fusion="min", start_layer=middle),
        f"Grad-CAM, block {middle}": lambda: analysis.map("gradcam", layer=middle),
        f"every head, layer {last}": lambda: result.head_maps(last),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--size", type=int, default=518, help="input side in pixels (whole patches of 14)")
    parser.add_argument("--image", default=str(REPO / "assets" / "chelsea.png"))
    args = parser.parse_args()
    set_threads(args.threads)

    import timm

    import vit_inspect as vi
    from vit_inspect.core.images import load_image
    from vit_inspect.core.timm_models import handle_from_timm
    from vit_inspect.notebook.result import Analysis
    from vit_inspect.passes.pipeline import analyze_image
    from vit_inspect.ui.config import AppConfig
    from vit_inspect.ui.inspector import Inspector

    torch.manual_seed(0)
    model = timm.create_model(MODEL, pretrained=False, img_size=args.size, num_classes=1000).eval()
    handle = handle_from_timm(model, name=MODEL, device="cpu", input_size=(args.size, args.size))
    picture = load_image(args.image)
    app = Inspector(AppConfig(), cache=None)  # the app's pass and spill folder; the model is given, not cached

    passes = {}
    start = time.perf_counter()
    passes["notebook"] = vi.analyze(picture, handle)
    pass_s = {"notebook": time.perf_counter() - start}
    start = time.perf_counter()
    passes["app"] = Analysis(handle, app._pass(handle, picture, app.geometry_of(None, None)), "image")
    pass_s["app"] = time.perf_counter() - start
    start = time.perf_counter()
    passes["no spill"] = Analysis(handle, analyze_image(handle, picture, relevance=False, spill=None), "image")
    pass_s["no spill"] = time.perf_counter() - start
    spilled = {name: a.result.attention_store.spill is not None for name, a in passes.items()}

    candidates = {(name, redraw): draw for name, analysis in passes.items()
                  for redraw, draw in redraws(analysis, handle.depth).items()}
    timings = measure(candidates, args.repeats)
    rows = []
    for redraw in redraws(passes["app"], handle.depth):
        notebook, own, none = (timings[(name, redraw)] for name in ("notebook", "app", "no spill"))
        slow = ", ".join(name for name, t in (("notebook", notebook), ("app", own)) if t.median > TARGET_S)
        rows.append([redraw, notebook.s(), own.s(), none.s(), f"{notebook.median / own.median:.2f}",
                     f"over {TARGET_S:g} s: {slow}" if slow else f"≤ {TARGET_S:g} s"])
    print_header(f"Redraws of {MODEL} at {args.size} px, random weights ({args.threads} thread(s), "
                 f"{args.repeats} interleaved repeats, medians and ranges in s; shared machine)")
    print(f"passes: notebook {pass_s['notebook']:.1f} s (relevance on, spilled: {spilled['notebook']}), "
          f"app {pass_s['app']:.1f} s (relevance off, spilled: {spilled['app']}), "
          f"no spill {pass_s['no spill']:.1f} s (spilled: {spilled['no spill']})")
    print(report("notebook_redraw", ("redraw", "notebook s", "app s", "no spill s", "notebook ÷ app", "goal"), rows,
                 key=("redraw",)))


if __name__ == "__main__":
    main()
