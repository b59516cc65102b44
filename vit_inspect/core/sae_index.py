"""A feature index of an SAE, as one safetensors file beside it: for each feature, its top-activating patches
over a folder with a small crop of each, and a short label of the classes where it fires.

Tensors (F features, N = `top` patches per feature, S = `crop` pixels, L = `labels` classes per feature):

    activation  F32 (F, N)           the feature's code z at each top patch, descending; 0 in an empty slot
    image       I32 (F, N)           index into the metadata's `images` (file names); -1 in an empty slot
    patch       I32 (F, N, 2)        (row, col) of the patch on the model's grid; -1 in an empty slot
    crops       U8  (F, N, S, S, 3)  the preprocessed image (the crop the model saw) centred on the patch,
                                     zero outside the image; zero in an empty slot
    label_class I32 (F, L)           the classes with most of the feature's activation; -1 in an empty slot
    label_share F32 (F, L)           each one's share of that activation, 0 to 1
    fired       F32 (F,)             the fraction of the folder's patch tokens the feature fired on

Size in bytes: F·N·(3·S² + 16) + F·(8·L + 4) plus the header (`index_bytes`); 1536 features, 8 patches of
32 px and 3 labels make 38.0 MB. Files declaring more than `MAX_INDEX_BYTES` are refused before any tensor is
read, and so are builds that would write one.

The header's `__metadata__` holds one JSON string under "vit_inspect.sae_index": the SAE it indexes (model,
layer, F, d, k, tokens and `digest`, a hash of its tensors), `top`, `crop`, `labels`, `label_source`, the grid,
the patch size, the file names of the images it refers to (names only, never folders), the names of the classes its labels
use, and the number of images and patch tokens it was built from. Files are untrusted: every name, dtype and
shape is checked against the metadata before a tensor is read, and every index inside after.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vit_inspect.core.errors import WeightsError
from vit_inspect.core.sae_file import SparseAutoencoder
from vit_inspect.core.weights import MAX_SAFETENSORS_HEADER, check_safetensors_header

INDEX_KEY = "vit_inspect.sae_index"
INDEX_SUFFIX = ".index.safetensors"
MAX_INDEX_BYTES = 2 ** 27  # tensor bytes an index may hold (128 MiB)
MAX_TOP = 64  # patches per feature
MAX_CROP = 96  # crop side in pixels
MAX_LABELS = 16  # classes per feature's label
MAX_NAME = 200  # characters of an image or class name kept
LABEL_SOURCE = "top1"  # labels weigh each image's top-1 predicted class by the feature's activation on it


@dataclass(frozen=True)
class FeatureEntry:
    """One feature of an index: what `SAEIndex.feature` returns."""

    feature: int
    label: str  # "tabby 41% · tiger cat 20%", or "" without classes (a model without a head, a dead feature)
    fired: float  # fraction of the folder's patch tokens it fired on
    activations: np.ndarray  # (n,) float32, descending; n ≤ top (empty slots dropped)
    images: tuple[str, ...]  # (n,) file names
    patches: np.ndarray  # (n, 2) int (row, col)
    crops: np.ndarray  # (n, S, S, 3) uint8


@dataclass(frozen=True, eq=False)
class SAEIndex:
    """A feature index in memory (module docstring): the tensors as numpy arrays and the metadata."""

    sae: dict  # the SAE it indexes: model, layer, F, d, k, tokens, digest
    images: tuple[str, ...]  # file names the `image` tensor points into
    classes: dict[int, str]  # class index -> name, for the classes the labels use
    grid: tuple[int, int]  # (grid_h, grid_w) of the model's input
    patch_size: tuple[int, int]  # (ph, pw) pixels of a patch, so a crop's patch can be outlined
    built_from: dict  # {"images": n, "patches": n} the folder contributed
    activation: np.ndarray  # (F, N) float32
    image: np.ndarray  # (F, N) int32
    patch: np.ndarray  # (F, N, 2) int32
    crops: np.ndarray  # (F, N, S, S, 3) uint8; memory-mapped from the file when read (one feature's read on use)
    label_class: np.ndarray  # (F, L) int32
    label_share: np.ndarray  # (F, L) float32
    fired: np.ndarray  # (F,) float32

    @property
    def features(self) -> int:
        return self.activation.shape[0]

    @property
    def top(self) -> int:
        return self.activation.shape[1]

    def label(self, feature: int) -> str:
        """The classes where `feature` fires most with their shares, "tabby 41% · tiger cat 20%" (each class's first
        name); "" when none."""
        parts = [f"{self.classes.get(int(c), str(int(c))).split(',')[0]} {s:.0%}"
                 for c, s in zip(self.label_class[feature], self.label_share[feature]) if c >= 0 and s > 0]
        return " · ".join(parts)

    def feature(self, feature: int) -> FeatureEntry:
        """Feature `feature`'s entry (its filled slots only); IndexError with a sentence out of range."""
        if not 0 <= int(feature) < self.features:
            raise IndexError(f"feature {feature} does not exist: this index has features 0 to {self.features - 1}")
        f = int(feature)
        filled = self.image[f] >= 0
        return FeatureEntry(f, self.label(f), float(self.fired[f]), self.activation[f][filled],
                            tuple(self.images[i] for i in self.image[f][filled]), self.patch[f][filled],
                            np.array(self.crops[f][filled]))


def index_path(sae_path: str | os.PathLike) -> Path:
    """The index file beside an SAE file: ``<stem>.index.safetensors``."""
    path = Path(sae_path)
    return path.with_name(path.stem + INDEX_SUFFIX)


def sae_digest(sae: SparseAutoencoder) -> str:
    """A hash of an SAE's encoder and decoder as float32 (24 hex digits): an index names the SAE it was built for."""
    digest = hashlib.sha256()
    for t in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec):
        digest.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:24]


def sae_record(sae: SparseAutoencoder) -> dict:
    """What an index records of its SAE, to recognise it (`check_index_fits`)."""
    info = sae.info
    return {"model": info.model, "layer": info.layer, "F": info.features, "d": info.width, "k": info.k,
            "tokens": info.tokens, "digest": sae_digest(sae)}


def index_bytes(features: int, top: int, crop: int, labels: int) -> int:
    """Tensor bytes of an index: F·N·(3·S² + 16) + F·(8·L + 4) (per top patch its crop, activation, image and
    patch; per feature its labels, their shares and how often it fired)."""
    return features * top * (3 * crop * crop + 16) + features * (8 * labels + 4)


def check_sizes(features: int, top: int, crop: int, labels: int) -> None:
    """WeightsError with a sentence when an index of these sizes is out of range or over `MAX_INDEX_BYTES`."""
    if not (1 <= top <= MAX_TOP and 1 <= crop <= MAX_CROP and 0 <= labels <= MAX_LABELS and features >= 1):
        raise WeightsError(f"An index keeps 1 to {MAX_TOP} patches per feature, crops of 1 to {MAX_CROP} px and 0 to "
                           f"{MAX_LABELS} label classes; got {top}, {crop} and {labels}.")
    size = index_bytes(features, top, crop, labels)
    if size > MAX_INDEX_BYTES:
        raise WeightsError(f"An index of {features:,} features × {top} patches of {crop} px would hold {size:,} "
                           f"bytes, more than {MAX_INDEX_BYTES:,}; use fewer patches (--top) or smaller crops (--crop).")


def _shapes(features: int, top: int, crop: int, labels: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    f, n, s, l_ = features, top, crop, labels
    return {"activation": ("F32", (f, n)), "image": ("I32", (f, n)), "patch": ("I32", (f, n, 2)),
            "crops": ("U8", (f, n, s, s, 3)), "label_class": ("I32", (f, l_)), "label_share": ("F32", (f, l_)),
            "fired": ("F32", (f,))}


def save_index(index: SAEIndex, path: str | os.PathLike) -> None:
    """Write `index` as one safetensors file (module docstring); WeightsError when it is over the bounds."""
    from safetensors.numpy import save_file

    features, top = index.activation.shape
    check_sizes(features, top, index.crops.shape[2], index.label_class.shape[1])
    meta = {"sae": index.sae, "top": top, "crop": int(index.crops.shape[2]), "labels": int(index.label_class.shape[1]),
            "label_source": LABEL_SOURCE, "grid": list(index.grid),
            "patch_size": list(index.patch_size), "images": [n[:MAX_NAME] for n in index.images],
            "classes": {str(k): v[:MAX_NAME] for k, v in sorted(index.classes.items())},
            "built_from": index.built_from}
    text = json.dumps(meta)
    if len(text) > MAX_SAFETENSORS_HEADER - 4096:
        raise WeightsError(f"The index would name {len(index.images):,} images in a {len(text):,}-byte header, more than "
                           f"a safetensors header may hold here; use fewer patches per feature.")
    arrays = {"activation": index.activation.astype(np.float32), "image": index.image.astype(np.int32),
              "patch": index.patch.astype(np.int32), "crops": index.crops.astype(np.uint8),
              "label_class": index.label_class.astype(np.int32), "label_share": index.label_share.astype(np.float32),
              "fired": index.fired.astype(np.float32)}
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path), metadata={INDEX_KEY: text})


def _header_length(path: Path) -> int:
    with open(path, "rb") as handle:
        return int.from_bytes(handle.read(8), "little")


def _metadata(path: Path) -> tuple[dict[str, Any], dict]:
    check_safetensors_header(path)
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    meta = header.get("__metadata__")
    raw = meta.get(INDEX_KEY) if isinstance(meta, dict) else None
    if not isinstance(raw, str):
        raise WeightsError(f"{path.name!r} is a safetensors file but not an SAE feature index (its header has no "
                           f"{INDEX_KEY!r} metadata).", public="This file is not an SAE feature index.")
    try:
        parsed = json.loads(raw)
        if not isinstance(parsed, dict):
            raise TypeError
    except (ValueError, TypeError):
        raise WeightsError(f"{path.name!r} has damaged index metadata.",
                           public="The feature index's metadata is damaged.") from None
    return {k: v for k, v in header.items() if k != "__metadata__"}, parsed


def _damaged(path: Path, what: str) -> WeightsError:
    return WeightsError(f"{path.name!r} is not a valid SAE feature index: {what}.",
                        public="The feature index is damaged or not an index.")


def read_index(path: str | os.PathLike, sae: SparseAutoencoder | None = None) -> SAEIndex:
    """An index from its file. The header is checked first (metadata, then each tensor's name, dtype and shape
    against it, and the total bytes against `MAX_INDEX_BYTES`), then the tensors are read and every image,
    patch and class index in them checked. With `sae`, an index of another SAE is refused (`check_index_fits`)."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"No feature index at {str(path)!r}.", public=f"The index {path.name!r} is not available.")
    entries, meta = _metadata(path)
    try:
        top, crop, labels = int(meta["top"]), int(meta["crop"]), int(meta["labels"])
        record = dict(meta["sae"])
        features, _ = int(record["F"]), int(record["layer"])
        grid = tuple(int(g) for g in meta["grid"])
        patch_size = tuple(int(g) for g in meta["patch_size"])
        images = tuple(str(n)[:MAX_NAME] for n in meta["images"])
        classes = {int(k): str(v)[:MAX_NAME] for k, v in dict(meta.get("classes") or {}).items()}
        built_from = {str(k): int(v) for k, v in dict(meta.get("built_from") or {}).items()}
    except (KeyError, TypeError, ValueError):
        raise _damaged(path, "its metadata lacks top, crop, labels, sae.F, sae.layer, grid, patch_size or images") from None
    if len(grid) != 2 or len(patch_size) != 2 or min(*grid, *patch_size) < 1:
        raise _damaged(path, f"grid {grid} or patch size {patch_size} is not two positive sizes")
    check_sizes(features, top, crop, labels)
    shapes = _shapes(features, top, crop, labels)
    if set(entries) != set(shapes):
        raise _damaged(path, f"it holds tensors {sorted(entries)}, not {sorted(shapes)}")
    for name, (dtype, shape) in shapes.items():
        entry = entries[name]
        if not isinstance(entry, dict) or entry.get("dtype") != dtype or tuple(entry.get("shape", ())) != shape:
            raise _damaged(path, f"{name} should be {dtype} {shape}")
    from safetensors import safe_open

    try:  # safe_open checks that the offsets tile the file's body; the crops stay on disk, memory-mapped
        with safe_open(str(path), framework="np") as handle:
            arrays = {name: handle.get_tensor(name) for name in shapes if name != "crops"}
        start, end = entries["crops"]["data_offsets"]
        if end - start != int(np.prod(shapes["crops"][1])):
            raise ValueError("the crops' offsets do not match their shape")
        arrays["crops"] = np.memmap(path, np.uint8, "r", 8 + _header_length(path) + start, shapes["crops"][1])
    except Exception as exc:  # safetensors raises several types for a damaged body
        raise _damaged(path, f"its body could not be read ({exc})") from None
    image, patch, label_class = arrays["image"], arrays["patch"], arrays["label_class"]
    if image.min(initial=-1) < -1 or image.max(initial=-1) >= len(images):
        raise _damaged(path, "an image index points outside its list of images")
    filled = image >= 0
    rows, cols = patch[..., 0][filled], patch[..., 1][filled]
    if rows.size and (rows.min() < 0 or cols.min() < 0 or rows.max() >= grid[0] or cols.max() >= grid[1]):
        raise _damaged(path, "a patch lies outside the grid")
    if any(int(c) not in classes for c in np.unique(label_class[label_class >= 0])):
        raise _damaged(path, "a label names a class it has no name for")
    if not all(np.isfinite(arrays[name]).all() for name in ("activation", "label_share", "fired")):
        raise _damaged(path, "it holds NaN or infinite values")
    index = SAEIndex(record, images, classes, (grid[0], grid[1]), (patch_size[0], patch_size[1]), built_from,
                     **arrays)
    if sae is not None:
        check_index_fits(index, sae, path.name)
    return index


def check_index_fits(index: SAEIndex, sae: SparseAutoencoder, source: str = "this index") -> None:
    """WeightsError with a sentence when `index` was built for another SAE (features, model, block or weights)."""
    own, theirs = index.sae, sae_record(sae)
    if int(own.get("F", -1)) != theirs["F"] or int(own.get("layer", -1)) != theirs["layer"]:
        raise WeightsError(f"{source} indexes an SAE of {own.get('F')} features on block {own.get('layer')}, but this "
                           f"SAE has {theirs['F']} features on block {theirs['layer']}; it belongs to another SAE.",
                           public="The feature index belongs to another SAE.")
    if Path(str(own.get("model", ""))).name != Path(theirs["model"]).name:
        raise WeightsError(f"{source} indexes an SAE of {own.get('model')!r}, not of {theirs['model']!r}.",
                           public="The feature index belongs to an SAE of another model.")
    if own.get("digest") != theirs["digest"]:
        raise WeightsError(f"{source} was built for another SAE of the same size (its weights differ); rebuild it "
                           "with `vit-inspect sae index`.", public="The feature index belongs to another SAE.")
