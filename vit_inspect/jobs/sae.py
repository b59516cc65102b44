"""Folder jobs of sparse autoencoders, for any engine (`jobs.run.run_job`).

`SAEActivationJob`: one forward per image; block `layer`'s output tokens are written to a spill folder, one
`.npy` file of (n, d) float32 per batch, and the running sums give their mean and scale. With `mirror`, each
image's model input mirrored left to right is forwarded too (its tokens follow the batch's own in the file): the
same photos give twice the tokens, as the horizontal flip of ImageNet training augments them. With `crops` N, N
random squares of each photo (`core.images.square_crops`: 50-100 % of its shorter side, mirrored at random) are
forwarded too, drawn from a generator seeded by `seed` and the image's name, so every engine and batch order
draws the same crops; their tokens follow. Under Ray the actors
write there too: on one machine that is the local disk; on a cluster it must be a folder every node shares.
`SAEEvalJob`: the quality of an SAE over a folder (`analysis.sae`): running sums of the reconstruction error,
the codes and the model's predictions with the block's tokens replaced by x̂ against the unmodified model.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from vit_inspect.analysis.sae import (dead_fraction, encode, kl_divergence, l0, normalise, top1_agreement,
                                      variance_explained)
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import square_crops
from vit_inspect.core.load import load_model
from vit_inspect.core.sae_file import SparseAutoencoder, check_fits
from vit_inspect.core.sae_load import load_sae
from vit_inspect.jobs.engine import Skipped, Sums
from vit_inspect.passes.sae import block_output, replaced_block_output, token_slice


def _pixels(handle: ViTHandle, images: Sequence[np.ndarray]) -> torch.Tensor:
    return torch.cat([handle.preprocess.apply(Image.fromarray(rgb))[0] for rgb in images])  # (B, 3, H, W)


def _require_images(sums: Sums, skipped: Skipped) -> None:
    if sums.count == 0:
        raise VitInspectError("None of the images could be read."
                              + (f" First problem: {skipped[0][0]}: {skipped[0][1]}" if skipped else ""))


def crops_of(rgb: np.ndarray, name: str, crops: int, seed: int) -> list[Image.Image]:
    """`crops` random squares of one image (`core.images.square_crops`), from a generator seeded by `seed` and
    the image's name: the same whichever engine, batch or order the image comes in."""
    key = int.from_bytes(hashlib.sha256(f"{seed}\0{name}".encode()).digest()[:8], "little")
    return square_crops(Image.fromarray(rgb), crops, np.random.default_rng(key))


def image_views(handle: ViTHandle, images: Sequence[np.ndarray], names: Sequence[str] = (), mirror: bool = False,
                crops: int = 0, seed: int = 0) -> torch.Tensor:
    """(V, 3, H, W) model inputs of B images: the B images; with `mirror`, then their B mirror images (flipped
    along W); with `crops` N, then N·B crops (`crops_of`, each image's N in turn)."""
    pixels = _pixels(handle, images)
    if mirror:
        pixels = torch.cat([pixels, pixels.flip(-1)])
    if crops:
        names = list(names) or [str(i) for i in range(len(images))]
        views = [np.asarray(view) for rgb, name in zip(images, names) for view in crops_of(rgb, name, crops, seed)]
        pixels = torch.cat([pixels, _pixels(handle, views)])
    return pixels


@dataclass(frozen=True)
class ActivationStats:
    """What the activation pass wrote and the statistics the SAE's input normalisation takes from it."""

    files: tuple[Path, ...]  # the spilled (n, d) float32 token files
    mean: np.ndarray  # (d,) mean token
    scale: float  # sqrt(E‖x - mean‖² / d): dividing by it gives centred tokens of mean squared norm d
    tokens: int  # tokens written
    images: int
    skipped: Skipped


class SAEActivationWorker:
    """Holds the model; writes each batch's tokens of block `layer` to the spill folder."""

    def __init__(self, handle: ViTHandle, layer: int, tokens: str, spill: str, mirror: bool = False, crops: int = 0,
                 seed: int = 0) -> None:
        self.handle, self.layer, self.spill, self.mirror = handle, layer, Path(spill), mirror
        self.crops, self.seed = crops, seed
        self.where = token_slice(handle.layout(), tokens)

    def crops_of(self, rgb: np.ndarray, name: str) -> list[Image.Image]:
        """The `crops` random squares of one image, from a generator seeded by `seed` and the image's name."""
        return crops_of(rgb, name, self.crops, self.seed)

    def map_batch(self, images: Sequence[np.ndarray], names: Sequence[str] = ()) -> Sums:
        """Sums {"sum": (d,) Σx, "squares": (1,) Σ‖x‖², "tokens": (1,) n}; the tokens go to a file named by
        the batch's image names. The views are `image_views`'."""
        captured: list[torch.Tensor] = []
        pixels = image_views(self.handle, images, names, self.mirror, self.crops, self.seed)
        with torch.no_grad(), block_output(self.handle, self.layer, captured.append, stop=True):
            self.handle.forward(pixels.to(self.handle.device))
        rows = captured[0][:, self.where].reshape(-1, captured[0].shape[-1]).float().cpu().numpy()  # (B·n, d)
        digest = hashlib.sha256("\0".join(names or map(str, range(len(images)))).encode()).hexdigest()[:24]
        path = self.spill / f"tokens-{digest}.npy"
        partial = path.with_suffix(".part")
        with open(partial, "wb") as handle:
            np.save(handle, rows, allow_pickle=False)
        os.replace(partial, path)
        x = rows.astype(np.float64)
        return Sums({"sum": x.sum(0), "squares": np.array([(x ** 2).sum()]), "tokens": np.array([len(x)])},
                    len(images))


@dataclass(frozen=True)
class SAEActivationJob:
    """Block `layer`'s output tokens of every image of a folder, spilled to `spill`."""

    model: str  # as `load_model` takes it
    layer: int
    spill: str  # folder the token files are written to (every worker must reach it)
    tokens: str = "all"  # "all" or "patches"
    weights: str | None = None
    device: str | None = None
    model_file: str | None = None
    mirror: bool = False  # also the tokens of each input mirrored left to right
    crops: int = 0  # also the tokens of this many random square crops of each image
    seed: int = 0  # seeds the crops (with each image's name)
    name: str = "sae_activations"

    def open(self) -> SAEActivationWorker:
        handle = load_model(self.model, weights=self.weights, device=self.device, model_file=self.model_file)
        return SAEActivationWorker(handle, self.layer, self.tokens, self.spill, self.mirror, self.crops, self.seed)

    def merge(self, a: Sums, b: Sums) -> Sums:
        return a + b

    def finalize(self, sums: Sums, skipped: Skipped) -> ActivationStats:
        _require_images(sums, skipped)
        n = int(sums.arrays["tokens"][0])
        mean = sums.arrays["sum"] / n
        centred = max(float(sums.arrays["squares"][0]) / n - float((mean ** 2).sum()), 1e-12)  # E‖x - mean‖²
        files = tuple(sorted(Path(self.spill).glob("tokens-*.npy")))
        return ActivationStats(files, mean, float(np.sqrt(centred / len(mean))), n, sums.count, skipped)


@dataclass(frozen=True)
class SAEQuality:
    """How well an SAE reconstructs a block's tokens over a folder, and what replacing them does."""

    variance_explained: float  # 1 - Σ‖x - x̂‖² / Σ‖x - mean(x)‖² over the tokens, in the model's units
    l0: float  # mean number of active features per token
    dead_fraction: float  # features that fired on none of these tokens
    top1_agreement: float  # images whose top-1 class is unchanged with the tokens replaced by x̂
    kl: float  # mean KL(unmodified ‖ replaced) of the class distributions, nats
    tokens: int
    images: int
    skipped: Skipped

    def as_dict(self) -> dict:
        return {"variance_explained": self.variance_explained, "l0": self.l0, "dead_fraction": self.dead_fraction,
                "top1_agreement": self.top1_agreement, "kl": self.kl, "tokens": self.tokens, "images": self.images}


class SAEEvalWorker:
    """Holds the model and the SAE; two forwards per batch (unmodified, and with x̂ in place)."""

    def __init__(self, handle: ViTHandle, sae: SparseAutoencoder) -> None:
        check_fits(sae, handle.name, handle.depth, handle.embed_dim)
        if not handle.has_head:
            raise VitInspectError(f"{handle.name!r} has no classifier head; top-1 agreement and KL need one.")
        self.handle, self.sae = handle, sae.to(handle.device)

    def map_batch(self, images: Sequence[np.ndarray], names: Sequence[str] = ()) -> Sums:
        sae, features = self.sae, self.sae.info.features
        sums = {"error": 0.0, "squares": 0.0, "sum": np.zeros(sae.info.width), "tokens": 0, "l0": 0.0,
                "fired": np.zeros(features)}

        def on_pair(tokens: torch.Tensor, x_hat: torch.Tensor) -> None:
            x = tokens.reshape(-1, tokens.shape[-1]).double()  # (B·n, d)
            z = encode(normalise(x.float(), sae), sae.W_enc, sae.b_enc, sae.b_dec, sae.info.k)  # (B·n, F)
            sums["error"] += float(((x - x_hat.reshape(x.shape).double()) ** 2).sum())
            sums["squares"] += float((x ** 2).sum())
            sums["sum"] = sums["sum"] + x.sum(0).cpu().numpy()
            sums["tokens"] += len(x)
            sums["l0"] += float(l0(z).sum())
            sums["fired"] = sums["fired"] + (z > 0).sum(0).double().cpu().numpy()

        pixels = _pixels(self.handle, images).to(self.handle.device)
        with torch.no_grad():
            reference = self.handle.forward(pixels)
            with replaced_block_output(self.handle, sae, self.handle.layout(), on_pair):
                replaced = self.handle.forward(pixels)
        arrays = {name: np.atleast_1d(np.asarray(value, np.float64)) for name, value in sums.items()}
        arrays["agree"] = np.array([float(top1_agreement(reference, replaced).sum())])
        arrays["kl"] = np.array([float(kl_divergence(reference, replaced).sum())])
        return Sums(arrays, len(images))


@dataclass(frozen=True)
class SAEEvalJob:
    """The quality (`SAEQuality`) of the SAE in file `sae` over a folder of images."""

    model: str
    sae: str  # SAE file, at this path on every worker
    layer: int | None = None  # the block it reads, for formats that do not record it (saev)
    weights: str | None = None
    device: str | None = None
    model_file: str | None = None
    name: str = "sae_eval"

    def open(self) -> SAEEvalWorker:
        handle = load_model(self.model, weights=self.weights, device=self.device, model_file=self.model_file)
        return SAEEvalWorker(handle, load_sae(self.sae, layer=self.layer, model=handle.name))

    def merge(self, a: Sums, b: Sums) -> Sums:
        return a + b

    def finalize(self, sums: Sums, skipped: Skipped) -> SAEQuality:
        _require_images(sums, skipped)
        a = sums.arrays
        n = int(a["tokens"][0])
        ve = variance_explained(float(a["error"][0]), float(a["squares"][0]), torch.from_numpy(a["sum"]), n)
        return SAEQuality(ve, float(a["l0"][0]) / n, dead_fraction(torch.from_numpy(a["fired"])),
                          float(a["agree"][0]) / sums.count, float(a["kl"][0]) / sums.count, n, sums.count, skipped)
