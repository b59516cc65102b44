"""An SAE's feature index over a folder (`core.sae_index`): a folder job for any engine, then the crops.

`SAEIndexJob`: one full forward per image; the SAE encodes the patch tokens of its block's output
(`passes.sae.patch_codes`). Per batch, each feature's `top` largest codes with their keys (image number ·
P + patch number, P patches per image) are kept, and merged across batches and shards by value (ties: the
smaller key first, so the result does not depend on the order of merging). Summed beside them: how many
patch tokens each feature fired on, and, for the labels, its activation summed over each image's patches
added to that image's top-1 predicted class, a (F, C) table.
`build_index` runs it, then reads only the images the tops point to again and cuts a crop of the
preprocessed image around each top patch.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import load_image
from vit_inspect.core.load import load_model
from vit_inspect.core.sae_file import SparseAutoencoder, check_fits
from vit_inspect.core.sae_index import SAEIndex, check_sizes, sae_record
from vit_inspect.core.sae_load import load_sae
from vit_inspect.jobs.engine import EngineOptions, Progress, Skipped, Sums, item_name
from vit_inspect.jobs.run import run_job
from vit_inspect.jobs.sae import _pixels, _require_images
from vit_inspect.jobs.workers import absolute_model_file, model_source
from vit_inspect.passes.sae import patch_codes

DEFAULT_TOP = 8  # patches per feature
DEFAULT_CROP = 32  # crop side in pixels of the preprocessed image
DEFAULT_LABELS = 3  # classes per label


def merge_top(values: np.ndarray, keys: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's `top` largest (F, M) `values` with their `keys`, descending, ties broken by the smaller key;
    rows of fewer than `top` are padded with value -1 and key -1 (an empty slot)."""
    order = np.lexsort((keys, -values), axis=-1)[:, :top]  # (F, ≤ top)
    values, keys = np.take_along_axis(values, order, -1), np.take_along_axis(keys, order, -1)
    pad = top - values.shape[1]
    if pad > 0:
        values = np.pad(values, ((0, 0), (0, pad)), constant_values=-1.0)
        keys = np.pad(keys, ((0, 0), (0, pad)), constant_values=-1.0)
    return values, keys


def patch_crop(rgb: np.ndarray, row: int, col: int, patch: tuple[int, int], side: int) -> np.ndarray:
    """(side, side, 3) uint8 of (H, W, 3) `rgb` centred on patch (row, col) of (ph, pw) pixels: the window
    starts at the patch centre minus side // 2; pixels outside the image are 0."""
    top = row * patch[0] + patch[0] // 2 - side // 2
    left = col * patch[1] + patch[1] // 2 - side // 2
    out = np.zeros((side, side, 3), np.uint8)
    y0, x0 = max(top, 0), max(left, 0)
    y1, x1 = min(top + side, rgb.shape[0]), min(left + side, rgb.shape[1])
    if y1 > y0 and x1 > x0:
        out[y0 - top:y1 - top, x0 - left:x1 - left] = rgb[y0:y1, x0:x1]
    return out


@dataclass(frozen=True)
class FeatureTops:
    """What the index job found, before the crops (keys as `SAEIndexJob` defines them)."""

    values: np.ndarray  # (F, top) float64 codes, descending; -1 in an empty slot
    keys: np.ndarray  # (F, top) int64 image number · P + patch number; -1 in an empty slot
    fired: np.ndarray  # (F,) patch tokens each feature fired on
    class_weight: np.ndarray  # (F, C) summed activation by top-1 predicted class; (F, 0) without a head
    patches: int  # patch tokens seen
    images: int
    skipped: Skipped


class SAEIndexWorker:
    """Holds the model and the SAE; one forward per batch."""

    def __init__(self, handle: ViTHandle, sae: SparseAutoencoder, names: Sequence[str], top: int) -> None:
        check_fits(sae, handle.name, handle.depth, handle.embed_dim)
        self.handle, self.sae, self.top = handle, sae.to(handle.device), top
        self.number = {name: i for i, name in enumerate(names)}

    def map_batch(self, images: Sequence[np.ndarray], names: Sequence[str] = ()) -> Sums:
        codes, logits = patch_codes(self.handle, self.sae, _pixels(self.handle, images), logits=self.handle.has_head)
        batch, patches, features = codes.shape  # (B, P, F)
        flat = codes.reshape(batch * patches, features).T.double().cpu()  # (F, B·P)
        values, where = torch.topk(flat, min(self.top, batch * patches), dim=1)  # (F, ≤ top)
        numbers = torch.tensor([self.number[n] for n in names], dtype=torch.float64)  # (B,)
        keys = numbers[where // patches] * patches + where % patches
        live = values > 0
        values, keys = merge_top(np.where(live, values.numpy(), -1.0), np.where(live, keys.numpy(), -1.0), self.top)
        arrays = {"top_values": values, "top_keys": keys, "fired": (codes > 0).sum((0, 1)).double().cpu().numpy(),
                  "patches": np.array([float(batch * patches)])}
        if logits is not None:
            onehot = torch.nn.functional.one_hot(logits.argmax(-1).cpu(), logits.shape[-1]).double()  # (B, C)
            arrays["class_weight"] = (codes.sum(1).double().cpu().T @ onehot).numpy()  # (F, C)
        return Sums(arrays, batch)


@dataclass(frozen=True)
class SAEIndexJob:
    """The feature tops (`FeatureTops`) of the SAE in file `sae` over a folder's images."""

    model: str
    sae: str  # SAE file, at this path on every worker
    names: tuple[str, ...]  # the folder's file names in order; an image's number is its place here
    top: int = DEFAULT_TOP
    layer: int | None = None  # the block it reads, for formats that do not record it (saev)
    weights: str | None = None
    device: str | None = None
    model_file: str | None = None
    name: str = "sae_index"

    def open(self) -> SAEIndexWorker:
        handle = load_model(self.model, weights=self.weights, device=self.device, model_file=self.model_file)
        return SAEIndexWorker(handle, load_sae(self.sae, layer=self.layer, model=handle.name), self.names, self.top)

    def merge(self, a: Sums, b: Sums) -> Sums:
        if not a.arrays or not b.arrays:
            return a if a.arrays else b
        tops = ("top_values", "top_keys")
        summed = Sums({k: v for k, v in a.arrays.items() if k not in tops}, a.count) + \
            Sums({k: v for k, v in b.arrays.items() if k not in tops}, b.count)
        values, keys = merge_top(np.concatenate([a.arrays["top_values"], b.arrays["top_values"]], 1),
                                 np.concatenate([a.arrays["top_keys"], b.arrays["top_keys"]], 1), self.top)
        return Sums({**summed.arrays, "top_values": values, "top_keys": keys}, summed.count)

    def finalize(self, sums: Sums, skipped: Skipped) -> FeatureTops:
        _require_images(sums, skipped)
        a = sums.arrays
        features = a["top_values"].shape[0]
        return FeatureTops(a["top_values"], a["top_keys"].astype(np.int64), a["fired"],
                           a.get("class_weight", np.zeros((features, 0))), int(a["patches"][0]), sums.count, skipped)


def feature_labels(class_weight: np.ndarray, labels: int) -> tuple[np.ndarray, np.ndarray]:
    """((F, L) classes, (F, L) shares): each feature's `labels` classes of largest summed activation and their
    share of its total (0 to 1), largest first; class -1 and share 0 where it has fewer."""
    features, classes = class_weight.shape
    label_class = np.full((features, labels), -1, np.int32)
    label_share = np.zeros((features, labels), np.float32)
    if classes == 0 or labels == 0:
        return label_class, label_share
    total = class_weight.sum(1, keepdims=True)
    share = np.divide(class_weight, total, out=np.zeros_like(class_weight), where=total > 0)
    order = np.lexsort((np.broadcast_to(np.arange(classes), share.shape), -share), axis=-1)[:, :labels]
    picked = np.take_along_axis(share, order, -1)
    keep = picked > 0
    width = order.shape[1]
    label_class[:, :width] = np.where(keep, order, -1)
    label_share[:, :width] = np.where(keep, picked, 0)
    return label_class, label_share


def build_index(handle: ViTHandle, sae: SparseAutoencoder, sae_path: str | Path, files: Sequence[Path],
                top: int = DEFAULT_TOP, crop: int = DEFAULT_CROP, labels: int = DEFAULT_LABELS,
                engine: str = "local", engine_options: EngineOptions = EngineOptions(), layer: int | None = None,
                model_file: str | None = None, progress: Progress | None = None) -> SAEIndex:
    """The feature index of `sae` (loaded from `sae_path`, which other engines' workers read) over `files`: the
    job above, then one read of each image the tops point to for the crops. Sizes are checked first
    (`core.sae_index.check_sizes`)."""
    check_sizes(sae.info.features, top, crop, labels)
    names = tuple(item_name(f) for f in files)
    if len(set(names)) != len(names):
        raise VitInspectError("Two of the images have the same file name; an index names images by file name.")
    model, weights = model_source(handle)
    job = SAEIndexJob(model, str(Path(sae_path).resolve()), names, top, layer, weights,
                      model_file=absolute_model_file(model_file))
    tops, _ = run_job(job, files, engine, engine_options, progress,
                      worker=SAEIndexWorker(handle, sae, names, top))
    layout = handle.layout()
    patches = layout.num_patches
    filled = tops.keys >= 0
    used = sorted({int(k) // patches for k in tops.keys[filled]})
    renumber = {number: i for i, number in enumerate(used)}
    image = np.full(tops.keys.shape, -1, np.int32)
    patch = np.full((*tops.keys.shape, 2), -1, np.int32)
    crops = np.zeros((*tops.keys.shape, crop, crop, 3), np.uint8)
    for number in used:  # one read per image the tops point to
        rgb = handle.preprocess.apply(load_image(files[number], engine_options.limits))[1]  # (H, W, 3)
        for f, n in zip(*np.nonzero(filled & (tops.keys // patches == number))):
            row, col = divmod(int(tops.keys[f, n]) % patches, layout.grid_w)
            image[f, n], patch[f, n] = renumber[number], (row, col)
            crops[f, n] = patch_crop(rgb, row, col, (layout.patch_h, layout.patch_w), crop)
    label_class, label_share = feature_labels(tops.class_weight, labels)
    classes = {int(c): handle.label(int(c)) for c in np.unique(label_class[label_class >= 0])}
    return SAEIndex(sae_record(sae), tuple(names[n] for n in used), classes, (layout.grid_h, layout.grid_w),
                    (layout.patch_h, layout.patch_w), {"images": tops.images, "patches": tops.patches},
                    np.where(filled, tops.values, 0).astype(np.float32), image, patch, crops, label_class,
                    label_share, (tops.fired / max(tops.patches, 1)).astype(np.float32))
