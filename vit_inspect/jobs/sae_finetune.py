"""A short fine-tune of a trained SAE on what replacing the block's tokens does to the prediction: the
"end-to-end" fine-tune of Karvonen 2025 (arXiv:2503.17272), here over a few hundred steps after training.

Loss, over one batch of training images (their views as the activation pass forms them, `jobs.sae.image_views`):

    L = mean_views KL(p ‖ p̂) + a · Σ‖x − x̂‖² / Σ‖x‖²

with p the softmax of the unmodified model's class logits, p̂ that of the model with the SAE's tokens of block
`layer` replaced by their reconstruction x̂ (KL in nats), x the tokens in the SAE's normalised units and a the
`mse_weight`. The model's weights stay fixed; the SAE's four tensors are trained with Adam, W_dec's rows kept at
unit norm as in training (`jobs.sae_train`), the learning rate decayed linearly to 0 over the last fifth of the
steps. The MSE term keeps x̂ a reconstruction of x; KL alone lets the codes drift toward whatever serves these
images' predictions. Each step runs the model twice over its views: once without gradients (p), once with the SAE
in place, its gradient flowing back through the blocks after `layer` to the SAE. Memory: one batch.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from vit_inspect.analysis.sae import kl_divergence, normalise
from vit_inspect.core.errors import ImageError, VitInspectError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import ImageLimits
from vit_inspect.core.sae_file import SparseAutoencoder, check_fits
from vit_inspect.jobs.engine import decode, item_name
from vit_inspect.jobs.sae import image_views
from vit_inspect.jobs.sae_train import unit_norm_step
from vit_inspect.passes.sae import replaced_block_output

MAX_STEPS = 100_000


@dataclass(frozen=True)
class FineTuneOptions:
    """How the KL fine-tune runs."""

    steps: int  # Adam steps, one batch of images each
    lr: float = 1e-4
    images: int = 4  # images per step; each gives 1 view, 2 with mirroring, + N crops
    mse_weight: float = 1.0  # a, the weight of the normalised MSE beside the KL
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.steps <= MAX_STEPS:
            raise VitInspectError(f"--kl-steps must be between 1 and {MAX_STEPS:,}; got {self.steps}.")
        if not (0 < self.lr < math.inf and 0 <= self.mse_weight < math.inf) or self.images < 1:
            raise VitInspectError("--kl-lr and the images per step must be positive, the MSE weight 0 or more.")

    def check_images(self, count: int) -> None:
        """A sentence when a step would take more images than the `count` training images (the step's memory grows
        with its images, and an image twice in one step adds nothing)."""
        if self.images > count:
            raise VitInspectError(f"--kl-images ({self.images}) is more than the {count} training images.")


def fine_tune_kl(handle: ViTHandle, sae: SparseAutoencoder, files: Sequence[Path], options: FineTuneOptions,
                 mirror: bool = False, crops: int = 0, crop_seed: int = 0,
                 progress: Callable[[int, int], None] | None = None,
                 limits: ImageLimits = ImageLimits()) -> SparseAutoencoder:
    """`sae` fine-tuned on the views of `files` (each step: `options.images` of them, in a seeded random order,
    every image once before any twice); its metadata's `training.kl_fine_tune` records the options, the mean KL
    of the first and last tenth of the steps, and the seconds. `crop_seed` seeds the crops as in the activation
    pass. Images `limits` refuses, or that cannot be read, are left out."""
    check_fits(sae, handle.name, handle.depth, handle.embed_dim)
    options.check_images(len(files))
    if not handle.has_head:
        raise VitInspectError(f"{handle.name!r} has no classifier head; the KL fine-tune needs one.")
    started = time.perf_counter()
    torch.manual_seed(options.seed)
    rng = np.random.default_rng(options.seed)
    device = handle.device
    moved = sae.to(device)
    params = [t.detach().clone().requires_grad_() for t in (moved.W_enc, moved.b_enc, moved.W_dec, moved.b_dec)]
    trained = replace(moved, W_enc=params[0], b_enc=params[1], W_dec=params[2], b_dec=params[3])
    optimiser = torch.optim.Adam(params, lr=options.lr)
    layout = handle.layout()
    order, position, kls, unreadable = rng.permutation(len(files)), 0, [], set()
    for step in range(options.steps):
        images, names = [], []
        while len(images) < options.images:
            if len(unreadable) == len(files):
                raise VitInspectError("None of the images could be read.")
            if position == len(order):
                order, position = rng.permutation(len(files)), 0
            index, position = int(order[position]), position + 1
            if index in unreadable:
                continue
            try:
                images.append(decode(files[index], limits))
            except ImageError:
                unreadable.add(index)
                continue
            names.append(item_name(files[index]))
        pixels = image_views(handle, images, names, mirror, crops, crop_seed).to(device)
        with torch.no_grad():
            reference = handle.forward(pixels)
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        with replaced_block_output(handle, trained, layout, lambda t, h: pairs.append((t, h)), keep_graph=True):
            replaced = handle.forward(pixels)
        x, x_hat = normalise(pairs[0][0].float(), trained), normalise(pairs[0][1].float(), trained)
        kl = kl_divergence(reference, replaced).mean()
        loss = kl + options.mse_weight * ((x - x_hat) ** 2).sum() / (x ** 2).sum().clamp_min(1e-12)
        grads = torch.autograd.grad(loss, params)
        for p, g in zip(params, grads):
            p.grad = g
        unit_norm_step(optimiser, params[2], options.lr, step, options.steps)  # as in training
        kls.append(float(kl.detach()))
        if progress is not None:
            progress(step + 1, options.steps)
    tenth = max(1, options.steps // 10)
    record = {"steps": options.steps, "lr": options.lr, "images_per_step": options.images,
              "mse_weight": options.mse_weight, "seed": options.seed, "method": "KL + MSE (Karvonen 2025)",
              "kl_first": round(float(np.mean(kls[:tenth])), 6), "kl_last": round(float(np.mean(kls[-tenth:])), 6),
              "seconds": round(time.perf_counter() - started, 1)}
    info = replace(sae.info, training={**sae.info.training, "kl_fine_tune": record})
    return SparseAutoencoder(*(p.detach().cpu() for p in params), info, sae.input_mean, sae.input_scale)
