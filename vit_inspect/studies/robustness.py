"""Robustness of maps: max-sensitivity and infidelity (Yeh, Hsieh, Suggala, Inouye & Ravikumar 2019, "On the
(In)fidelity and Sensitivity of Explanations", NeurIPS), computed by `captum.metrics`.

- **Max-sensitivity** (Yeh et al. Def. 3.1, as `captum.metrics.sensitivity_max` estimates it):
  max over n inputs y drawn uniformly from the L∞ ball of radius r around x of ||Φ(y) - Φ(x)||_F / ||Φ(x)||_F,
  Φ the (grid_h, grid_w) map, raw. Relative (captum divides by the norm of the clean map), so maps in
  different units compare; 0 is perfectly stable. The radius is given on the 0..1 pixel scale and converted
  to the model's normalised input per channel (r / std_c): r = 0.02 is about ±5 grey levels. Each y gets a
  full analysis pass (`passes.pipeline.analyze_pixels`, the one-pass code), which yields every method's map
  at once: the passes are shared by all methods (keyed by the perturbed input's bytes), so n + 1 maps cost n
  passes, whatever the number of methods. captum hands the perturbed inputs over in batches of
  `batch_size`; the pass itself takes one image at a time.
- **Infidelity** (Yeh et al. Def. 2.1 with the optimal scale β of captum's ``normalize=True``, so that the
  arbitrary units of a map do not matter): E_I[(β I^T Φ - (f(x) - f(x - I)))^2] with f the logit of the
  explained class and I a random patch removal: each patch is removed (set to the dataset mean colour, 0
  after normalisation, as in faithfulness) with probability p, independently, n draws. The map is a score
  per patch, so I^T Φ is the sum of the map over the removed patches (the map spread evenly over its
  patch's pixels and channels; I the removal indicator). Units: logit²; lower is better. Only forwards:
  the perturbed inputs are scored once, in batches, for all methods.

captum is imported inside the functions: the library imports without it (requirements.txt brings it, and
so does the ``sanity`` extra).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from vit_inspect.analysis.faithfulness import PerturbationSettings, compose, replacement_images
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.tokens import TokenLayout

MapsOf = Callable[[torch.Tensor], dict[str, np.ndarray]]  # (1, 3, H, W) input -> method -> (grid_h, grid_w) map


@dataclass(frozen=True)
class RobustnessSettings:
    """How the robustness metrics perturb an image; every number is stated with the results."""

    radius: float = 0.02  # L∞ radius of the uniform input noise on the 0..1 pixel scale (0.02 ≈ ±5 grey levels)
    sensitivity_samples: int = 10  # noisy inputs per image for max-sensitivity (captum's default)
    infidelity_samples: int = 32  # random patch removals per image for infidelity
    removal_probability: float = 0.1  # chance that each patch is removed in one infidelity draw
    batch_size: int = 8  # perturbed inputs captum hands over at once
    seed: int = 0  # the noise and the removals

    def __post_init__(self) -> None:
        if not self.radius > 0 or not 0 < self.removal_probability < 1:
            raise ValueError(f"the radius must be > 0 and the removal probability in (0, 1), got {self.radius} "
                             f"and {self.removal_probability}")
        if min(self.sensitivity_samples, self.infidelity_samples, self.batch_size) < 1:
            raise ValueError("sample counts and the batch size must be at least 1")


def captum_metric(name: str) -> Callable:
    """`captum.metrics.<name>`, imported here; a sentence saying how to install captum when it is missing."""
    try:
        import captum.metrics
    except ImportError:
        raise VitInspectError("Max-sensitivity and infidelity need captum, which is not installed: "
                              "pip install -r requirements.txt (or leave the robustness metrics out).") from None
    return getattr(captum.metrics, name)


def _key(row: torch.Tensor) -> bytes:
    return hashlib.blake2b(row.detach().float().cpu().contiguous().numpy().tobytes(), digest_size=16).digest()


def _first(inputs) -> torch.Tensor:
    return inputs[0] if isinstance(inputs, tuple) else inputs


def max_sensitivity(handle: ViTHandle, pixels: torch.Tensor, clean: dict[str, np.ndarray], maps_of: MapsOf,
                    settings: RobustnessSettings = RobustnessSettings(),
                    progress: Callable[[], None] | None = None) -> dict[str, float]:
    """Max-sensitivity of each map in `clean` (method -> map of the (1, 3, H, W) normalised input `pixels`)
    through `captum.metrics.sensitivity_max`; `maps_of` recomputes every method's map for a perturbed
    input (one analysis pass). `progress()` is called after each pass."""
    sensitivity_max = captum_metric("sensitivity_max")

    pixels = pixels.detach().float().cpu()
    cache = {_key(pixels[0]): clean}
    std = torch.tensor(handle.preprocess.std, dtype=torch.float32).view(1, 3, 1, 1)

    def maps(inputs: torch.Tensor) -> list[dict[str, np.ndarray]]:
        rows = []
        for row in _first(inputs):
            key = _key(row)
            if key not in cache:
                cache[key] = maps_of(row[None])
                if progress is not None:
                    progress()
            rows.append(cache[key])
        return rows

    result = {}
    for method in clean:
        generator = torch.Generator().manual_seed(settings.seed)  # the same noise for every method

        def noise(inputs: torch.Tensor, radius: float) -> torch.Tensor:
            uniform = torch.rand(inputs.shape, generator=generator) * 2 - 1  # U(-1, 1)
            return inputs + uniform * (radius / std)

        def explain(inputs, name=method):  # captum's convention: a tuple of inputs gets a tuple of maps
            stacked = torch.from_numpy(np.stack([m[name] for m in maps(inputs)])).float()  # (B, grid_h, grid_w)
            return (stacked,) if isinstance(inputs, tuple) else stacked

        value = sensitivity_max(explain, pixels, perturb_func=noise, perturb_radius=settings.radius,
                                n_perturb_samples=settings.sensitivity_samples,
                                max_examples_per_batch=min(settings.batch_size, settings.sensitivity_samples))
        result[method] = float(value.reshape(-1)[0])
    return result


def removal_draws(num_patches: int, settings: RobustnessSettings) -> np.ndarray:
    """(n, P) bool: the patches each infidelity draw removes (each with probability p, seeded)."""
    rng = np.random.default_rng([settings.seed, num_patches])
    return rng.random((settings.infidelity_samples, num_patches)) < settings.removal_probability


def on_pixels(patch_values: np.ndarray, layout: TokenLayout, size: tuple[int, int]) -> torch.Tensor:
    """(B, grid_h, grid_w) -> (B, 3, H, W) float32: each patch's value on all its pixels and channels, 0 outside
    the patch grid (pixels a crop to whole patches leaves out)."""
    values = torch.from_numpy(np.asarray(patch_values, np.float32))  # (B, gh, gw)
    spread = values.repeat_interleave(layout.patch_h, 1).repeat_interleave(layout.patch_w, 2)  # (B, gh*ph, gw*pw)
    full = torch.zeros(values.shape[0], 3, *size)
    full[:, :, :spread.shape[1], :spread.shape[2]] = spread[:, None]
    return full


def infidelity(handle: ViTHandle, pixels: torch.Tensor, target: int, maps: dict[str, np.ndarray],
               layout: TokenLayout, settings: RobustnessSettings = RobustnessSettings()) -> dict[str, float]:
    """Infidelity of each map (method -> (grid_h, grid_w)) of the (1, 3, H, W) normalised input `pixels` for
    class `target` through `captum.metrics.infidelity` (``normalize=True``), with random patch removals."""
    captum_infidelity = captum_metric("infidelity")

    pixels = pixels.detach().float().cpu()
    image, size = pixels[0], tuple(pixels.shape[-2:])  # (3, H, W)
    removed = removal_draws(layout.num_patches, settings)  # (n, P)
    background = replacement_images(image, PerturbationSettings(removal="mean"))  # (2, 3, H, W); 0: the mean
    perturbed = compose(image, background, ~removed, np.zeros(len(removed), np.int64), layout)  # (n, 3, H, W)
    indicator = on_pixels(removed.reshape(-1, layout.grid_h, layout.grid_w), layout, size)  # (n, 3, H, W) I
    per_pixel = 3 * layout.patch_h * layout.patch_w
    scores: dict[bytes, float] = {}

    def forward(inputs) -> torch.Tensor:  # (B,) logit of the target; each distinct input scored once
        x = _first(inputs)
        keys = [_key(row) for row in x]
        todo = [i for i, k in enumerate(keys) if k not in scores]
        if todo:
            with torch.no_grad():
                logits = handle.forward(x[todo].to(handle.device)).float().cpu()[:, target]
            scores.update({keys[i]: float(v) for i, v in zip(todo, logits)})
        return torch.tensor([scores[k] for k in keys])

    result = {}
    for method, grid_map in maps.items():
        served = [0]  # captum asks for the draws chunk by chunk, in order

        def perturb(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            start, stop = served[0], served[0] + inputs.shape[0]
            served[0] = stop
            return indicator[start:stop], perturbed[start:stop]

        attributions = on_pixels(np.asarray(grid_map)[None] / per_pixel, layout, size)  # I^T Φ = Σ removed Φ
        value = captum_infidelity(forward, perturb, pixels, attributions,
                                  n_perturb_samples=settings.infidelity_samples,
                                  max_examples_per_batch=min(settings.batch_size, settings.infidelity_samples),
                                  normalize=True)
        result[method] = float(value.reshape(-1)[0])
    return result
