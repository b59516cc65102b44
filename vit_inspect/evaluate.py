"""`vit-inspect evaluate FOLDER --labels labels.csv`: faithfulness of every method over a folder.

Each image goes through `faithfulness.evaluate_image` (a pure per-image function, so a folder engine
can map it over workers) and into a `FaithfulnessAccumulator` (mergeable sums). The command prints the
table of mean AUC ± standard error, and writes per-image curves (`curves.npz`), the table
(`table.json`, `table.csv`) and the per-image AUCs (`per_image.csv`) under `--out`.
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
    """The local engine: `evaluate_image` over the files, one after another, into one accumulator."""
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
    lines = [f"{images} images, clean top-1 {100.0 * correct / max(images, 1):.1f} %",
             "| method | " + " | ".join(f"{c} {arrows[c]}" for c in CURVES) + " |",
             "| --- |" + " --- |" * len(CURVES)]
    for name in sorted(table, key=lambda m: table[m]["del"][0]):
        cells = [f"{table[name][c][0]:.1f} ± {table[name][c][1]:.1f}" if c in ("pos", "neg")
                 else f"{table[name][c][0]:.3f} ± {table[name][c][1]:.3f}" for c in CURVES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cmd_evaluate(args: argparse.Namespace) -> None:
    methods = tuple(args.methods.split(",")) if args.methods else tuple(METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise VitInspectError(f"Unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}.")
    labels = read_labels(args.labels)
    files = select_files(args.folder, labels, args.every, args.limit)
    if not files:
        raise VitInspectError("No labelled images found: file names in the folder must match the labels file.")
    handle = load_model(args.model, weights=args.weights, device=args.device)
    settings = PerturbationSettings(removal=args.removal)
    curves: dict[str, np.ndarray] = {}
    rows: list[dict] = []

    def keep(path: Path, result: ImageFaithfulness) -> None:
        for name, c in result.curves.items():
            for field, values in (("pos", c.pos), ("neg", c.neg), ("del", c.deletion), ("ins", c.insertion)):
                curves[f"{path.stem}/{field}/{name}"] = values.astype(np.float32)
            rows.append({"image": path.name, "label": result.label, "target": result.target, "method": name,
                         **{k: round(v, 6) for k, v in c.aucs().items()}})

    def progress(done: int, total: int) -> None:
        print(f"\r{done}/{total} images", end="" if done < total else "\n", file=sys.stderr, flush=True)

    accumulator = evaluate_folder(handle, files, labels, methods, settings, args.batch_size, keep, progress)
    table = accumulator.table()
    print(format_table(table, accumulator.images, accumulator.correct), flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(out / "curves.npz", **curves)
        record = {"model": handle.name, "weights": Path(handle.weights).name, "images": accumulator.images,
                  "clean_top1": accumulator.correct / accumulator.images, "settings": vars(settings),
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


def add_evaluate_parser(sub, model_options: Callable[[argparse.ArgumentParser], None]) -> None:
    evaluate = sub.add_parser("evaluate", help="faithfulness (pos/neg perturbation, deletion/insertion) of each "
                                               "map over a labelled folder")
    evaluate.add_argument("folder", metavar="FOLDER")
    evaluate.add_argument("--labels", required=True, help="CSV with 'filename' and 'class_index' columns")
    evaluate.add_argument("--methods", help=f"comma-separated subset of {','.join(METHODS)} (default: all)")
    evaluate.add_argument("--limit", type=int, help="at most N images")
    evaluate.add_argument("--every", type=int, default=1, help="every K-th labelled file of the sorted folder")
    evaluate.add_argument("--removal", choices=("mean", "blur"), default="mean",
                          help="removed patches become the mean colour (0 after normalisation) or the blurred image")
    evaluate.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    model_options(evaluate)
    evaluate.set_defaults(func=cmd_evaluate)
