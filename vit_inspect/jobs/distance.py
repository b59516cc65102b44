"""Mean attention distance averaged over a folder (ViT paper Fig. 7 right), as a folder
job for any engine."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from PIL import Image

from vit_inspect.analysis import distances_per_image
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import ImageLimits
from vit_inspect.core.load import load_model
from vit_inspect.jobs.engine import Skipped, Sums
from vit_inspect.jobs.workers import absolute_model_file, model_source
from vit_inspect.passes.capture import capture_attention

DATASET_MAP_BYTES = 256 * 2 ** 20  # one layer's float32 maps of one chunk of a dataset batch, at most


@dataclass(frozen=True)
class DatasetDistance:
    """Mean attention distance averaged over a set of images."""

    distances: np.ndarray  # (depth, heads) pixels
    num_images: int  # images that contributed
    skipped: tuple[tuple[str, str], ...]  # (file name, reason) of each file that could not be read


def dataset_attention_distance(handle: ViTHandle, images: Iterable[str | os.PathLike | Image.Image],
                               batch_size: int = 16, input_size: tuple[int, int] | None = None,
                               progress: Callable[[int, int], None] | None = None,
                               limits: ImageLimits = ImageLimits(),
                               max_map_bytes: int = DATASET_MAP_BYTES) -> DatasetDistance:
    """Mean attention distance (see `mean_attention_distance`) averaged over many images, in batches,
    streaming: only running sums are kept, never the maps. Unreadable files are skipped and listed.
    In-process with this handle; `jobs.run.run_job` with a `jobs.distance.AttentionDistanceJob` runs the same
    job on Ray.

    Each layer's maps are reduced to distances as the forward pass produces them and then dropped, and a
    batch is run in chunks of at most ``max_map_bytes // (heads * N^2 * 4)`` images, so one layer's
    float32 maps of one chunk bound the memory (a folder of 518-px images at N = 1374 never holds a
    batch's attention stack; see `jobs.distance.AttentionDistanceWorker`)."""
    from vit_inspect.jobs.engine import EngineOptions
    from vit_inspect.jobs.run import run_job

    job = AttentionDistanceJob(handle.name, input_size=input_size, max_map_bytes=max_map_bytes)
    result, _ = run_job(job, images, "local", EngineOptions(batch_size=batch_size, limits=limits), progress,
                        worker=AttentionDistanceWorker(handle, input_size, max_map_bytes=max_map_bytes))
    return result


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
