"""Scoring maps by perturbation: the one place that batches the model for faithfulness.

`score_maps` turns any set of (grid_h, grid_w) maps of one image into `Curves` (see
`vit_inspect.analysis.faithfulness` for the definitions) with as few batched forward passes as the
distinct perturbed inputs need. `evaluate_image` is the pure per-image function a folder engine calls
(one pass for the maps, then `score_maps`); `FaithfulnessAccumulator` keeps mergeable running sums of
the AUCs. The app, the CLI and the evaluation all go through `score_maps`.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import torch
from PIL import Image

from vit_inspect.analysis.faithfulness import (CURVES, Curves, PerturbationSettings, compose, curves_from_probs,
                                               curves_from_scores, plan_perturbations, replacement_images)
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import ImageLimits, load_image
from vit_inspect.core.open_clip_models import prompt_view, score_factor
from vit_inspect.core.prompts import Prompt
from vit_inspect.core.tokens import TokenLayout
from vit_inspect.methods import MethodContext, MethodFailure, compute_maps
from vit_inspect.methods import methods as registered_methods
from vit_inspect.passes.options import STUDY_OPTIONS
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.passes.result import ImageAnalysis

# (B, 3, H, W) pixels -> (B, num_classes) probabilities, or (B,) explained scores of a prompt (`prompt_scorer`)
ScoreFn = Callable[[torch.Tensor], torch.Tensor]
Progress = Callable[[int, int], None]  # (inputs scored, inputs in all)

DEFAULT_BATCH_SIZE = 64
FLOOR = {"random": "random map (the floor)"}  # the baseline every method is compared with: not a method


def faithfulness_methods() -> dict[str, str]:
    """name -> what it is: the floor, then every registered method the faithfulness study scores, in table order."""
    return FLOOR | {name: m.title for name, m in registered_methods().items() if m.faithfulness}


def __getattr__(name: str):
    if name == "METHODS":  # read from the registry on each access: plugins load on the first read
        return faithfulness_methods()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def model_scorer(handle: ViTHandle) -> ScoreFn:
    """Softmax probabilities of a batch under `torch.no_grad` (the plain forward the metrics need)."""
    def score(batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return handle.forward(batch).float().softmax(-1)
    return score


def pixel_digest(rgb: np.ndarray) -> int:
    """A 64-bit number from the image's pixels, to seed generators that must be the same for the same image."""
    return int.from_bytes(hashlib.blake2b(np.ascontiguousarray(rgb).tobytes(), digest_size=8).digest(), "little")


def prompt_scorer(handle: ViTHandle, target: int, contrast: int | None = None, score: str = "cosine") -> ScoreFn:
    """The explained score of a batch under `torch.no_grad`, as the pass explains it: column ``target`` of the
    (prompt view) handle's head, minus column ``contrast``, in cosine units (`score_factor`; "logit": logits)."""
    factor = score_factor(handle, score)

    def scores(batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logits = handle.forward(batch).float()
        if contrast is not None:  # s·(cos_A - cos_B): the bias cancels
            return (logits[:, target] - logits[:, contrast]) * factor
        return handle.clip.head.cosine(logits[:, target]) if score == "cosine" else logits[:, target]
    return scores


def image_permutation(rgb: np.ndarray, num_patches: int, seed: int = 0) -> np.random.Generator:
    """A generator seeded from the image's pixels: the tie-breaking permutation and the random map are
    the same every time the same image is scored."""
    return np.random.default_rng([pixel_digest(rgb), seed, num_patches])


def score_maps(score_fn: ScoreFn, pixels: torch.Tensor, layout: TokenLayout, maps: dict[str, np.ndarray],
               label: int, target: int, permutation: np.ndarray,
               settings: PerturbationSettings = PerturbationSettings(), batch_size: int = DEFAULT_BATCH_SIZE,
               progress: Progress | None = None) -> dict[str, Curves]:
    """Perturbation curves of every map for one image, in batches of at most `batch_size` inputs.

    ``pixels`` is the (1, 3, H, W) or (3, H, W) normalised model input; ``label`` is the class whose top-1
    correctness the pos/neg curves record, ``target`` the class whose probability del/ins record (the app
    uses the explained class for both; the CLI the true label and the prediction). A ``score_fn`` that gives
    (B,) scores (a prompt's similarity, `prompt_scorer`) makes every curve that score (`curves_from_scores`);
    ``label`` and ``target`` are then not read. Each distinct perturbed
    input is scored once (`plan_perturbations`); the inputs are composed chunk by chunk, so memory is
    bounded by `batch_size` images whatever the number of maps.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    for name, relevance in maps.items():
        if np.asarray(relevance).shape != (layout.grid_h, layout.grid_w):
            raise ValueError(f"map {name!r} has shape {np.asarray(relevance).shape}, the grid is "
                             f"({layout.grid_h}, {layout.grid_w})")
    image = pixels[0] if pixels.ndim == 4 else pixels  # (3, H, W)
    plan = plan_perturbations(maps, permutation)
    replacements = replacement_images(image, settings)  # (2, 3, H, W)
    total = plan.keep.shape[0]
    probs = []
    for start in range(0, total, batch_size):
        stop = min(start + batch_size, total)
        batch = compose(image, replacements, plan.keep[start:stop], plan.source[start:stop], layout)
        probs.append(score_fn(batch).float().cpu().numpy())
        if progress is not None:
            progress(stop, total)
    scores = np.concatenate(probs)
    if scores.ndim == 1:
        return curves_from_scores(plan, scores)
    return curves_from_probs(plan, scores, label, target)


def scored_maps(analysis: ImageAnalysis, names: tuple[str, ...], rng: np.random.Generator,
                handle: ViTHandle | None = None, pixels: torch.Tensor | None = None
                ) -> tuple[dict[str, np.ndarray], dict[str, MethodFailure]]:
    """(name -> (grid_h, grid_w) float64 map, name -> why it has none) of each named method
    (`faithfulness_methods`: the random floor drawn from `rng`, and registered methods computed from the
    pass, `methods.compute_map`), in the order of `names`. A map the pass cannot have (gradient methods on a
    model without a head) is in neither; a method with passes of its own needs ``handle`` (and reads
    ``pixels``, default the pass's crop)."""
    known = faithfulness_methods()
    unknown = [m for m in names if m not in known]
    if unknown:
        raise VitInspectError(f"Unknown method(s) {', '.join(unknown)}; choose from {', '.join(known)}.")
    layout = analysis.layout
    context = MethodContext(analysis, handle, pixels)
    maps: dict[str, np.ndarray] = {}
    failures: dict[str, MethodFailure] = {}
    for name in names:
        if name in FLOOR:
            maps[name] = rng.random((layout.grid_h, layout.grid_w))
            continue
        found, failed = compute_maps(context, (name,))
        maps |= found
        failures |= failed
    return maps, failures


def standard_maps(analysis: ImageAnalysis, methods: tuple[str, ...], rng: np.random.Generator,
                  handle: ViTHandle | None = None, pixels: torch.Tensor | None = None) -> dict[str, np.ndarray]:
    """The maps of `scored_maps`, without the failures."""
    return scored_maps(analysis, methods, rng, handle, pixels)[0]


@dataclass(frozen=True)
class ImageFaithfulness:
    """Per-image result of `evaluate_image`."""

    label: int  # class the pos/neg curves check top-1 against
    target: int  # class explained and whose probability del/ins record
    correct: bool  # the clean image's top-1 is `label`
    curves: dict[str, Curves]  # method -> its four curves
    failures: dict[str, MethodFailure] = field(default_factory=dict)  # method -> why it was left out of the scores

    def aucs(self) -> dict[str, dict[str, float]]:
        return {name: c.aucs() for name, c in self.curves.items()}


def evaluate_image(handle: ViTHandle, image: Image.Image | str | os.PathLike | bytes, label: int,
                   methods: tuple[str, ...] | None = None, target: int | str | Prompt | None = None,
                   settings: PerturbationSettings = PerturbationSettings(), batch_size: int = DEFAULT_BATCH_SIZE,
                   seed: int = 0, limits: ImageLimits = ImageLimits(),
                   contrast: str | Prompt | None = None) -> ImageFaithfulness:
    """Score `methods` on one image: one analysis pass (maps for `target`, default the prediction),
    then the perturbation curves of every map (`score_maps`); ``methods`` default every one of
    `faithfulness_methods`, and one that fails is left out of the curves, its reason in ``failures``. Pure
    in the sense a folder engine needs:
    the result depends only on the arguments (ties and the random map are seeded from the pixels).

    A prompt ``target`` (and ``contrast``) of a CLIP-style model scores every curve on the prompt's
    similarity (`prompt_scorer`, `analysis.faithfulness.curves_from_scores`); ``label`` then only says
    whether the zero-shot top-1 was right."""
    picture = image if isinstance(image, Image.Image) else load_image(image, limits)
    analysis = analyze_image(handle, picture, target, STUDY_OPTIONS, contrast=contrast)
    if analysis.target is None:
        raise VitInspectError("Faithfulness needs a classifier: this model has no classification head.")
    pixels, _ = handle.preprocess.apply(picture)
    num_patches = analysis.layout.num_patches
    rng = image_permutation(analysis.rgb, num_patches, seed)
    permutation = rng.permutation(num_patches)
    explained = handle  # the model whose column `analysis.target` is: a prompt's view for a text target
    if analysis.prompt is not None or analysis.versus is not None:
        explained, column, other, _, _ = prompt_view(handle, target, contrast)
        scorer = prompt_scorer(explained, column, other, analysis.score)
    else:
        scorer = model_scorer(handle)
    maps, failures = scored_maps(analysis, tuple(faithfulness_methods()) if methods is None else methods, rng,
                                 explained, pixels)
    curves = score_maps(scorer, pixels.to(handle.device), analysis.layout, maps, label,
                        analysis.target, permutation, settings, batch_size)
    return ImageFaithfulness(label=int(label), target=analysis.target,
                             correct=bool(np.argmax(analysis.probs) == label), curves=curves,
                             failures=failures)


class FaithfulnessAccumulator:
    """Running sums of per-image AUCs per method and curve; `merge` adds another accumulator's sums,
    so folder jobs can be split across workers. `table()` gives mean ± standard error."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}  # method -> images seen
        self._sum: dict[str, np.ndarray] = {}  # method -> (4,) sum of AUCs in CURVES order
        self._sum_sq: dict[str, np.ndarray] = {}  # method -> (4,) sum of squared AUCs
        self.correct = 0  # images whose clean top-1 was right
        self.images = 0
        self.left_out: dict[str, int] = {}  # method -> images on which it failed (`ImageFaithfulness.failures`)

    def add(self, result: ImageFaithfulness) -> None:
        self.images += 1
        self.correct += int(result.correct)
        for name, curves in result.curves.items():
            values = np.array([curves.auc(c) for c in CURVES])
            self.count[name] = self.count.get(name, 0) + 1
            self._sum[name] = self._sum.get(name, 0.0) + values
            self._sum_sq[name] = self._sum_sq.get(name, 0.0) + values ** 2
        for name in result.failures:
            self.left_out[name] = self.left_out.get(name, 0) + 1

    def merge(self, other: "FaithfulnessAccumulator") -> "FaithfulnessAccumulator":
        merged = FaithfulnessAccumulator()
        for acc in (self, other):
            merged.images += acc.images
            merged.correct += acc.correct
            for name in acc.count:
                merged.count[name] = merged.count.get(name, 0) + acc.count[name]
                merged._sum[name] = merged._sum.get(name, 0.0) + acc._sum[name]
                merged._sum_sq[name] = merged._sum_sq.get(name, 0.0) + acc._sum_sq[name]
            for name, n in acc.left_out.items():
                merged.left_out[name] = merged.left_out.get(name, 0) + n
        return merged

    def state(self) -> tuple[dict[str, np.ndarray], int]:
        """(running sums, images): float64 "correct" (), and per method "count/M" (), "sum/M" and
        "sum_sq/M" (4,) in CURVES order, and "left_out/M" () for a method that failed on some images. Adding two states name by name equals `merge` of the two
        accumulators, so a folder engine can add them (as `jobs.engine.Sums`) in any order."""
        arrays = {"correct": np.float64(self.correct)}
        for name, n in self.count.items():
            arrays[f"count/{name}"] = np.float64(n)
            arrays[f"sum/{name}"] = np.asarray(self._sum[name], np.float64)
            arrays[f"sum_sq/{name}"] = np.asarray(self._sum_sq[name], np.float64)
        for name, n in self.left_out.items():
            arrays[f"left_out/{name}"] = np.float64(n)
        return arrays, self.images

    @classmethod
    def from_state(cls, arrays: Mapping[str, np.ndarray], images: int) -> "FaithfulnessAccumulator":
        """The accumulator whose `state` is (arrays, images)."""
        accumulator = cls()
        accumulator.images = int(images)
        accumulator.correct = int(round(float(arrays.get("correct", 0.0))))
        for key, value in arrays.items():
            if key.startswith("count/"):
                name = key[len("count/"):]
                accumulator.count[name] = int(round(float(value)))
                accumulator._sum[name] = np.asarray(arrays[f"sum/{name}"], np.float64)
                accumulator._sum_sq[name] = np.asarray(arrays[f"sum_sq/{name}"], np.float64)
            elif key.startswith("left_out/"):
                accumulator.left_out[key[len("left_out/"):]] = int(round(float(value)))
        return accumulator

    def table(self) -> dict[str, dict[str, tuple[float, float]]]:
        """method -> curve -> (mean AUC, standard error of the mean; NaN below two images)."""
        table = {}
        for name, n in self.count.items():
            mean = self._sum[name] / n
            var = (self._sum_sq[name] - n * mean ** 2) / (n - 1) if n > 1 else np.full(len(CURVES), np.nan)
            se = np.sqrt(np.maximum(var, 0.0) / n)
            table[name] = {c: (float(m), float(s)) for c, m, s in zip(CURVES, mean, se)}
        return table
