"""Folder-level jobs for `engine.run_job`: picklable specs that load their model once per worker.

`AttentionDistanceJob`: the ViT paper's Fig. 7 (right) mean attention distance averaged over a
folder (`vit-inspect model --images`).
`EvaluateJob`: faithfulness (perturbation and deletion/insertion AUCs) of every method over a labelled
folder (`vit-inspect evaluate`), as the running sums of a `FaithfulnessAccumulator`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import os

import numpy as np
import torch
from PIL import Image

from .analysis import distances_per_image
from .capture import capture_attention
from .engine import Skipped, Sums
from .analysis.faithfulness import PerturbationSettings
from .errors import VitInspectError
from .faithfulness import DEFAULT_BATCH_SIZE, FaithfulnessAccumulator, ImageFaithfulness, evaluate_image
from .models import ViTHandle, load_model
from .module_spec import parse_model_file
from .pipeline import DATASET_MAP_BYTES, DatasetDistance


def model_source(handle: ViTHandle) -> tuple[str, str | None]:
    """(model, weights) that load the same model as `handle` in another process: absolute paths,
    because a worker's working directory (and on a cluster, its machine) is not the caller's."""
    model = str(Path(handle.name).resolve()) if Path(handle.name).is_dir() else handle.name
    weights = str(Path(handle.weights).resolve()) if Path(handle.weights).is_file() else None
    return model, weights


def absolute_model_file(model_file: str | None) -> str | None:
    """A `--model-file` reference with its file made absolute, for workers in other folders."""
    if model_file is None:
        return None
    path, function = parse_model_file(model_file)
    return f"{path.resolve()}:{function}"


class AttentionDistanceWorker:
    """Holds a loaded model; maps a batch of images to the sum of their per-head mean attention distances.

    Each layer's maps are reduced to distances as the forward pass produces them and then dropped
    (`capture_attention(keep_attention=False, on_attention=...)`), and a batch runs in chunks of at most
    ``max_map_bytes // (heads * N^2 * 4)`` images: one layer's float32 maps of one chunk bound the memory,
    so a folder of 518-px images (N = 1374) never holds a batch's (B, depth, heads, N, N) attention stack.
    """

    def __init__(self, handle: ViTHandle, input_size: tuple[int, int] | None = None, renormalize: bool = True,
                 max_map_bytes: int = DATASET_MAP_BYTES) -> None:
        self.handle = handle
        self.input_size = input_size
        self.renormalize = renormalize
        self.layout = handle.layout(input_size or handle.input_size)
        one_image = handle.num_heads * self.layout.num_tokens ** 2 * 4  # one layer's float32 maps of one image
        self.chunk = max(1, int(max_map_bytes) // one_image)  # images per forward

    def _distances(self, pixels: torch.Tensor) -> np.ndarray:
        """(B, depth, heads) per-image mean attention distance of one chunk, reduced layer by layer."""
        per_layer: list[np.ndarray | None] = [None] * self.handle.depth  # (B, heads) each

        def reduce(layer: int, probs: torch.Tensor) -> None:
            per_layer[layer] = distances_per_image(probs.detach().float().cpu().numpy()[:, None], self.layout,
                                                   self.renormalize)[:, 0]

        with torch.no_grad(), capture_attention(self.handle, keep_attention=False, on_attention=reduce):
            self.handle.forward(pixels.to(self.handle.device))
        missing = [i for i, d in enumerate(per_layer) if d is None]
        if missing:
            raise VitInspectError(f"No attention map was recorded for layer(s) {missing} of {self.handle.name!r}.")
        return np.stack(per_layer, axis=1)  # type: ignore[arg-type]

    def map_batch(self, images: Sequence[np.ndarray], names: Sequence[str] = ()) -> Sums:
        """Sums {"distance": (depth, heads) pixels summed over the batch}, count = len(images)."""
        pixels = torch.cat([self.handle.preprocess.apply(Image.fromarray(rgb), self.input_size)[0]
                            for rgb in images])  # (B, 3, H, W)
        total = np.zeros((self.handle.depth, self.handle.num_heads))
        for start in range(0, len(pixels), self.chunk):
            total += self._distances(pixels[start:start + self.chunk]).sum(axis=0, dtype=np.float64)
        return Sums({"distance": total}, len(pixels))


@dataclass(frozen=True)
class AttentionDistanceJob:
    """Mean attention distance (see `mean_attention_distance`) averaged over a folder of images."""

    model: str  # timm name, HF id or folder, as `load_model` takes it
    weights: str | None = None  # weights file; must exist at this path on every worker
    device: str | None = None  # None: CUDA when the worker has a GPU, else CPU
    input_size: tuple[int, int] | None = None  # (H, W); None: the model's own
    renormalize: bool = True  # renormalise each query's attention over patch keys (see `distances_per_image`)
    name: str = "attention_distance"

    model_file: str | None = None  # "path.py:function" of a hand-written ViT (operator only; see `load_model_file`)
    # bytes of one layer's float32 maps per forward (chunking only: the numbers do not depend on it)
    max_map_bytes: int = field(default=DATASET_MAP_BYTES, repr=False)

    @classmethod
    def for_handle(cls, handle: ViTHandle, device: str | None = None, model_file: str | None = None,
                   **options) -> AttentionDistanceJob:
        """The job for the model `handle` holds (built from `model_file` when given), loadable by any worker."""
        model, weights = model_source(handle)
        return cls(model, weights, device, model_file=absolute_model_file(model_file), **options)

    def open(self) -> AttentionDistanceWorker:
        handle = load_model(self.model, weights=self.weights, device=self.device, model_file=self.model_file)
        return AttentionDistanceWorker(handle, self.input_size, self.renormalize, self.max_map_bytes)

    def merge(self, a: Sums, b: Sums) -> Sums:
        return a + b

    def finalize(self, sums: Sums, skipped: Skipped) -> DatasetDistance:
        if sums.count == 0:
            raise VitInspectError("None of the images could be read."
                                  + (f" First problem: {skipped[0][0]}: {skipped[0][1]}" if skipped else ""))
        return DatasetDistance(distances=sums.arrays["distance"] / sums.count, num_images=sums.count, skipped=skipped)


def write_image_curves(folder: str | os.PathLike, name: str, result: ImageFaithfulness) -> None:
    """`folder/<file name>.npz`: one image's curves ("pos/M", "neg/M", "del/M", "ins/M", float32), its
    AUCs ("auc/M", (4,) in CURVES order, float64), "label" and "target". Written atomically, so a
    killed worker leaves no half file; a retried image overwrites its own."""
    arrays = {"label": np.int64(result.label), "target": np.int64(result.target)}
    for method, c in result.curves.items():
        for field, values in (("pos", c.pos), ("neg", c.neg), ("del", c.deletion), ("ins", c.insertion)):
            arrays[f"{field}/{method}"] = np.asarray(values, np.float32)
        arrays[f"auc/{method}"] = np.array(list(c.aucs().values()), np.float64)
    path = Path(folder) / f"{name}.npz"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        np.savez_compressed(handle, **arrays)
    os.replace(tmp, path)


class EvaluateWorker:
    """Holds a loaded model; maps a batch of labelled images to the faithfulness accumulator's sums."""

    def __init__(self, handle: ViTHandle, job: EvaluateJob) -> None:
        self.handle = handle
        self.job = job
        self.labels = dict(job.labels)
        if job.curves_dir is not None:
            Path(job.curves_dir).mkdir(parents=True, exist_ok=True)

    def map_batch(self, images: Sequence[np.ndarray], names: Sequence[str] = ()) -> Sums:
        """`FaithfulnessAccumulator.to_sums()` of the batch: `evaluate_image` on each image with the
        label its file name has in `job.labels`; with `job.curves_dir`, each image's curves are written there."""
        accumulator = FaithfulnessAccumulator()
        for rgb, name in zip(images, names, strict=True):
            if name not in self.labels:
                raise VitInspectError(f"{name!r} has no label.")
            result = evaluate_image(self.handle, Image.fromarray(rgb), self.labels[name], self.job.methods,
                                    settings=self.job.settings, batch_size=self.job.batch_size)
            accumulator.add(result)
            if self.job.curves_dir is not None:
                write_image_curves(self.job.curves_dir, name, result)
        return accumulator.to_sums()


@dataclass(frozen=True)
class FolderFaithfulness:
    """What `EvaluateJob` gives: the merged accumulator and the files that could not be read."""

    accumulator: FaithfulnessAccumulator
    skipped: Skipped


@dataclass(frozen=True)
class EvaluateJob:
    """Faithfulness of `methods` (see `vit_inspect.faithfulness.METHODS`) over a labelled folder: the
    per-image protocol of `evaluate_image` (pos/neg perturbation AUC in %, deletion/insertion AUC of the
    predicted class's probability), summed per method and curve; `finalize` gives mean ± s.e."""

    model: str  # timm name, HF id or folder, as `load_model` takes it
    weights: str | None  # weights file; must exist at this path on every worker
    device: str | None  # None: CUDA when the worker has a GPU, else CPU
    model_file: str | None  # "path.py:function" of a hand-written ViT (operator only)
    labels: tuple[tuple[str, int], ...]  # (file name, class index) of the files to evaluate
    methods: tuple[str, ...]
    settings: PerturbationSettings = PerturbationSettings()
    batch_size: int = DEFAULT_BATCH_SIZE  # perturbed inputs per forward (one image at a time)
    curves_dir: str | None = None  # folder for each image's curves (`write_image_curves`); shared on a cluster
    name: str = "evaluate"

    @classmethod
    def for_handle(cls, handle: ViTHandle, labels: dict[str, int], methods: tuple[str, ...],
                   device: str | None = None, model_file: str | None = None, curves_dir: str | None = None,
                   **options) -> EvaluateJob:
        """The job for the model `handle` holds, loadable by any worker; `labels` only of the files to run."""
        model, weights = model_source(handle)
        return cls(model, weights, device, absolute_model_file(model_file), tuple(sorted(labels.items())),
                   tuple(methods), curves_dir=None if curves_dir is None else str(Path(curves_dir).resolve()),
                   **options)

    def open(self) -> EvaluateWorker:
        handle = load_model(self.model, weights=self.weights, device=self.device, model_file=self.model_file)
        return EvaluateWorker(handle, self)

    def merge(self, a: Sums, b: Sums) -> Sums:
        return a + b

    def finalize(self, sums: Sums, skipped: Skipped) -> FolderFaithfulness:
        if sums.count == 0:
            raise VitInspectError("None of the images could be read."
                                  + (f" First problem: {skipped[0][0]}: {skipped[0][1]}" if skipped else ""))
        return FolderFaithfulness(FaithfulnessAccumulator.from_sums(sums), skipped)
