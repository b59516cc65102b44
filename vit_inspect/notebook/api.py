"""`analyze`: one image through one model, in one call, for notebooks and scripts; `class_concepts`: the
concepts of a class over many images (CRAFT)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from PIL import Image

from vit_inspect.core.geometry import InputGeometry
from vit_inspect.core.handle import DEFAULT_MODEL, ViTHandle
from vit_inspect.core.images import find_images
from vit_inspect.core.load import load_model
from vit_inspect.notebook.result import Analysis
from vit_inspect.passes.options import PassOptions
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.studies.class_concepts import DEFAULT_CONCEPTS as CLASS_CONCEPTS
from vit_inspect.studies.class_concepts import DEFAULT_CROPS, ClassConcepts
from vit_inspect.studies.class_concepts import class_concepts as study_class_concepts

MODELS_KEPT = 2  # models `analyze` keeps loaded between calls, least recently used dropped


@lru_cache(maxsize=MODELS_KEPT)
def _model(name: str, weights: str | None, device: str | None, model_file: str | None) -> ViTHandle:
    return load_model(name, weights=weights, device=device, model_file=model_file)


def analyze(image: str | os.PathLike | Image.Image | bytes, model: str | ViTHandle = DEFAULT_MODEL, *,
            weights: str | os.PathLike | None = None, device: str | None = None,
            model_file: str | os.PathLike | None = None, target: int | str | None = None,
            contrast: int | str | None = None, geometry: str | InputGeometry | None = None,
            relevance: bool = True) -> Analysis:
    """Run one image through a ViT and return everything the maps need, as an `Analysis`.

    ``model`` is a timm name, a Hugging Face id or folder (see `load_model`), or a `ViTHandle` you loaded.
    Weights come from ``weights``, else ``checkpoints/<name>.safetensors``, else the Hugging Face hub; the
    last `MODELS_KEPT` models loaded are kept for the next call. ``model_file`` (``"file.py:function"``)
    imports a hand-written ViT instead, which runs that file's code (see `ModuleSpec`).

    One forward pass with attention capture and, for a model with a classification head, one backward
    pass from the logit of ``target`` (default: the top class), minus ``contrast``'s logit when given;
    for an OpenCLIP model (``"open_clip:ViT-B-16:openai"``) ``target`` and ``contrast`` may be text prompts, and
    the gradient maps explain the image-text cosine similarity (minus the contrast prompt's). With
    ``relevance`` (the default) AttnLRP and LeGrad are computed too (about 3x the time of the pass
    without them). ``geometry``: "crop" (the model's centre crop, the default), "squash" (the whole image
    resized) or "keep" (the whole image, aspect ratio kept, on a non-square patch grid). The pass itself is
    `analyze_image` with the defaults of the app and the CLI (`PassOptions`); the returned `Analysis` holds its
    `ImageAnalysis` as ``.result``.

    Like the app, the pass spills a large model's attention maps to local disk: where the maps are too large to
    keep in memory (`attention_store.keeps_maps`: more than 4 MiB of float16 maps) and dear to rebuild
    (`spill.worth_spilling`: heads x tokens >= 0.015 x width², e.g. DINOv2-S/14 and -L/14 at 518 px), each
    layer's maps with their heads fused are written to a private temporary folder (`spill.shared_folder`, at
    most 4 GiB; DINOv2-L/14 at 518 px: 362 MB a result), so that rollout redraws read them instead of rebuilding
    every head. A result's file is removed when the result is garbage-collected, the folder when Python exits.
    """
    if isinstance(model, ViTHandle):
        handle = model
    else:
        handle = _model(str(model), None if weights is None else str(weights), device,
                        None if model_file is None else str(model_file))
    if isinstance(geometry, str):
        geometry = InputGeometry(geometry)
    name = str(image) if isinstance(image, (str, os.PathLike)) else getattr(image, "filename", "") or "image"
    options = PassOptions(geometry=geometry, relevance=relevance)
    result = analyze_image(handle, Path(image) if isinstance(image, os.PathLike) else image, target, options,
                           contrast=contrast)
    return Analysis(handle, result, name)


def class_concepts(images: str | os.PathLike | Sequence, target: int, model: str | ViTHandle = DEFAULT_MODEL, *,
                   weights: str | os.PathLike | None = None, device: str | None = None, k: int = CLASS_CONCEPTS,
                   layer: int | None = None, crops: int = DEFAULT_CROPS, seed: int = 0) -> ClassConcepts:
    """CRAFT's ``k`` concepts of class ``target`` over ``images`` (a folder, or a list of paths or PIL images of
    that class), with their importance, logit drop and galleries (`studies.class_concepts.class_concepts`);
    ``model`` as for `analyze`. A concept's heatmap on any image: `class_concept_heatmaps`."""
    handle = model if isinstance(model, ViTHandle) else _model(str(model), None if weights is None else str(weights),
                                                                 device, None)
    if isinstance(images, (str, os.PathLike)):
        images = find_images([images])
    return study_class_concepts(handle, list(images), target, k, layer, crops, seed)
