"""The JSON record of `vit-inspect heads`: head statistics, an ablation, head importance and the logit lens."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from pathlib import Path

from . import head_plots, plotting
from .ablation import ablation_effect, analyze_ablated, head_importance
from .analysis.heads import high_norm_patches
from .analysis.logit_lens import lens_ranks, lens_topk, settled_depth
from .errors import VitInspectError
from .images import load_image
from .interventions import mean_head_outputs, model_heads, parse_heads
from .models import ViTHandle
from .pipeline import ImageAnalysis, analyze_image, find_images


def _rounded(array, digits: int = 5):
    return np.round(np.asarray(array, dtype=np.float64), digits).tolist()


def lens_record(handle: ViTHandle, result: ImageAnalysis, k: int = 5) -> dict:
    """Per readout: for every block, the top-k classes and the rank and probability of the final class."""
    heads = result.heads
    if not heads.lens:
        return {"note": heads.lens_note}
    final = int(np.argmax(heads.logits))
    record: dict = {"final_class": final, "final_label": handle.label(final)}
    for name, logits in heads.lens.items():
        indices, probs = lens_topk(logits, k)
        ranks = lens_ranks(logits, final)
        shifted = np.exp(logits - logits.max(-1, keepdims=True))
        final_prob = shifted[:, final] / shifted.sum(-1)
        record[name] = {
            "settled_after_blocks": settled_depth(ranks),
            "layers": [{"block": layer, "rank": int(ranks[layer]), "prob": round(float(final_prob[layer]), 5),
                        "top": [{"index": int(i), "label": handle.label(int(i)), "prob": round(float(p), 5)}
                                for i, p in zip(indices[layer], probs[layer])]}
                       for layer in range(len(logits))]}
    return record


def heads_record(handle: ViTHandle, image: str, *, ablate: str | None = None, mode: str = "zero",
                 reference: str | None = None, importance: bool = False, lens: bool = False,
                 target: int | None = None, batch_size: int = 16,
                 progress: Callable[[int, int], None] | None = None, out: Path | None = None,
                 reference_progress: Callable[[int, int], None] | None = None) -> dict:
    """Everything `vit-inspect heads` prints for one image; with `out`, its figures as PNG files there.
    ``progress`` is called with (rows done, rows) of the head importance, ``reference_progress`` with
    (images done, images) of the mean head outputs over ``reference``."""
    picture = load_image(image)
    result = analyze_image(handle, picture, target=target)
    heads = result.heads
    layout = result.layout
    last_norms = heads.token_norms[-1]
    record: dict = {
        "image": image, "model": handle.name, "target": result.target,
        "target_label": None if result.target is None else handle.label(result.target),
        "topk": handle.top_labels(result.probs, 5) if result.probs.size else [],
        "statistics": {
            "attention_entropy_nats": _rounded(heads.entropy, 4), "max_entropy_nats": round(math.log(layout.num_tokens), 4),
            "prefix_attention_share": _rounded(heads.prefix_share, 4),
            "first_order_importance": None if heads.first_order is None else _rounded(heads.first_order, 5),
            "token_norms_last_block": {"prefix": _rounded(layout.split(last_norms)[0], 3),
                                       "patches": _rounded(layout.to_grid(layout.patches(last_norms)), 3)},
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
            (out / f"{stem}_{name}.png").write_bytes(plotting.figure_to_png(fig))

    save(head_plots.head_heatmap_figure(heads.entropy, f"attention entropy ({what}); max ln N = "
                                        f"{math.log(layout.num_tokens):.2f}", "nats", diverging=False), "entropy")
    save(head_plots.head_heatmap_figure(heads.prefix_share, f"attention on prefix tokens ({what})",
                                        "fraction of attention", diverging=False), "prefix_share")
    norms_title = f"token norms after the last block ({handle.name})"
    save(plotting.maps_figure(result.rgb, {norms_title: layout.to_grid(layout.patches(last_norms))},
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
                                "logit_drop": _rounded(ranked.logit_drop), "prob_drop": _rounded(ranked.prob_drop, 6)}
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
