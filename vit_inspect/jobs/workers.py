"""Folder-level jobs for `jobs.run.run_job`: picklable specs that load their model once per worker.

`AttentionDistanceJob`: the ViT paper's Fig. 7 (right) mean attention distance averaged over a
folder (`vit-inspect model --images`).
`EvaluateJob`: faithfulness (perturbation and deletion/insertion AUCs) of every method over a labelled
folder (`vit-inspect evaluate`), as the running sums of a `FaithfulnessAccumulator`.
"""
from __future__ import annotations

from pathlib import Path

from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.module_spec import parse_model_file


def model_source(handle: ViTHandle) -> tuple[str, str | None]:
    """(model, weights) that load the same model as `handle` in another process: absolute paths,
    because a worker's working directory (and on a cluster, its machine) is not the caller's."""
    model = str(Path(handle.name).resolve()) if Path(handle.name).is_dir() else handle.name
    weights = str(Path(handle.weights).resolve()) if Path(handle.weights).is_file() else None
    return model, weights


ZeroShot = tuple[tuple[str, ...], tuple[str, ...]]  # (labels, templates) of an OpenCLIP model's zero-shot list


def zero_shot_of(handle: ViTHandle) -> ZeroShot | None:
    """The zero-shot list `handle` holds (OpenCLIP models), for a job to give its workers; None otherwise."""
    return None if handle.clip is None else (handle.clip.labels, handle.clip.templates)


def with_job_zero_shot(handle: ViTHandle, zero_shot: ZeroShot | None) -> ViTHandle:
    """A worker's freshly loaded `handle` with the job's zero-shot list (`zero_shot_of`), so that its labels and
    the columns they give are the caller's."""
    if zero_shot is None:
        return handle
    from vit_inspect.core.open_clip_models import with_zero_shot

    return with_zero_shot(handle, *zero_shot)


def absolute_model_file(model_file: str | None) -> str | None:
    """A `--model-file` reference with its file made absolute, for workers in other folders."""
    if model_file is None:
        return None
    path, function = parse_model_file(model_file)
    return f"{path.resolve()}:{function}"


