"""Faithfulness over a labelled folder (`vit-inspect evaluate`): labels, the folder job
and its per-image curves."""
from __future__ import annotations

import csv
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from PIL import Image

from vit_inspect.analysis.faithfulness import CURVES, LOWER_IS_BETTER, PerturbationSettings
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import find_images
from vit_inspect.core.load import load_model
from vit_inspect.jobs.engine import Skipped, Sums
from vit_inspect.jobs.workers import ZeroShot, absolute_model_file, model_source, with_job_zero_shot, zero_shot_of
from vit_inspect.studies.faithfulness import (DEFAULT_BATCH_SIZE, FaithfulnessAccumulator, ImageFaithfulness,
                                              evaluate_image)


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
        """`FaithfulnessAccumulator.state()` of the batch, as `Sums`: `evaluate_image` on each image with the
        label its file name has in `job.labels`; with `job.curves_dir`, each image's curves are written there."""
        accumulator = FaithfulnessAccumulator()
        for rgb, name in zip(images, names, strict=True):
            if name not in self.labels:
                raise VitInspectError(f"{name!r} has no label.")
            result = evaluate_image(self.handle, Image.fromarray(rgb), self.labels[name], self.job.methods,
                                    target=self.job.prompt, contrast=self.job.versus,
                                    settings=self.job.settings, batch_size=self.job.batch_size)
            accumulator.add(result)
            for failure in result.failures.values():
                print(f"{name}: {failure.name} left out of the scores: {failure}", file=sys.stderr)
            if self.job.curves_dir is not None:
                write_image_curves(self.job.curves_dir, name, result)
        return Sums(*accumulator.state())


@dataclass(frozen=True)
class FolderFaithfulness:
    """What `EvaluateJob` gives: the merged accumulator and the files that could not be read."""

    accumulator: FaithfulnessAccumulator
    skipped: Skipped


@dataclass(frozen=True)
class EvaluateJob:
    """Faithfulness of `methods` (see `vit_inspect.studies.faithfulness.faithfulness_methods`) over a labelled folder: the
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
    prompt: str | None = None  # OpenCLIP: explain and score this text prompt's similarity instead of a class
    versus: str | None = None  # with `prompt`: the prompt it is compared with
    zero_shot: ZeroShot | None = None  # OpenCLIP: (labels, templates) of the list (`workers.zero_shot_of`)
    name: str = "evaluate"

    @classmethod
    def for_handle(cls, handle: ViTHandle, labels: dict[str, int], methods: tuple[str, ...],
                   device: str | None = None, model_file: str | None = None, curves_dir: str | None = None,
                   **options) -> EvaluateJob:
        """The job for the model `handle` holds, loadable by any worker; `labels` only of the files to run."""
        model, weights = model_source(handle)
        return cls(model, weights, device, absolute_model_file(model_file), tuple(sorted(labels.items())),
                   tuple(methods), curves_dir=None if curves_dir is None else str(Path(curves_dir).resolve()),
                   zero_shot=zero_shot_of(handle), **options)

    def open(self) -> EvaluateWorker:
        handle = load_model(self.model, weights=self.weights, device=self.device, model_file=self.model_file)
        handle = with_job_zero_shot(handle, self.zero_shot)
        return EvaluateWorker(handle, self)

    def merge(self, a: Sums, b: Sums) -> Sums:
        return a + b

    def finalize(self, sums: Sums, skipped: Skipped) -> FolderFaithfulness:
        if sums.count == 0:
            raise VitInspectError("None of the images could be read."
                                  + (f" First problem: {skipped[0][0]}: {skipped[0][1]}" if skipped else ""))
        return FolderFaithfulness(FaithfulnessAccumulator.from_state(sums.arrays, sums.count), skipped)


MAX_LABEL_ROWS = 1_000_000


def read_labels(path: str | Path) -> dict[str, int]:
    """file name -> class index from a CSV with `filename` and `class_index` columns (a header row)."""
    path = Path(path)
    if not path.is_file():
        raise VitInspectError(f"No labels file at {str(path)!r}.")
    labels: dict[str, int] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"filename", "class_index"} <= set(reader.fieldnames):
            raise VitInspectError(f"{path.name!r} needs a header with 'filename' and 'class_index' columns.")
        for row_number, row in enumerate(reader, 2):
            if row_number > MAX_LABEL_ROWS:
                raise VitInspectError(f"{path.name!r} has more than {MAX_LABEL_ROWS:,} rows.")
            try:
                labels[Path(row["filename"]).name] = int(row["class_index"])
            except (TypeError, ValueError):
                raise VitInspectError(f"{path.name!r} line {row_number}: class_index must be an integer.") from None
    return labels


def select_files(folder: str, labels: dict[str, int], every: int = 1, limit: int | None = None) -> list[Path]:
    """The labelled images of `folder`, sorted, every `every`-th, at most `limit`."""
    if every < 1 or (limit is not None and limit < 1):
        raise VitInspectError("--every and --limit must be at least 1.")
    files = [p for p in find_images([folder]) if p.name in labels][::every]
    return files[:limit] if limit else files


def evaluate_folder(handle: ViTHandle, files: list[Path], labels: dict[str, int], methods: tuple[str, ...],
                    settings: PerturbationSettings = PerturbationSettings(), batch_size: int = DEFAULT_BATCH_SIZE,
                    on_image: Callable[[Path, ImageFaithfulness], None] | None = None,
                    progress: Callable[[int, int], None] | None = None) -> FaithfulnessAccumulator:
    """`evaluate_image` over the files, one after another, into one accumulator: the plain in-process loop
    for library use, with a per-image callback. The command runs `jobs.evaluate.EvaluateJob` through
    `jobs.run.run_job` instead (either engine; equal numbers, tested in tests/jobs/test_evaluate_engine.py)."""
    accumulator = FaithfulnessAccumulator()
    for done, path in enumerate(files, 1):
        result = evaluate_image(handle, path, labels[path.name], methods, settings=settings, batch_size=batch_size)
        accumulator.add(result)
        if on_image is not None:
            on_image(path, result)
        if progress is not None:
            progress(done, len(files))
    return accumulator


def format_table(table: dict[str, dict[str, tuple[float, float]]], images: int, correct: int,
                 left_out: dict[str, int] | None = None) -> str:
    """A Markdown table: mean ± s.e. per method and curve, best method (by deletion AUC) first; below it, a
    line per method left out of the scores on some images (`FaithfulnessAccumulator.left_out`)."""
    arrows = {c: "↓" if LOWER_IS_BETTER[c] else "↑" for c in CURVES}
    lines = [f"{images} image{'' if images == 1 else 's'}, clean top-1 {100.0 * correct / max(images, 1):.1f} %",
             "| method | " + " | ".join(f"{c} {arrows[c]}" for c in CURVES) + " |",
             "| --- |" + " --- |" * len(CURVES)]
    def cell(mean: float, error: float, digits: int) -> str:  # one image has no standard error: said, not "nan"
        return f"{mean:.{digits}f} ± {error:.{digits}f}" if np.isfinite(error) else f"{mean:.{digits}f} (s.e. needs 2 images)"

    for name in sorted(table, key=lambda m: table[m]["del"][0]):
        cells = [cell(*table[name][c], 1 if c in ("pos", "neg") else 3) for c in CURVES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, n in (left_out or {}).items():
        lines.append(f"{name}: left out of the scores on {n} of {images} image{'' if images == 1 else 's'} "
                     "(the method failed; the reason is on stderr)")
    return "\n".join(lines)


def gather_curves(folder: Path, files: list[Path], skipped: set[str]) -> tuple[dict[str, np.ndarray], list[dict]]:
    """The per-image files the workers wrote (`jobs.evaluate.write_image_curves`), in file order, as the
    `curves.npz` arrays ("<stem>/<curve>/<method>") and the `per_image.csv` rows."""
    curves: dict[str, np.ndarray] = {}
    rows: list[dict] = []
    missing = []
    for path in files:
        if path.name in skipped:
            continue
        try:
            with np.load(folder / f"{path.name}.npz", allow_pickle=False) as record:
                arrays = {key: record[key] for key in record.files}
        except (OSError, ValueError):
            missing.append(path.name)
            continue
        for key, values in arrays.items():
            if key.split("/")[0] in ("pos", "neg", "del", "ins"):
                curves[f"{path.stem}/{key}"] = values
        for key, values in arrays.items():
            if key.startswith("auc/"):
                rows.append({"image": path.name, "label": int(arrays["label"]), "target": int(arrays["target"]),
                             "method": key[4:], **{c: round(float(v), 6) for c, v in zip(CURVES, values)}})
    if missing:
        print(f"no curves for {len(missing)} image(s) (first: {missing[0]}); on a cluster --out must be a "
              f"folder every worker shares", file=sys.stderr)
    return curves, rows
