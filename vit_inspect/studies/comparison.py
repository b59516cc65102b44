"""Two models on one image (or the two readout tokens of one distilled model), aligned and scored.

`compare_images` runs one pass per model on the same decoded image and keeps where each model's crop
lies in it, so that `aligned_maps` can put the maps of both on common ground (`analysis.compare`).
Everything after the two passes reads the cached `ImageAnalysis` results only.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
from PIL import Image

from vit_inspect.analysis.compare import Agreement, Box, map_agreement, matching_layer, relative_depth
from vit_inspect.analysis.dino import DINO_MASS
from vit_inspect.analysis.masks import mass_mask
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import ImageLimits, load_image
from vit_inspect.methods import MethodContext, added, compute_maps, get
from vit_inspect.passes.options import STUDY_OPTIONS
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.passes.result import ImageAnalysis

MAP_KINDS = ("attention", "rollout", "gradcam", "chefer")  # per-image maps compared across models
MAP_TITLES = {"attention": "raw attention (mean of heads)", "rollout": "attention rollout (mean fusion)",
              "gradcam": "Grad-CAM", "chefer": "gradient-weighted attention (Chefer et al. 2021)"}


@dataclass(frozen=True)
class Comparison:
    """One image through two models: both cached passes and where each crop lies in the image."""

    a: ImageAnalysis
    b: ImageAnalysis
    box_a: Box  # (left, top, right, bottom) of model A's crop in original-image pixels
    box_b: Box
    image_size: tuple[int, int]  # (width, height) of the original image

    def nbytes(self) -> int:
        """Memory held: the sum of both passes."""
        return self.a.nbytes() + self.b.nbytes()


def compare_images(handle_a: ViTHandle, handle_b: ViTHandle, image: Image.Image | str | os.PathLike | bytes,
                   input_size_a: tuple[int, int] | None = None, input_size_b: tuple[int, int] | None = None,
                   limits: ImageLimits = ImageLimits(), run_pass: Callable = analyze_image,
                   target_a: int | str | None = None, target_b: int | str | None = None,
                   contrast: int | str | None = None) -> Comparison:
    """One `analyze_image` pass per model (forward + backward each) on the same decoded image; ``run_pass``
    stands in for `analyze_image` (the app passes its ZeroGPU wrapper, `zerogpu.gpu_pass`). ``target_a`` and
    ``target_b`` are the classes each model's gradient maps explain (None: its own top class); give both the
    same class, where the label sets agree (`same_labels`), to compare the models on one question. For two
    CLIP-style models both may be the same text prompt, and ``contrast`` a versus prompt (or class) for both."""
    picture = image if isinstance(image, Image.Image) else load_image(image, limits)
    versus = {} if contrast is None else {"contrast": contrast}
    options = STUDY_OPTIONS.replace(limits=limits)
    result_a = run_pass(handle_a, picture, target_a, options.replace(input_size=input_size_a), **versus)
    result_b = run_pass(handle_b, picture, target_b, options.replace(input_size=input_size_b), **versus)
    return Comparison(a=result_a, b=result_b, image_size=picture.size,
                      box_a=handle_a.preprocess.crop_box(picture.size, input_size_a),
                      box_b=handle_b.preprocess.crop_box(picture.size, input_size_b))


def same_labels(handle_a: ViTHandle, handle_b: ViTHandle) -> bool:
    """Whether both models classify into the same label set (both have a head with the same class names, in
    the same order), so that one class index asks both the same question."""
    return handle_a.has_head and handle_b.has_head and tuple(handle_a.labels) == tuple(handle_b.labels)


def result_map(result: ImageAnalysis, kind: str, layer: int, query=None) -> np.ndarray | None:
    """A raw (grid_h, grid_w) map of one of MAP_KINDS; `layer` is used by attention and Grad-CAM.
    None for Grad-CAM and gradient-weighted attention of a model without a head."""
    if kind == "attention":
        return result.attention_map(layer, None, query)
    if kind == "rollout":
        return result.rollout(query=query)
    if kind not in MAP_KINDS:
        raise ValueError(f"unknown map kind {kind!r}; one of {MAP_KINDS}")
    if result.gradcam is None:
        return None
    return result.gradcam[layer] if kind == "gradcam" else result.chefer


def layer_words(layer: int, depth: int) -> str:
    """A layer by its 0-based index and relative depth (`relative_depth`), never beside a count:
    "layer 5 (relative depth 0.50)", and for the last "layer 11, the last (relative depth 1.00)"."""
    last = ", the last" if layer == depth - 1 else ""
    return f"layer {layer}{last} (relative depth {relative_depth(layer, depth):.2f})"


@dataclass(frozen=True)
class AlignedMap:
    """One map kind of both models at aligned depths, with their agreement."""

    kind: str
    layer_a: int  # model A's layer (attention, Grad-CAM); the last layer for depth-free maps
    layer_b: int  # model B's layer at the same relative depth (`matching_layer`)
    map_a: np.ndarray  # (grid_h, grid_w) raw, model A's grid
    map_b: np.ndarray  # (grid_h, grid_w) raw, model B's grid
    agreement: Agreement
    title: str = ""  # what the map is: `MAP_TITLES`, or an added method's registered title
    layered: bool = False  # the layers chose the maps (attention, Grad-CAM); else one map of the whole model
    relu: bool = False  # drawn after a ReLU (Grad-CAM; an added method as it registered)


def added_kinds() -> tuple[str, ...]:
    """The methods registered beside the built-ins (`methods.added`: plugins, methods registered in code) that a
    comparison can hold: those computed from what each pass recorded. A method with passes of its own needs its
    model, which a comparison does not keep, so it is left out."""
    return tuple(name for name, method in added().items() if method.reads != "own passes")


def _kind_map(result: ImageAnalysis, kind: str, layer: int) -> np.ndarray | None:
    """`result_map` for MAP_KINDS; an added method's map at its defaults (computed once per pass, kept by the
    pass), or None where it has none or failed."""
    if kind in MAP_KINDS:
        return result_map(result, kind, layer)
    maps, _ = compute_maps(MethodContext(result), (kind,))
    return maps.get(kind)


def aligned_maps(comparison: Comparison, layer_a: int | None = None, kinds: tuple[str, ...] | None = None,
                 fraction: float = 0.1) -> list[AlignedMap]:
    """Every map kind both models have (by default MAP_KINDS, then `added_kinds`), model B's layer aligned to
    model A's `layer_a` (default: the last) by relative depth, with `map_agreement` over the image region both
    crops cover. An added method that fails or has no map for either pass is left out, as a missing kind is."""
    a, b = comparison.a, comparison.b
    layer_a = a.depth - 1 if layer_a is None else layer_a
    layer_b = matching_layer(layer_a, a.depth, b.depth)
    aligned = []
    for kind in (MAP_KINDS + added_kinds()) if kinds is None else kinds:
        map_a, map_b = _kind_map(a, kind, layer_a), _kind_map(b, kind, layer_b)
        if map_a is None or map_b is None:
            continue
        method = None if kind in MAP_KINDS else get(kind)
        aligned.append(AlignedMap(kind=kind, layer_a=layer_a, layer_b=layer_b, map_a=map_a, map_b=map_b,
                                  agreement=map_agreement(map_a, map_b, comparison.box_a, comparison.box_b, fraction),
                                  title=MAP_TITLES[kind] if method is None else method.title,
                                  layered=kind in ("attention", "gradcam"),
                                  relu=kind == "gradcam" if method is None else method.relu))
    return aligned


def token_agreement(result: ImageAnalysis, fraction: float = 0.1) -> dict[str, Agreement]:
    """Class token vs distillation token of a distilled DeiT (Touvron et al. 2021), on one pass.

    Per layer the raw attention (mean of heads) read from each token, and the rollout read from each;
    keys "layer 0" ... "layer L-1" and "rollout". Grad-CAM and gradient-weighted attention depend on the
    target logit, not on a readout token, so they have no per-token version here.
    """
    if not result.layout.num_dist_tokens or not result.layout.has_class_token:
        raise ValueError(f"{result.model_name} has no class and distillation token pair to compare")
    scores = {f"layer {layer}": map_agreement(result.attention_map(layer, None, "class"),
                                              result.attention_map(layer, None, "distillation"), fraction=fraction)
              for layer in range(result.depth)}
    scores["rollout"] = map_agreement(result.rollout(query="class"), result.rollout(query="distillation"),
                                      fraction=fraction)
    return scores


def agreement_record(comparison: Comparison, aligned: list[AlignedMap]) -> dict:
    """The JSON object of agreement numbers `vit-inspect compare` writes."""
    a, b = comparison.a, comparison.b
    record = {
        "model_a": a.model_name, "model_b": b.model_name,
        "input_size_a": list(a.layout.input_size), "input_size_b": list(b.layout.input_size),
        "depth_a": a.depth, "depth_b": b.depth,
        "target": {"prompt": a.prompt.text} if a.prompt is not None else None,
        "contrast": {"prompt": a.versus.text} if a.versus is not None else None,
        "crop_box_a": [round(v, 3) for v in comparison.box_a], "crop_box_b": [round(v, 3) for v in comparison.box_b],
        "layer_mapping": "model B layer = ceil((layer_a + 1) * depth_b / depth_a) - 1 (same relative depth (l+1)/L)",
        "resampling": "both maps bilinearly resampled to the finer grid over the image region both crops cover",
        "maps": {m.kind: {"layer_a": m.layer_a, "layer_b": m.layer_b, **m.agreement.as_dict()} for m in aligned},
        "attention_by_layer": [
            {"layer_a": la, "layer_b": lb, **map_agreement(a.attention_map(la), b.attention_map(lb), comparison.box_a,
                                                          comparison.box_b).as_dict()}
            for la, lb in ((la, matching_layer(la, a.depth, b.depth)) for la in range(a.depth))],
    }
    for name, result in (("a", a), ("b", b)):
        if result.layout.num_dist_tokens and result.layout.has_class_token:
            record[f"class_vs_distillation_{name}"] = {k: v.as_dict() for k, v in token_agreement(result).items()}
    return record


def last_layer_heads(result: ImageAnalysis, fraction: float = DINO_MASS) -> tuple[np.ndarray, np.ndarray]:
    """DINO's view (Caron et al. 2021, Fig. 3): (maps, masks), both (heads, grid_h, grid_w): the readout
    token's last-layer attention of every head, and `analysis.mass_mask` of each at `fraction`."""
    maps = np.stack([result.attention_map(result.depth - 1, head) for head in range(result.num_heads)])
    return maps, mass_mask(maps, fraction)


def comparison_label(handle: ViTHandle, letter: str, input_size: tuple[int, int] | None, name: str | None = None) -> str:
    """'A: name (H×W)': names both models apart even when they are the same weights at two input sizes.
    `name` replaces the handle's (the app shows a server folder by its base name)."""
    height, width = input_size or handle.input_size
    return f"{letter}: {handle.name if name is None else name} ({height}×{width})"
