"""Sanity checks over a folder (`vit-inspect evaluate FOLDER --sanity`): the folder job, its table and files.

Each image goes through `studies.sanity.sanity_check` (a pure per-image function of the model and the image:
the weights, the random class, the noise and the removals are all seeded) and into a `SanityAccumulator`
(mergeable sums), so the local and the Ray engine give the same numbers.
"""
from __future__ import annotations

import csv
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.load import load_model
from vit_inspect.jobs.engine import Skipped, Sums
from vit_inspect.jobs.workers import ZeroShot, absolute_model_file, model_source, with_job_zero_shot, zero_shot_of
from vit_inspect.studies.sanity import (PASS_THRESHOLD, SIMILARITIES, SanityAccumulator, SanitySettings, sanity_check,
                                        steps_of)


class SanityWorker:
    """Holds a loaded model; maps a batch of images to the sanity accumulator's sums."""

    def __init__(self, handle: ViTHandle, job: SanityJob) -> None:
        self.handle = handle
        self.job = job

    def map_batch(self, images: Sequence[np.ndarray], names: Sequence[str] = ()) -> Sums:
        """`SanityAccumulator.state()` of the batch, as `Sums`: `sanity_check` of each image for its
        predicted class, or for the job's prompt."""
        accumulator = SanityAccumulator()
        for rgb, name in zip(images, names or [""] * len(images), strict=True):
            result = sanity_check(self.handle, Image.fromarray(rgb), self.job.methods, target=self.job.prompt,
                                  settings=self.job.settings)
            accumulator.add(result)
            for failure in result.failures.values():
                print(f"{name}: {failure.name} left out of the checks: {failure}", file=sys.stderr)
        return Sums(*accumulator.state())


@dataclass(frozen=True)
class FolderSanity:
    """What `SanityJob` gives: the merged accumulator, the files that could not be read, the model's depth."""

    accumulator: SanityAccumulator
    skipped: Skipped
    depth: int  # blocks of the model (the cascading steps are None, depth - 1 .. 0, "embedding")


@dataclass(frozen=True)
class SanityJob:
    """Sanity checks of `methods` (see `studies.sanity.sanity_methods`) over a folder, each image for the
    class its trained model predicts, or for one text prompt of a CLIP-style model (``prompt``, with the model's
    zero-shot list, from which each image's random logit is drawn); `finalize` gives mean ± s.e. per method,
    test and step."""

    model: str  # timm name, HF id or folder, as `load_model` takes it
    weights: str | None  # weights file; must exist at this path on every worker
    device: str | None  # None: CUDA when the worker has a GPU, else CPU
    model_file: str | None  # "path.py:function" of a hand-written ViT (operator only)
    methods: tuple[str, ...]
    depth: int  # blocks of the model, for the table's steps
    settings: SanitySettings = SanitySettings(robustness=None)
    name: str = "sanity"
    prompt: str | None = None  # OpenCLIP: explain this text prompt's similarity instead of a class
    zero_shot: ZeroShot | None = None  # OpenCLIP: (labels, templates) of the list (`workers.zero_shot_of`)

    @classmethod
    def for_handle(cls, handle: ViTHandle, methods: tuple[str, ...], settings: SanitySettings,
                   device: str | None = None, model_file: str | None = None, prompt: str | None = None) -> SanityJob:
        """The job for the model `handle` holds (its zero-shot list too), loadable by any worker."""
        model, weights = model_source(handle)
        return cls(model, weights, device, absolute_model_file(model_file), tuple(methods), handle.depth, settings,
                   prompt=prompt, zero_shot=zero_shot_of(handle))

    def open(self) -> SanityWorker:
        handle = load_model(self.model, weights=self.weights, device=self.device, model_file=self.model_file)
        handle = with_job_zero_shot(handle, self.zero_shot)
        return SanityWorker(handle, self)

    def merge(self, a: Sums, b: Sums) -> Sums:
        return a + b

    def finalize(self, sums: Sums, skipped: Skipped) -> FolderSanity:
        if sums.count == 0:
            raise VitInspectError("None of the images could be read."
                                  + (f" First problem: {skipped[0][0]}: {skipped[0][1]}" if skipped else ""))
        return FolderSanity(SanityAccumulator.from_state(sums.arrays, sums.count), skipped, self.depth)


def _cell(mean: float, se: float, n: float) -> dict:
    def clean(x: float) -> float | None:
        return None if not math.isfinite(x) else round(float(x), 6)
    return {"mean": clean(mean), "se": clean(se), "n": int(n)}


def table_record(result: FolderSanity) -> dict:
    """The folder table as JSON: per method, ``cascading`` (one entry per step with ``randomised_from_block``
    and ``{mean, se, n}`` of each similarity), ``independent`` (per block), ``random_logit``,
    ``max_sensitivity`` and ``infidelity`` (when run) and ``passes_randomisation`` (the share of images whose
    map passes, Spearman below `PASS_THRESHOLD` once every layer is random); ``left_out``: method -> the
    images on which it failed and was left out."""
    table = result.accumulator.table()
    steps = steps_of(result.depth)
    methods: dict[str, dict] = {}
    for method, (mean, se, n) in table.get("cascading", {}).items():
        entry: dict = {"cascading": [{"randomised_from_block": step,
                                      **{s: _cell(mean[i, j], se[i, j], n[i, j]) for j, s in enumerate(SIMILARITIES)}}
                                     for i, step in enumerate(steps)]}
        if method in table.get("independent", {}):
            mean_i, se_i, n_i = table["independent"][method]
            entry["independent"] = [{"block": b, **{s: _cell(mean_i[b, j], se_i[b, j], n_i[b, j])
                                                    for j, s in enumerate(SIMILARITIES)}} for b in range(len(mean_i))]
        if method in table.get("random_logit", {}):
            mean_r, se_r, n_r = table["random_logit"][method]
            entry["random_logit"] = {s: _cell(mean_r[j], se_r[j], n_r[j]) for j, s in enumerate(SIMILARITIES)}
        for kind in ("max_sensitivity", "infidelity", "passes"):
            if method in table.get(kind, {}):
                mean_k, se_k, n_k = table[kind][method]
                entry["passes_randomisation" if kind == "passes" else kind] = _cell(mean_k[0], se_k[0], n_k[0])
        methods[method] = entry
    left_out = {method: int(n[0]) for method, (_, _, n) in table.get("left_out", {}).items()}
    return {"images": result.accumulator.images, "pass_threshold": PASS_THRESHOLD, "methods": methods,
            "left_out": left_out}


def _mean_se(value: dict | None, digits: int = 2) -> str:
    """"mean ± se" of a `table_record` cell; "–" when undefined."""
    if not value or value["mean"] is None:
        return "–"
    se = value["se"]
    return f"{value['mean']:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def _robust(value: dict | None) -> str:
    """max-sensitivity and infidelity: three significant digits, whatever their scale."""
    if not value or value["mean"] is None:
        return "–"
    return f"{value['mean']:.3g}" + ("" if value["se"] is None else f" ± {value['se']:.2g}")


def format_sanity_table(record: dict) -> str:
    """A Markdown table: per method, the similarities once every layer is random (the last cascading step),
    the random-logit similarities, max-sensitivity and infidelity (when run) and the share of images that
    pass; mean ± s.e."""
    images = record["images"]
    robust = any(entry.get("max_sensitivity") for entry in record["methods"].values())
    lines = [f"{images} image{'' if images == 1 else 's'}; a map passes the randomisation test when its Spearman "
             f"with the trained map, every layer random, is below {record['pass_threshold']}",
             "| method | random model: Spearman | SSIM | top-10 % | random logit: Spearman | SSIM | top-10 % "
             + ("| max-sensitivity | infidelity " if robust else "") + "| passes |",
             "| --- |" + " --- |" * (9 if robust else 7)]
    for method, entry in record["methods"].items():
        last = entry["cascading"][-1]
        logit = entry.get("random_logit") or {}
        passes = entry.get("passes_randomisation")
        share = "–" if not passes or passes["mean"] is None else f"{100 * passes['mean']:.0f} %"
        cells = [_mean_se(last[s]) for s in SIMILARITIES] + [_mean_se(logit.get(s)) for s in SIMILARITIES]
        if robust:
            cells += [_robust(entry.get("max_sensitivity")), _robust(entry.get("infidelity"))]
        lines.append(f"| {method} | " + " | ".join(cells + [share]) + " |")
    return "\n".join(lines)


def format_steps_table(record: dict, similarity: str = "spearman") -> str:
    """A Markdown table of one similarity along the cascading test: one row per method, one column per step
    (the trained model, "from block b" for every block from the last one down, "+ embedding"); mean ± s.e."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"unknown similarity {similarity!r}; use one of {', '.join(SIMILARITIES)}")
    methods = record["methods"]
    steps = [e["randomised_from_block"] for e in next(iter(methods.values()))["cascading"]] if methods else []
    names = ["trained" if s is None else "+ embedding" if s == "embedding" else f"from {s}" for s in steps]
    lines = [f"| method | {' | '.join(names)} |", "| --- |" + " --- |" * len(names)]
    for method, entry in methods.items():
        lines.append(f"| {method} | " + " | ".join(_mean_se(e[similarity]) for e in entry["cascading"]) + " |")
    return "\n".join(lines)


def write_sanity_csv(record: dict, path: Path) -> None:
    """One row per method, test and step: mean, s.e. and count of each similarity (or of the one number of
    max_sensitivity, infidelity and passes_randomisation, under "value")."""
    columns = ["method", "test", "step"] + [f"{s}_{k}" for s in (*SIMILARITIES, "value") for k in ("mean", "se", "n")]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for method, entry in record["methods"].items():
            rows = [("cascading", "none" if e["randomised_from_block"] is None else e["randomised_from_block"], e)
                    for e in entry["cascading"]]
            rows += [("independent", e["block"], e) for e in entry.get("independent", [])]
            if entry.get("random_logit"):
                rows.append(("random_logit", "", entry["random_logit"]))
            for test, step, cells in rows:
                writer.writerow({"method": method, "test": test, "step": step,
                                 **{f"{s}_{k}": cells[s][k] for s in SIMILARITIES for k in ("mean", "se", "n")}})
            for kind in ("max_sensitivity", "infidelity", "passes_randomisation"):
                if entry.get(kind):
                    writer.writerow({"method": method, "test": kind, "step": "",
                                     **{f"value_{k}": entry[kind][k] for k in ("mean", "se", "n")}})
