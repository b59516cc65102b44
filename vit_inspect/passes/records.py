"""JSON records of a pass's result, shared by the command line and the app's downloads."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from vit_inspect.analysis.logit_lens import lens_ranks, lens_topk, settled_block
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.prompts import Prompt
from vit_inspect.passes.result import ImageAnalysis


def rounded(array: np.ndarray | None, digits: int = 6) -> list | None:
    """An array as nested lists of floats rounded to ``digits`` decimals, or more where its largest magnitude
    needs them to keep ``digits`` significant digits (a cosine similarity's maps are ~1e-5; JSON); None stays None."""
    if array is None:
        return None
    values = np.asarray(array, dtype=np.float64)
    peak = float(np.abs(values).max()) if values.size else 0.0
    if 0.0 < peak < np.inf:
        digits = max(digits, digits - 1 - int(np.floor(np.log10(peak))))
    return np.round(values, digits).tolist()


def class_record(handle: ViTHandle, index: int | None) -> dict | None:
    """{"index", "label"} of a class, None for none."""
    return None if index is None else {"index": int(index), "label": handle.label(int(index))}


def target_record(handle: ViTHandle, index: int | None, prompt: Prompt | None) -> dict | None:
    """{"prompt"} of a text target, else `class_record`."""
    return {"prompt": prompt.text} if prompt is not None else class_record(handle, index)


def target_text(handle: ViTHandle, index: int, prompt: Prompt | None) -> str:
    """How captions name a target: 'prompt "a photo of a cat"', or 'class tabby (#281)'."""
    return f"prompt {prompt.text!r}" if prompt is not None else f"class {handle.label(index)} (#{index})"


def analysis_record(handle: ViTHandle, result: ImageAnalysis, image: str) -> dict:
    """The JSON object `analyze` prints for one image. `target` is the class the gradient maps explain
    (`contrast`: the class it is compared with, gradients of logit target - logit contrast), or
    ``{"prompt": text}`` for a text prompt; `score` what they explain ("logit" or "cosine")."""
    layout = result.layout
    gradcam = None if result.gradcam is None else result.gradcam[-1]
    return {
        "image": image,
        "model": handle.name,
        "weights": Path(handle.weights).name if Path(handle.weights).is_absolute() else handle.weights,
        "input_geometry": result.geometry,
        "target": target_record(handle, result.target, result.prompt),
        "contrast": target_record(handle, result.contrast, result.versus),
        "score": result.score,
        "input_size": list(layout.input_size),
        "patch_size": [layout.patch_h, layout.patch_w],
        "grid": [layout.grid_h, layout.grid_w],
        "num_prefix_tokens": layout.num_prefix_tokens,
        "topk": handle.top_labels(result.probs, 5) if result.probs.size else [],
        "mean_attention_distance": rounded(result.mean_distance, 3),
        "rollout": rounded(result.rollout()),
        "gradcam": rounded(gradcam),
        "chefer": rounded(result.chefer),
        "legrad": rounded(result.legrad),
        "attnlrp": rounded(result.attnlrp),
    }


def analysis_arrays(result: ImageAnalysis) -> dict[str, np.ndarray]:
    """The arrays of one pass for a ``.npz`` file, at full precision: ``attention`` (depth, heads, N, N) float16,
    or what rebuilds it when that is large (`ImageAnalysis.attention_arrays`), ``probs`` (num_classes,),
    ``rgb`` (H, W, 3) uint8 the crop the model saw, ``mean_distance`` (depth, heads) pixels, ``gradcam``
    (depth, grid_h, grid_w) raw Grad-CAM of every block, and the (grid_h, grid_w) maps ``rollout`` (mean
    fusion, every layer), ``chefer``, ``legrad`` and ``attnlrp``. Maps a model or pass does not have are
    left out."""
    arrays = result.attention_arrays() | {
        "probs": result.probs, "rgb": result.rgb, "mean_distance": result.mean_distance, "gradcam": result.gradcam,
        "rollout": result.rollout(), "chefer": result.chefer, "legrad": result.legrad, "attnlrp": result.attnlrp}
    return {name: values for name, values in arrays.items() if values is not None}


def lens_record(handle: ViTHandle, result: ImageAnalysis, k: int = 5) -> dict:
    """Per readout: for every block, the top-k classes and the rank and probability of the final class, and the
    0-based block from which on the final class is the lens's top class (``settled_at_block``, `settled_block`)."""
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
            "settled_at_block": settled_block(ranks),
            "layers": [{"block": layer, "rank": int(ranks[layer]), "prob": round(float(final_prob[layer]), 5),
                        "top": [{"index": int(i), "label": handle.label(int(i)), "prob": round(float(p), 5)}
                                for i, p in zip(indices[layer], probs[layer])]}
                       for layer in range(len(logits))]}
    return record
