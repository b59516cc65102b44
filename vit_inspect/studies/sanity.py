"""Sanity checks of explanation maps: does a map depend on the model, and on the class?

- **Model randomisation** (Adebayo et al. 2018, "Sanity Checks for Saliency Maps", Sec. 3.1): the weights
  are re-drawn by the model's own initialiser under a fixed seed (`passes.randomise`), the head kept.
  *Cascading*: the last block first, then the one below it, ... down to the patch embedding, each step on
  top of the last; *independent*: one block at a time, the others trained. At each step every method's map
  for the **same class** is recomputed by the one-pass code (`analyze_pixels`, `standard_maps`) and compared
  with the map of the trained model by three similarities (`Similarity`). A map that stays similar once the
  model is random explains the input, not the model.
- **Random logit** (Sixt, Granz & Landgraf 2020, "When Explanations Lie", Sec. 5; Quantus `RandomLogit`): the
  map of the explained class against the map of another class, drawn uniformly among the other classes by a
  generator seeded with the seed and the image's pixels (`random_class`), or chosen. A map that stays similar
  ignores the class (raw attention and rollout do by construction: they have no class).
- **A text prompt** (CLIP-style models, `core.open_clip_models.prompt_view`): the explained score is the
  prompt's cosine similarity with the image at every step (the text tower and the projections are not
  randomised, only the vision tower's blocks and patch embedding), and the random logit is a zero-shot label
  of the model drawn uniformly among all of them: a map that stays similar ignores the prompt.
- **Robustness**: max-sensitivity and infidelity through captum (`studies.robustness`).

The similarities: Spearman's rank correlation of the raw maps (`analysis.rank_correlation`), SSIM of the
min-max normalised maps (`analysis.ssim`) and the share of the top 10 % patches in common
(`analysis.top_overlap`). A randomised model can give a constant map (a ReLU'd Grad-CAM of zeros): its
Spearman is NaN (undefined) and is left out of averages. `ImageSanity.passes_randomisation` reads the
verdict: a method passes when its Spearman with the trained map, once every layer is random, is below
`PASS_THRESHOLD`.
"""
from __future__ import annotations

import math
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import torch
from PIL import Image

from vit_inspect.analysis.rank_correlation import spearman
from vit_inspect.analysis.ssim import ssim
from vit_inspect.analysis.top_overlap import TOP_FRACTION, top_overlap
from vit_inspect.core.errors import Cancelled, VitInspectError
from vit_inspect.core.geometry import warn_if_blurred
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import ImageLimits, load_image
from vit_inspect.core.open_clip_models import prompt_view
from vit_inspect.core.prompts import Prompt
from vit_inspect.methods import MethodFailure, get
from vit_inspect.methods import methods as registered_methods
from vit_inspect.passes.options import PassOptions
from vit_inspect.passes.pipeline import analyze_pixels
from vit_inspect.passes.randomise import EMBEDDING, Layer, cascade_order, fresh_weights, randomised
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.studies.faithfulness import FLOOR, image_permutation, pixel_digest, scored_maps
from vit_inspect.studies.robustness import RobustnessSettings, infidelity, max_sensitivity

SIMILARITIES = ("spearman", "ssim", "top10_overlap")
PASS_THRESHOLD = 0.5  # a map passes the randomisation test when its Spearman, fully randomised, is below this
MapFn = Callable[[ImageAnalysis], np.ndarray]  # a map of one's own from a pass: (grid_h, grid_w)
Progress = Callable[[int, int], None]  # (passes done, passes in all)


def sanity_methods() -> tuple[str, ...]:
    """Every registered method the sanity study checks, in registration order (the random floor of the
    faithfulness study is model-free by definition, so never checked by default)."""
    return tuple(name for name, m in registered_methods().items() if m.sanity)


def needs_relevance(methods: tuple[str, ...]) -> bool:
    """Whether any of `methods` reads the pass's LeGrad and AttnLRP records (`analyze_pixels(relevance=True)`)."""
    return any(get(m).reads == "relevance" for m in methods if m not in FLOOR)


def __getattr__(name: str):
    if name == "SANITY_METHODS":  # read from the registry on each access: plugins load on the first read
        return sanity_methods()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Similarity:
    """How alike two maps of one image are."""

    spearman: float  # rank correlation of the raw maps, [-1, 1]; NaN when a map is constant
    ssim: float  # SSIM of the min-max normalised maps, <= 1; NaN on a grid under 3 x 3
    top10_overlap: float  # share of the top 10 % patches in common, [0, 1]

    def values(self) -> tuple[float, float, float]:
        return self.spearman, self.ssim, self.top10_overlap

    def as_dict(self) -> dict[str, float | None]:
        """JSON-safe: NaN becomes None."""
        return {name: None if math.isnan(v) else round(float(v), 6) for name, v in zip(SIMILARITIES, self.values())}


def similarity(original: np.ndarray, other: np.ndarray) -> Similarity:
    """The three similarities (see the module docstring) of two (grid_h, grid_w) maps."""
    return Similarity(spearman=spearman(original, other), ssim=ssim(original, other),
                      top10_overlap=top_overlap(original, other, TOP_FRACTION))


@dataclass(frozen=True)
class SanitySettings:
    """What `sanity_check` runs; every field is stated with its results."""

    seed: int = 0  # the re-drawn weights, the random class (with the pixels) and the random map
    random_class: int | None = None  # the other class of the random-logit test; None: drawn with `seed`
    independent: bool = True  # run the independent randomisation (one pass per block)
    random_logit: bool = True  # run the random-logit test (one pass)
    robustness: RobustnessSettings | None = RobustnessSettings()  # None: no max-sensitivity or infidelity


@dataclass(frozen=True)
class ImageSanity:
    """The sanity checks of one image (`sanity_check`)."""

    target: int  # the class explained (a prompt's: its column after the zero-shot labels), at every step
    random_class: int | None  # the other class (zero-shot label) of the random-logit test (None: not run)
    steps: tuple[Layer | None, ...]  # cascading: None (nothing randomised), then from the last block down
    cascading: dict[str, tuple[Similarity, ...]]  # method -> one per step, against the trained map
    independent: dict[str, tuple[Similarity, ...]]  # method -> one per block 0 .. depth - 1 (empty: not run)
    random_logit: dict[str, Similarity]  # method -> the explained class against `random_class`
    maps: dict[str, tuple[np.ndarray, ...]] = field(repr=False)  # method -> (grid_h, grid_w) map per step
    max_sensitivity: dict[str, float] = field(default_factory=dict)  # method -> relative, 0 = stable
    infidelity: dict[str, float] = field(default_factory=dict)  # method -> logit^2, lower = better
    settings: SanitySettings = SanitySettings()
    prompt: str | None = None  # the text prompt explained instead of a class (then `target` is its column)
    failures: dict[str, MethodFailure] = field(default_factory=dict)  # method -> why it was left out (its first)

    def record(self) -> dict:
        """The JSON record of the CLI (without the image and model fields): per method, ``cascading`` (one
        ``{randomised_from_block, spearman, ssim, top10_overlap}`` per step, the first with nothing randomised,
        ``randomised_from_block`` null, then the block from which on all are random, then "embedding"),
        ``independent`` (one ``{block, ...}`` per block), ``random_logit``, ``max_sensitivity``, ``infidelity``
        (null when not run) and ``passes_randomisation``; NaN is null; ``prompt`` the text explained, or null;
        ``left_out``: method -> why it was left out of every test."""
        def number(values: dict[str, float], method: str) -> float | None:
            value = values.get(method)
            return None if value is None or not math.isfinite(value) else round(float(value), 6)

        verdict = self.passes_randomisation()
        methods = {}
        for method, steps in self.cascading.items():
            methods[method] = {
                "cascading": [{"randomised_from_block": step, **s.as_dict()} for step, s in zip(self.steps, steps)],
                "independent": [{"block": block, **s.as_dict()} for block, s in enumerate(self.independent[method])],
                "random_logit": self.random_logit[method].as_dict() if method in self.random_logit else None,
                "max_sensitivity": number(self.max_sensitivity, method),
                "infidelity": number(self.infidelity, method),
                "passes_randomisation": verdict[method]}
        return {"target": self.target, "prompt": self.prompt, "random_class": self.random_class, "methods": methods,
                "left_out": {m: failure.public for m, failure in self.failures.items()}}

    def passes_randomisation(self, threshold: float = PASS_THRESHOLD) -> dict[str, bool | None]:
        """method -> whether its map, with every layer random, has a Spearman below `threshold` with the
        trained map (None when it is undefined, a constant map)."""
        last = {m: steps[-1].spearman for m, steps in self.cascading.items()}
        return {m: None if math.isnan(v) else bool(v < threshold) for m, v in last.items()}


def random_class(num_classes: int, target: int, seed: int | list[int] = 0) -> int:
    """A class other than `target`, uniformly among the other `num_classes - 1`, drawn by a generator seeded
    with `seed` (`sanity_check` seeds it with its seed and the image's pixels: the same image always gets the
    same class, different images different ones)."""
    if num_classes < 2:
        raise VitInspectError("The random-logit test needs a model with at least two classes.")
    drawn = int(np.random.default_rng(seed).integers(num_classes - 1))
    return drawn + int(drawn >= target)


def steps_of(depth: int) -> tuple[Layer | None, ...]:
    """The cascading steps of a `depth`-block model: None, then depth - 1 down to 0, then the embedding."""
    return (None, *cascade_order(depth))


def method_maps(analysis: ImageAnalysis, methods: tuple[str, ...], extra: Mapping[str, MapFn] | None = None,
                seed: int = 0, handle: ViTHandle | None = None, pixels: torch.Tensor | None = None
                ) -> tuple[dict[str, np.ndarray], dict[str, MethodFailure]]:
    """(method -> (grid_h, grid_w) float64 map, method -> why it has none) from one pass: `scored_maps` (the
    random map seeded from the pixels, so the same for the same image; methods with passes of their own run
    on ``handle`` with ``pixels``) and any `extra` map functions."""
    rng = image_permutation(analysis.rgb, analysis.layout.num_patches, seed)
    maps, failures = scored_maps(analysis, methods, rng, handle, pixels)
    for name, fn in (extra or {}).items():
        maps[name] = np.asarray(fn(analysis), dtype=np.float64)
    return maps, failures


def sanity_check(handle: ViTHandle, image: Image.Image | str | os.PathLike | bytes | torch.Tensor,
                 methods: tuple[str, ...] | None = None, target: int | str | Prompt | None = None,
                 settings: SanitySettings = SanitySettings(), extra: Mapping[str, MapFn] | None = None,
                 progress: Progress | None = None, cancelled: Callable[[], bool] | None = None,
                 limits: ImageLimits = ImageLimits()) -> ImageSanity:
    """Every sanity check of `methods` (and `extra` map functions) on one image, for `target` (a class, default
    the trained model's prediction; or a text prompt of a CLIP-style model), at the model's own crop; or on a model input given as it is, a (1, 3, H, W)
    tensor normalised with the model's mean and std (`analyze_pixels`: the app passes the crop its pass saw).
    ``methods`` default `sanity_methods()`; a method that fails on any pass (`methods.compute_map`) is left
    out of every test, its first reason in ``failures``. Passes: 1 (trained) + depth + 1 (cascading) + depth
    (independent) + 1 (random logit) + the noisy inputs of max-sensitivity; infidelity adds only forwards. The model's weights are the trained ones again
    afterwards, also after an exception or `Cancelled` (raised before the next pass once `cancelled()` is
    true)."""
    if not handle.has_head:
        raise VitInspectError("Sanity checks explain a class: this model has no classification head.")
    labels = len(handle.labels)  # the classes (zero-shot labels) a random logit is drawn from
    handle, target, _, prompt, _ = prompt_view(handle, target)  # a prompt: a column after the labels
    if isinstance(image, torch.Tensor):
        pixels = image  # (1, 3, H, W), normalised
    else:
        picture = image if isinstance(image, Image.Image) else load_image(image, limits)
        warn_if_blurred(picture.size, handle.patch_size)
        pixels, _ = handle.preprocess.apply(picture)  # (1, 3, H, W)
    methods = sanity_methods() if methods is None else methods
    relevance = needs_relevance(methods)
    failed: dict[str, MethodFailure] = {}  # method -> its first failure
    robust = settings.robustness
    steps = steps_of(handle.depth)
    total = (len(steps) + (handle.depth if settings.independent else 0) + int(settings.random_logit)
             + (robust.sensitivity_samples if robust else 0))
    done = [0]

    def run(target_class: int | None, inputs: torch.Tensor | None = None) -> tuple[ImageAnalysis, dict]:
        """One pass (of `pixels`, or of `inputs`) and its maps; a failed method's map is NaN (left out below)."""
        if cancelled is not None and cancelled():
            raise Cancelled(f"The sanity checks were cancelled after {done[0]} of {total} passes.")
        seen = pixels if inputs is None else inputs
        analysis = analyze_pixels(handle, seen, target_class, PassOptions(relevance=relevance))
        done[0] += 1
        if progress is not None:
            progress(done[0], total)
        maps, failures = method_maps(analysis, methods, extra, settings.seed, handle, seen)
        for name, failure in failures.items():
            failed.setdefault(name, failure)
            maps[name] = np.full((analysis.layout.grid_h, analysis.layout.grid_w), np.nan)
        return analysis, maps

    analysis, trained = run(target)
    explained = int(analysis.target)
    other = None
    if settings.random_logit:  # checked before the other passes
        # a prompt's column is `labels`: every label is another class, drawn uniformly among all of them
        other = settings.random_class if settings.random_class is not None else random_class(
            labels + int(prompt is not None), explained, [settings.seed, pixel_digest(analysis.rgb)])
        if not 0 <= other < labels or other == explained:
            raise VitInspectError(f"The random-logit class must be another class of the model (0 to "
                                  f"{labels - 1}, not {explained}); got {other}.")
    fresh = fresh_weights(handle, settings.seed)
    step_maps = [trained]
    with ExitStack() as stack:
        for layer in steps[1:]:
            stack.enter_context(randomised(handle, [layer], fresh))
            step_maps.append(run(explained)[1])
    cascading = {m: tuple(similarity(trained[m], s[m]) for s in step_maps) for m in trained}
    independent: dict[str, tuple[Similarity, ...]] = {m: () for m in trained}
    if settings.independent:
        block_maps = []
        for block in range(handle.depth):
            with randomised(handle, [block], fresh):
                block_maps.append(run(explained)[1])
        independent = {m: tuple(similarity(trained[m], b[m]) for b in block_maps) for m in trained}
    random_logit: dict[str, Similarity] = {}
    if other is not None:
        contrast = run(other)[1]
        random_logit = {m: similarity(trained[m], contrast[m]) for m in trained}
    sensitivity: dict[str, float] = {}
    fidelity: dict[str, float] = {}
    if robust is not None:
        sensitivity = max_sensitivity(handle, pixels, trained, lambda row: run(explained, row)[1], robust)
        fidelity = infidelity(handle, pixels, explained, {m: v for m, v in trained.items() if m not in failed},
                              analysis.layout, robust)
    kept = [m for m in trained if m not in failed]
    cascading, independent, random_logit, sensitivity = (
        {m: v for m, v in values.items() if m in kept} for values in (cascading, independent, random_logit, sensitivity))
    return ImageSanity(target=explained, random_class=other, steps=steps, cascading=cascading,
                       independent=independent, random_logit=random_logit,
                       maps={m: tuple(s[m] for s in step_maps) for m in kept},
                       max_sensitivity=sensitivity, infidelity=fidelity, settings=settings,
                       prompt=None if prompt is None else prompt.text, failures=failed)


class SanityAccumulator:
    """Running sums of the similarities (and robustness numbers) per method, test and step over images, each
    value counted only where it is finite (a constant map's Spearman is NaN); `state` / `from_state` make
    them engine `Sums`, `table` gives mean ± standard error and the count behind each."""

    KINDS = ("cascading", "independent", "random_logit", "max_sensitivity", "infidelity", "passes", "left_out")

    def __init__(self) -> None:
        self.images = 0
        self._sum: dict[str, np.ndarray] = {}  # "<kind>/<method>" -> sums, shaped by the kind
        self._sum_sq: dict[str, np.ndarray] = {}
        self._n: dict[str, np.ndarray] = {}  # finite values counted, same shape

    def _add(self, key: str, values) -> None:
        values = np.asarray(values, dtype=np.float64)
        finite = np.isfinite(values)
        clean = np.where(finite, values, 0.0)
        self._sum[key] = self._sum.get(key, 0.0) + clean
        self._sum_sq[key] = self._sum_sq.get(key, 0.0) + clean ** 2
        self._n[key] = self._n.get(key, 0.0) + finite

    def add(self, result: ImageSanity) -> None:
        self.images += 1
        verdict = result.passes_randomisation()
        for method, steps in result.cascading.items():
            self._add(f"cascading/{method}", [s.values() for s in steps])  # (steps, 3)
            if result.independent.get(method):
                self._add(f"independent/{method}", [s.values() for s in result.independent[method]])  # (depth, 3)
            if method in result.random_logit:
                self._add(f"random_logit/{method}", result.random_logit[method].values())  # (3,)
            for kind, numbers in (("max_sensitivity", result.max_sensitivity), ("infidelity", result.infidelity)):
                if method in numbers:
                    self._add(f"{kind}/{method}", [numbers[method]])  # (1,)
            self._add(f"passes/{method}", [np.nan if verdict[method] is None else float(verdict[method])])
        for method in result.failures:
            self._add(f"left_out/{method}", [1.0])  # (1,): images on which the method failed

    def state(self) -> tuple[dict[str, np.ndarray], int]:
        """(arrays, images): "sum/K", "sum_sq/K" and "n/K" for each key K = "<kind>/<method>". Adding two
        states name by name equals accumulating both sets of images."""
        arrays = {}
        for key in self._sum:
            arrays[f"sum/{key}"] = np.asarray(self._sum[key], np.float64)
            arrays[f"sum_sq/{key}"] = np.asarray(self._sum_sq[key], np.float64)
            arrays[f"n/{key}"] = np.asarray(self._n[key], np.float64)
        return arrays, self.images

    @classmethod
    def from_state(cls, arrays, images: int) -> "SanityAccumulator":
        accumulator = cls()
        accumulator.images = int(images)
        for name, value in arrays.items():
            if name.startswith("sum/"):
                key = name[len("sum/"):]
                accumulator._sum[key] = np.asarray(value, np.float64)
                accumulator._sum_sq[key] = np.asarray(arrays[f"sum_sq/{key}"], np.float64)
                accumulator._n[key] = np.asarray(arrays[f"n/{key}"], np.float64)
        return accumulator

    def table(self) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        """kind -> method -> (mean, standard error, count), arrays shaped like one image's values: cascading
        (steps, 3) and independent (depth, 3) in `SIMILARITIES` order, random_logit (3,), max_sensitivity,
        infidelity and passes (the share of images whose map passes the randomisation test) (1,). The mean is
        NaN where no value was finite, the standard error where fewer than two were."""
        table: dict[str, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        for key in sorted(self._sum):
            kind, method = key.split("/", 1)
            n, total, squares = self._n[key], self._sum[key], self._sum_sq[key]
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = np.where(n > 0, total / np.maximum(n, 1), np.nan)
                var = np.where(n > 1, (squares - n * mean ** 2) / np.maximum(n - 1, 1), np.nan)
                se = np.sqrt(np.maximum(var, 0.0) / np.maximum(n, 1))
            table.setdefault(kind, {})[method] = (mean, np.where(n > 1, se, np.nan), n)
        return table


__all__ = ["EMBEDDING", "ImageSanity", "PASS_THRESHOLD", "SANITY_METHODS", "SIMILARITIES", "SanityAccumulator",
           "SanitySettings", "Similarity", "method_maps", "needs_relevance", "random_class", "sanity_check",
           "sanity_methods", "similarity", "steps_of"]
