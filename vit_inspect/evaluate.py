"""`vit-inspect evaluate FOLDER --labels labels.csv`: faithfulness of every method over a folder.

Each image goes through `faithfulness.evaluate_image` (a pure per-image function, so a folder engine
can map it over workers) and into a `FaithfulnessAccumulator` (mergeable sums). The command runs
`jobs.EvaluateJob` on the engine interface (`--engine local`, the default, or `--engine ray`), prints the
table of mean AUC ± standard error, and writes per-image curves (`curves.npz`, gathered from the files
the workers write under `OUT/evaluate/curves/`), the table (`table.json`, `table.csv`) and the per-image
AUCs (`per_image.csv`) under `--out`; with `--out` a rerun skips the shards already done.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from .analysis.faithfulness import CURVES, LOWER_IS_BETTER, PerturbationSettings
from .engine import run_job
from .errors import VitInspectError
from .faithfulness import DEFAULT_BATCH_SIZE, METHODS, FaithfulnessAccumulator, ImageFaithfulness, evaluate_image
from .models import ViTHandle, load_model
from .pipeline import find_images

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
    for library use, with a per-image callback. The command runs `jobs.EvaluateJob` through
    `engine.run_job` instead (either engine; equal numbers, tested in tests/test_evaluate_engine.py)."""
    accumulator = FaithfulnessAccumulator()
    for done, path in enumerate(files, 1):
        result = evaluate_image(handle, path, labels[path.name], methods, settings=settings, batch_size=batch_size)
        accumulator.add(result)
        if on_image is not None:
            on_image(path, result)
        if progress is not None:
            progress(done, len(files))
    return accumulator


def format_table(table: dict[str, dict[str, tuple[float, float]]], images: int, correct: int) -> str:
    """A Markdown table: mean ± s.e. per method and curve, best method (by deletion AUC) first."""
    arrows = {c: "↓" if LOWER_IS_BETTER[c] else "↑" for c in CURVES}
    lines = [f"{images} image{'' if images == 1 else 's'}, clean top-1 {100.0 * correct / max(images, 1):.1f} %",
             "| method | " + " | ".join(f"{c} {arrows[c]}" for c in CURVES) + " |",
             "| --- |" + " --- |" * len(CURVES)]
    def cell(mean: float, error: float, digits: int) -> str:  # one image has no standard error: said, not "nan"
        return f"{mean:.{digits}f} ± {error:.{digits}f}" if np.isfinite(error) else f"{mean:.{digits}f} (s.e. needs 2 images)"

    for name in sorted(table, key=lambda m: table[m]["del"][0]):
        cells = [cell(*table[name][c], 1 if c in ("pos", "neg") else 3) for c in CURVES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gather_curves(folder: Path, files: list[Path], skipped: set[str]) -> tuple[dict[str, np.ndarray], list[dict]]:
    """The per-image files the workers wrote (`jobs.write_image_curves`), in file order, as the
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


def cmd_evaluate(args: argparse.Namespace) -> None:
    from .cli import _progress, engine_options
    from .jobs import EvaluateJob, EvaluateWorker

    methods = tuple(args.methods.split(",")) if args.methods else tuple(METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise VitInspectError(f"Unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}.")
    if args.batch_size < 1 or args.images_per_batch < 1:
        raise VitInspectError("--batch-size and --images-per-batch must be at least 1.")
    labels = read_labels(args.labels)
    files = select_files(args.folder, labels, args.every, args.limit)
    if not files:
        raise VitInspectError("No labelled images found: file names in the folder must match the labels file.")
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    settings = PerturbationSettings(removal=args.removal)
    out = Path(args.out) if args.out else None
    curves_dir = out / "evaluate" / "curves" if out else None
    job = EvaluateJob.for_handle(handle, {p.name: labels[p.name] for p in files}, methods, device=args.device,
                                 model_file=args.model_file, curves_dir=curves_dir, settings=settings,
                                 batch_size=args.batch_size)
    worker = EvaluateWorker(handle, job) if args.engine == "local" else None
    result, _ = run_job(job, files, args.engine, engine_options(args, batch_size=args.images_per_batch),
                        progress=_progress, worker=worker)
    for name, reason in result.skipped:
        print(f"skipped {name}: {reason}", file=sys.stderr)
    accumulator = result.accumulator
    table = accumulator.table()
    print(format_table(table, accumulator.images, accumulator.correct), flush=True)
    if out:
        curves, rows = gather_curves(curves_dir, files, {name for name, _ in result.skipped})
        np.savez_compressed(out / "curves.npz", **curves)
        record = {"model": handle.name, "weights": Path(handle.weights).name, "images": accumulator.images,
                  "clean_top1": accumulator.correct / accumulator.images, "settings": vars(settings),
                  "engine": args.engine, "skipped": [name for name, _ in result.skipped],
                  "methods": {m: {c: {"mean": v[0], "se": v[1]} for c, v in t.items()} for m, t in table.items()}}
        (out / "table.json").write_text(json.dumps(record, indent=1))
        with (out / "table.csv").open("w", newline="") as handle_csv:
            writer = csv.writer(handle_csv)
            writer.writerow(["method"] + [f"{c}_{s}" for c in CURVES for s in ("mean", "se")])
            for name, t in table.items():
                writer.writerow([name] + [round(x, 6) for c in CURVES for x in t[c]])
        with (out / "per_image.csv").open("w", newline="") as handle_csv:
            writer = csv.DictWriter(handle_csv, fieldnames=["image", "label", "target", "method", *CURVES])
            writer.writeheader()
            writer.writerows(rows)


def add_evaluate_parser(sub, model_options: Callable[[argparse.ArgumentParser], None],
                        engine_flags: Callable[..., None]) -> None:
    evaluate = sub.add_parser("evaluate", help="faithfulness (pos/neg perturbation, deletion/insertion) of each "
                                               "map over a labelled folder")
    evaluate.add_argument("folder", metavar="FOLDER")
    evaluate.add_argument("--labels", required=True, help="CSV with 'filename' and 'class_index' columns")
    evaluate.add_argument("--methods", help=f"comma-separated subset of {','.join(METHODS)} (default: all)")
    evaluate.add_argument("--limit", type=int, help="at most N images")
    evaluate.add_argument("--every", type=int, default=1, help="every K-th labelled file of the sorted folder")
    evaluate.add_argument("--removal", choices=("mean", "blur"), default="mean",
                          help="removed patches become the mean colour (0 after normalisation) or the blurred image")
    evaluate.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                          help=f"perturbed inputs per forward, one image at a time (default {DEFAULT_BATCH_SIZE})")
    evaluate.add_argument("--images-per-batch", type=int, default=4,
                          help="images the engine hands a worker at once (default 4)")
    engine_flags(evaluate, batch_size=False)
    model_options(evaluate, out_help="folder for curves.npz, table.json, table.csv and per_image.csv "
                                     "(and the shards of a folder-level job)")
    evaluate.set_defaults(func=cmd_evaluate)
