"""Faithfulness of an explanation map: perturb the patches it ranks, watch the model's score.

Two families of perturbation tests, both on the patch grid (one patch = one token):

- **Positive / negative perturbation** (Chefer, Gur & Wolf 2021, "Transformer Interpretability Beyond
  Attention Visualization", Sec. 4.2): remove the most (positive) or least (negative) relevant
  ``round(P·k)`` patches for k = 0, .1, …, .9 and record whether the top-1 prediction is still the label
  (1/0). AUC = trapezoid over x = 0 … 0.9, ×100, so a model that is always right scores 90.
  Positive: lower is better; negative: higher is better.
- **Deletion / insertion** (Petsiuk, Das & Saenko 2018, "RISE", Sec. 4.1): the softmax probability of the
  explained class while the most relevant patches are removed (k = 0 … 1 by .1), or inserted into a
  blurred copy of the image. AUC = trapezoid over x = 0 … 1 (a probability). Deletion: lower is better;
  insertion: higher is better.

- **For a text prompt** (a CLIP-style model, `curves_from_scores`) the score is not a probability: every curve
  records the explained score itself, the cosine similarity s = cos(f, t) of the image and prompt embeddings
  (with a versus prompt, s = cos(f, t_A) - cos(f, t_B)), in cosine units (-1 … 1). Deletion / insertion keep
  their definition with the probability replaced by s: AUC = ∫ s dk over k = 0 … 1 (the mean similarity along
  the curve). Positive / negative perturbation replace the 1/0 top-1 indicator by s over k = 0 … .9, ×100:
  AUC = 100 ∫ s dk over 0 … .9, so an image whose similarity stayed 1 would score 90, as an always-right
  classifier does. Lower is better for pos and del, higher for neg and ins, as for classes. A similarity has
  no fixed range across images and prompts (a random CLIP gives cosines near 0, a trained one about 0.2-0.35
  for a matching caption), so these AUCs compare maps of one image and prompt, with the random map as the
  floor; averaged over images they are mean similarities, not accuracies.

A removed patch takes the value of a replacement image: by default 0 after normalisation, i.e. the
dataset mean colour (`PerturbationSettings.removal="mean"`), or the blurred image (``"blur"``). The blur is
a Gaussian of the *normalised* image (torchvision's `gaussian_blur`, reflect padding, kernel 11, σ = 5).

Ties in a map (a ReLU'd map has many zeros) are broken by one random permutation of the patches per image,
shared by every method, so that no method profits from the row-major order.

Everything here is pure: a plan of perturbed inputs is built from maps, the inputs are composed from the
clean image and the replacement images chunk by chunk (`compose`), and a caller-supplied batched model
call turns them into probabilities. `vit_inspect.studies.faithfulness` is the one place that batches the model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vit_inspect.core.tokens import TokenLayout

POS_NEG_FRACTIONS = np.round(np.arange(10) / 10, 1)  # k = 0, .1, ..., .9 (Chefer et al.)
DEL_INS_FRACTIONS = np.round(np.arange(11) / 10, 1)  # k = 0, .1, ..., 1 (Petsiuk et al.)
CURVES = ("pos", "neg", "del", "ins")
LOWER_IS_BETTER = {"pos": True, "neg": False, "del": True, "ins": False}
REMOVALS = ("mean", "blur")


@dataclass(frozen=True)
class PerturbationSettings:
    """How patches are removed and from what insertion starts."""

    removal: str = "mean"  # removed patches become 0 after normalisation ("mean") or the blurred image ("blur")
    insertion_start: str = "blur"  # insertion starts from the blurred image ("blur") or the mean image ("mean")
    blur_kernel: int = 11  # Gaussian kernel size in pixels (odd)
    blur_sigma: float = 5.0  # Gaussian standard deviation in pixels

    def __post_init__(self) -> None:
        if self.removal not in REMOVALS or self.insertion_start not in REMOVALS:
            raise ValueError(f"removal and insertion_start must be one of {REMOVALS}, "
                             f"got {self.removal!r} and {self.insertion_start!r}")
        if self.blur_kernel < 1 or self.blur_kernel % 2 == 0 or not self.blur_sigma > 0:
            raise ValueError(f"blur needs an odd kernel >= 1 and sigma > 0, got {self.blur_kernel}, {self.blur_sigma}")


def patch_counts(fractions: np.ndarray, num_patches: int) -> np.ndarray:
    """Patches removed at each fraction: round(P·k) (Python/NumPy round-half-even)."""
    return np.rint(np.asarray(fractions, dtype=np.float64) * num_patches).astype(np.int64)


def ranking(relevance: np.ndarray, permutation: np.ndarray, descending: bool = True) -> np.ndarray:
    """(P,) patch indices from most (descending) or least relevant; ties in the order of `permutation`.

    ``relevance`` is any (grid_h, grid_w) or (P,) map (raw values: only the order matters).
    """
    values = np.asarray(relevance, dtype=np.float64).ravel()
    if permutation.shape != values.shape:
        raise ValueError(f"permutation has {permutation.shape[0]} entries, the map {values.size}")
    if not np.all(np.isfinite(values)):
        raise ValueError("the map has NaN or infinite values; it cannot rank patches")
    shuffled = values[permutation]
    order = np.argsort(-shuffled if descending else shuffled, kind="stable")
    return permutation[order]


def auc(curve: np.ndarray, fractions: np.ndarray, scale: float = 1.0) -> float:
    """Trapezoid area under `curve` over `fractions`, times `scale` (100 for pos/neg)."""
    curve = np.asarray(curve, dtype=np.float64)
    x = np.asarray(fractions, dtype=np.float64)
    return float(scale * np.sum((x[1:] - x[:-1]) * (curve[1:] + curve[:-1]) / 2.0))


@dataclass(frozen=True)
class Curves:
    """The four perturbation curves of one map on one image, and their areas."""

    pos: np.ndarray  # (10,) top-1 correct (1/0; a prompt: its similarity) after removing the most relevant
    #                  round(P·k) patches, k = 0 … .9
    neg: np.ndarray  # (10,) the same, removing the least relevant first
    deletion: np.ndarray  # (11,) probability of the explained class (a prompt: its similarity), most relevant
    #                       removed first, k = 0 … 1
    insertion: np.ndarray  # (11,) the same, most relevant inserted into the start image first

    def auc(self, curve: str) -> float:
        """AUC of "pos" / "neg" (×100, over 0 … .9) or "del" / "ins" (over 0 … 1)."""
        if curve in ("pos", "neg"):
            return auc(getattr(self, curve), POS_NEG_FRACTIONS, 100.0)
        if curve == "del":
            return auc(self.deletion, DEL_INS_FRACTIONS)
        if curve == "ins":
            return auc(self.insertion, DEL_INS_FRACTIONS)
        raise ValueError(f"unknown curve {curve!r}; use one of {CURVES}")

    def aucs(self) -> dict[str, float]:
        return {name: self.auc(name) for name in CURVES}


@dataclass(frozen=True)
class PerturbationPlan:
    """Every distinct perturbed input one image needs for a set of maps, and where each curve point reads.

    Input ``u`` shows the clean image where ``keep[u]`` is True and replacement image ``source[u]``
    elsewhere (0: the removal image, 1: the insertion start image). Identical inputs are listed once:
    the clean image serves k = 0 of pos/neg/del and k = 1 of ins for every method, positive perturbation
    and deletion share their inputs, and so on.
    """

    keep: np.ndarray  # (U, P) bool, per distinct input: patch shows the clean image
    source: np.ndarray  # (U,) int, replacement image of the patches not kept
    index: dict[str, dict[str, np.ndarray]] = field(repr=False)  # method -> curve -> (K,) rows of keep/source


def plan_perturbations(maps: dict[str, np.ndarray], permutation: np.ndarray) -> PerturbationPlan:
    """The distinct perturbed inputs that the four curves of every map need (see `PerturbationPlan`)."""
    num_patches = permutation.shape[0]
    rows: dict[tuple[int, bytes], int] = {}
    keeps: list[np.ndarray] = []
    sources: list[int] = []

    def row(keep: np.ndarray, source: int) -> int:
        source = 0 if keep.all() else source  # nothing replaced: the clean image, whatever the source
        key = (source, np.packbits(keep).tobytes())
        if key not in rows:
            rows[key] = len(keeps)
            keeps.append(keep)
            sources.append(source)
        return rows[key]

    def removed_first(order: np.ndarray, counts: np.ndarray) -> np.ndarray:
        result = []
        for count in counts:
            keep = np.ones(num_patches, dtype=bool)
            keep[order[:count]] = False
            result.append(row(keep, 0))
        return np.array(result)

    def inserted_first(order: np.ndarray, counts: np.ndarray) -> np.ndarray:
        result = []
        for count in counts:
            keep = np.zeros(num_patches, dtype=bool)
            keep[order[:count]] = True
            result.append(row(keep, 1))
        return np.array(result)

    pos_counts = patch_counts(POS_NEG_FRACTIONS, num_patches)
    del_counts = patch_counts(DEL_INS_FRACTIONS, num_patches)
    index: dict[str, dict[str, np.ndarray]] = {}
    for name, relevance in maps.items():
        most = ranking(relevance, permutation, descending=True)
        least = ranking(relevance, permutation, descending=False)
        index[name] = {"pos": removed_first(most, pos_counts), "neg": removed_first(least, pos_counts),
                       "del": removed_first(most, del_counts), "ins": inserted_first(most, del_counts)}
    return PerturbationPlan(keep=np.stack(keeps), source=np.array(sources, dtype=np.int64), index=index)


def blur(pixels: torch.Tensor, settings: PerturbationSettings) -> torch.Tensor:
    """(..., 3, H, W) Gaussian blur of normalised pixels (torchvision, reflect padding)."""
    from torchvision.transforms.functional import gaussian_blur

    return gaussian_blur(pixels, [settings.blur_kernel] * 2, [settings.blur_sigma] * 2)


def replacement_images(pixels: torch.Tensor, settings: PerturbationSettings) -> torch.Tensor:
    """(2, 3, H, W): the removal image (source 0) and the insertion start image (source 1) for (3, H, W) pixels."""
    blurred = blur(pixels, settings)
    mean = torch.zeros_like(pixels)  # 0 after normalisation = the dataset mean colour
    pick = {"mean": mean, "blur": blurred}
    return torch.stack([pick[settings.removal], pick[settings.insertion_start]])


def compose(pixels: torch.Tensor, replacements: torch.Tensor, keep: np.ndarray, source: np.ndarray,
            layout: TokenLayout) -> torch.Tensor:
    """(B, 3, H, W) perturbed inputs: the clean (3, H, W) pixels where `keep` (B, P) is True, else
    ``replacements[source]``. Pixels outside the patch grid (none for a cropped input) stay clean."""
    mask = torch.from_numpy(keep).to(pixels.device).view(-1, 1, layout.grid_h, layout.grid_w)  # (B, 1, gh, gw)
    mask = mask.repeat_interleave(layout.patch_h, dim=2).repeat_interleave(layout.patch_w, dim=3)  # (B, 1, gh*ph, gw*pw)
    height, width = pixels.shape[-2:]
    grid_h, grid_w = layout.input_size
    full = torch.ones(mask.shape[0], 1, height, width, dtype=torch.bool, device=pixels.device)
    full[:, :, :grid_h, :grid_w] = mask
    background = replacements[torch.from_numpy(source).to(pixels.device)]  # (B, 3, H, W)
    return torch.where(full, pixels.unsqueeze(0), background)


def curves_from_probs(plan: PerturbationPlan, probs: np.ndarray, label: int, target: int) -> dict[str, Curves]:
    """Curves of every planned map from the (U, num_classes) probabilities of the planned inputs.

    pos/neg: 1 where the top-1 class is ``label``; del/ins: probability of ``target``.
    """
    correct = (np.argmax(probs, axis=1) == label).astype(np.float64)  # (U,)
    prob = probs[:, target].astype(np.float64)  # (U,)
    return {name: Curves(pos=correct[rows["pos"]], neg=correct[rows["neg"]], deletion=prob[rows["del"]],
                         insertion=prob[rows["ins"]])
            for name, rows in plan.index.items()}


def curves_from_scores(plan: PerturbationPlan, scores: np.ndarray) -> dict[str, Curves]:
    """Curves of every planned map from the (U,) explained scores of the planned inputs (a prompt's cosine
    similarity, see the module docstring): all four curves record the score itself."""
    score = np.asarray(scores, dtype=np.float64).reshape(-1)  # (U,)
    return {name: Curves(pos=score[rows["pos"]], neg=score[rows["neg"]], deletion=score[rows["del"]],
                         insertion=score[rows["ins"]])
            for name, rows in plan.index.items()}


def better(curve: str, a: float, b: float) -> bool:
    """Whether AUC `a` is strictly better than `b` on `curve`."""
    return a < b if LOWER_IS_BETTER[curve] else a > b
