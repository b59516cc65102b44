"""`vit-inspect heads IMAGE`: head statistics, an ablation, head importance and the logit lens, as JSON."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Callable

import numpy as np

from vit_inspect.analysis.heads import high_norm_patches
from vit_inspect.analysis.logit_lens import lens_ranks
from vit_inspect.cli.common import model_options, progress_line
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import find_images, load_image
from vit_inspect.core.load import load_model
from vit_inspect.passes.interventions import mean_head_outputs, model_heads, parse_heads
from vit_inspect.passes.options import PassOptions
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.passes.records import lens_record, rounded
from vit_inspect.plots import canvas
from vit_inspect.plots import heads as head_plots
from vit_inspect.plots import maps as map_plots
from vit_inspect.studies.ablation import ablation_effect, analyze_ablated, head_importance


def add_parser(sub) -> None:
    heads = sub.add_parser("heads", help="head statistics, ablation, per-image head importance and logit lens (JSON)")
    heads.add_argument("image", metavar="IMAGE")
    heads.add_argument("--ablate", metavar="L:H,...", help="heads to ablate together, e.g. 3:1,5:0")
    heads.add_argument("--mode", choices=("zero", "mean", "uniform"), default="zero", help="ablation mode (default zero)")
    heads.add_argument("--reference", metavar="FOLDER", help="images whose mean head outputs --mode mean uses")
    heads.add_argument("--importance", action="store_true", help="drop in the target logit per head ablated alone")
    heads.add_argument("--lens", action="store_true", help="logit lens: top-5 and the final class's rank per block")
    heads.add_argument("--target", type=int, help="class index (default: the top prediction)")
    heads.add_argument("--batch-size", type=int, default=16, help="rows per forward for --importance and --reference")
    model_options(heads)
    heads.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    record = heads_record(handle, args.image, ablate=args.ablate, mode=args.mode, reference=args.reference,
                          importance=args.importance, lens=args.lens, target=args.target,
                          batch_size=args.batch_size,
                          progress=progress_line("head importance: {done}/{total} rows") if args.importance else None,
                          out=out,
                          reference_progress=progress_line("mean head outputs: {done}/{total} reference images"))
    print(json.dumps(record), flush=True)


def heads_record(handle: ViTHandle, image: str, *, ablate: str | None = None, mode: str = "zero",
                 reference: str | None = None, importance: bool = False, lens: bool = False,
                 target: int | None = None, batch_size: int = 16,
                 progress: Callable[[int, int], None] | None = None, out: Path | None = None,
                 reference_progress: Callable[[int, int], None] | None = None) -> dict:
    """Everything `vit-inspect heads` prints for one image; with `out`, its figures as PNG files there.
    ``progress`` is called with (rows done, rows) of the head importance, ``reference_progress`` with
    (images done, images) of the mean head outputs over ``reference``."""
    picture = load_image(image)
    result = analyze_image(handle, picture, target, PassOptions())
    heads = result.heads
    layout = result.layout
    last_norms = heads.token_norms[-1]
    record: dict = {
        "image": image, "model": handle.name, "target": result.target,
        "target_label": None if result.target is None else handle.label(result.target),
        "topk": handle.top_labels(result.probs, 5) if result.probs.size else [],
        "statistics": {
            "attention_entropy_nats": rounded(heads.entropy, 4), "max_entropy_nats": round(math.log(layout.num_tokens), 4),
            "prefix_attention_share": rounded(heads.prefix_share, 4),
            "first_order_importance": None if heads.first_order is None else rounded(heads.first_order, 5),
            "token_norms_last_block": {"prefix": rounded(layout.split(last_norms)[0], 3),
                                       "patches": rounded(layout.to_grid(layout.patches(last_norms)), 3)},
            "high_norm_patches_last_block": np.argwhere(high_norm_patches(last_norms, layout)).tolist(),
        },
    }
    mean = None
    if mode == "mean" and (ablate or importance):
        if not reference:
            raise VitInspectError("--mode mean needs --reference FOLDER: the images the head means are taken over.")
        files = find_images([reference])
        if not files:
            raise VitInspectError(f"No images found in {reference!r}.")
        mean = mean_head_outputs(handle, files, batch_size=batch_size, input_size=layout.input_size,
                                  progress=reference_progress)
    stem = Path(image).stem
    what = f"{handle.name}, {stem}" + ("" if result.target is None else f", class {handle.label(result.target)}")

    def save(fig, name: str) -> None:
        if out is not None:
            (out / f"{stem}_{name}.png").write_bytes(canvas.figure_to_png(fig))

    save(head_plots.head_heatmap_figure(heads.entropy, f"attention entropy ({what}); max ln N = "
                                        f"{math.log(layout.num_tokens):.2f}", "nats", diverging=False), "entropy")
    save(head_plots.head_heatmap_figure(heads.prefix_share, f"attention on prefix tokens ({what})",
                                        "fraction of attention", diverging=False), "prefix_share")
    norms_title = f"token norms after the last block ({handle.name})"
    save(map_plots.maps_figure(result.rgb, {norms_title: layout.to_grid(layout.patches(last_norms))},
                              units={norms_title: "L2 norm of the token"}), "token_norms")
    if heads.first_order is not None:
        save(head_plots.head_heatmap_figure(heads.first_order, f"first-order estimate sum A dy/dA ({what})",
                                            "logits"), "first_order")
    if ablate:
        pairs = model_heads(parse_heads(ablate), handle.depth, handle.num_heads)  # as the app reads them
        if not handle.has_head:
            raise VitInspectError("Ablation effects are measured on the prediction: this model has no classification head.")
        ablated = analyze_ablated(handle, picture, pairs, mode, mean, target=result.target)
        effect = ablation_effect(result, ablated)
        record["ablation"] = {
            "heads": [list(p) for p in pairs], "mode": mode,
            "reference_images": None if mean is None else mean.num_images,
            "logit_before": round(effect.logit_before, 5), "logit_after": round(effect.logit_after, 5),
            "delta_logit": round(effect.delta_logit, 5), "prob_before": round(effect.prob_before, 6),
            "prob_after": round(effect.prob_after, 6), "delta_prob": round(effect.delta_prob, 6),
            "prediction_changed": effect.prediction_changed,
            "top_before": [{"index": i, "label": handle.label(i), "prob": round(p, 6)} for i, p in effect.top_before],
            "top_after": [{"index": i, "label": handle.label(i), "prob": round(p, 6)} for i, p in effect.top_after],
        }
    if importance:
        ranked = head_importance(handle, picture, target=result.target, mode=mode, mean=mean,
                                 batch_size=batch_size, progress=progress)
        record["importance"] = {"mode": ranked.mode, "target": ranked.target, "logit": round(ranked.logit, 5),
                                "logit_drop": rounded(ranked.logit_drop, 5), "prob_drop": rounded(ranked.prob_drop, 6)}
        save(head_plots.head_heatmap_figure(ranked.logit_drop, f"drop of the target logit, each head {mode}-ablated "
                                            f"alone ({what})", "logits"), "importance")
    if lens:
        record["lens"] = lens_record(handle, result)
        if heads.lens:
            logits = heads.lens["readout"]
            final = int(np.argmax(heads.logits))
            shifted = np.exp(logits - logits.max(-1, keepdims=True))
            save(head_plots.lens_figure(lens_ranks(logits, final), shifted[:, final] / shifted.sum(-1),
                                        f"logit lens of {handle.name} on {stem}: class {handle.label(final)}"), "lens")
    return record
