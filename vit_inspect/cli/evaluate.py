"""`vit-inspect evaluate FOLDER --labels labels.csv`: faithfulness of every method over a folder; with
`--sanity`, the sanity checks instead.

Each image goes through `faithfulness.evaluate_image` (a pure per-image function, so a folder engine
can map it over workers) and into a `FaithfulnessAccumulator` (mergeable sums). The command runs
`jobs.evaluate.EvaluateJob` on the engine interface (`--engine local`, the default, or `--engine ray`), prints the
table of mean AUC ± standard error, and writes per-image curves (`curves.npz`, gathered from the files
the workers write under `OUT/evaluate/curves/`), the table (`table.json`, `table.csv`) and the per-image
AUCs (`per_image.csv`) under `--out`; with `--out` a rerun skips the shards already done.

`--sanity` runs `jobs.sanity.SanityJob` on the same engines: per image the randomisation tests (cascading and,
unless `--no-independent`, independent) and the random-logit test for the predicted class, or for the text
prompt of `--prompt` (OpenCLIP models; its random logit a zero-shot label) (`--robustness` adds max-sensitivity
and infidelity), summed into mean ± s.e. per method, test and step; it prints the
summary table and the Spearman per cascading step, and writes `sanity.json` and `sanity.csv` under `--out`.
Labels only select files here.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

from vit_inspect.analysis.faithfulness import CURVES, PerturbationSettings
from vit_inspect.cli.common import (engine_flags, engine_options, model_options, progress, prompt_options,
                                   robustness_flags, robustness_settings, targets, with_prompt_options)
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.images import find_images
from vit_inspect.core.load import load_model
from vit_inspect.jobs.evaluate import format_table, gather_curves, read_labels, select_files
from vit_inspect.jobs.run import run_job
from vit_inspect.studies.faithfulness import DEFAULT_BATCH_SIZE, faithfulness_methods
from vit_inspect.studies.sanity import sanity_methods


def add_parser(sub) -> None:
    evaluate = sub.add_parser("evaluate", help="faithfulness (pos/neg perturbation, deletion/insertion) of each "
                                               "map over a labelled folder")
    evaluate.add_argument("folder", metavar="FOLDER")
    evaluate.add_argument("--labels", help="CSV with 'filename' and 'class_index' columns (needed for "
                                            "faithfulness; with --sanity it only selects the files)")
    evaluate.add_argument("--methods", help="comma-separated subset of 'random' and the methods `vit-inspect "
                                            "methods` lists as scored (default: all of them)")
    evaluate.add_argument("--limit", type=int, help="at most N images")
    evaluate.add_argument("--every", type=int, default=1, help="every K-th labelled file of the sorted folder")
    evaluate.add_argument("--removal", choices=("mean", "blur"), default="mean",
                          help="removed patches become the mean colour (0 after normalisation) or the blurred image")
    evaluate.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                          help=f"perturbed inputs per forward, one image at a time (default {DEFAULT_BATCH_SIZE})")
    evaluate.add_argument("--images-per-batch", type=int, default=4,
                          help="images the engine hands a worker at once (default 4)")
    evaluate.add_argument("--sanity", action="store_true",
                          help="sanity checks (model randomisation, random logit) instead of faithfulness")
    evaluate.add_argument("--no-independent", action="store_true",
                          help="with --sanity: leave out the independent randomisation (one pass per block)")
    evaluate.add_argument("--robustness", action="store_true",
                          help="with --sanity: add max-sensitivity and infidelity (needs captum)")
    evaluate.add_argument("--seed", type=int, default=0, help="with --sanity: seed of the re-drawn weights and the "
                                                              "random class (default 0)")
    robustness_flags(evaluate, when="with --sanity --robustness, ")
    prompt_options(evaluate)
    engine_flags(evaluate, batch_size=False)
    model_options(evaluate, out_help="folder for curves.npz, table.json, table.csv and per_image.csv "
                                     "(and the shards of a folder-level job)")
    evaluate.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    from vit_inspect.jobs.evaluate import EvaluateJob, EvaluateWorker

    known = faithfulness_methods()
    methods = tuple(args.methods.split(",")) if args.methods else (sanity_methods() if args.sanity else tuple(known))
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise VitInspectError(f"Unknown method(s) {', '.join(unknown)}; choose from {', '.join(known)}.")
    if args.batch_size < 1 or args.images_per_batch < 1:
        raise VitInspectError("--batch-size and --images-per-batch must be at least 1.")
    if args.labels is None and not args.sanity:
        raise VitInspectError("Faithfulness needs --labels (a CSV with 'filename' and 'class_index' columns).")
    labels = read_labels(args.labels) if args.labels else {p.name: 0 for p in find_images([args.folder])}
    files = select_files(args.folder, labels, args.every, args.limit)
    if not files:
        raise VitInspectError("No labelled images found: file names in the folder must match the labels file."
                              if args.labels else f"No images found under {args.folder!r}.")
    prompt, versus = targets(args)
    if args.sanity and versus is not None:
        raise VitInspectError("The sanity checks explain one prompt; --versus is not supported with --sanity.")
    handle = with_prompt_options(load_model(args.model, weights=args.weights, device=args.device,
                                            model_file=args.model_file), args)
    if args.sanity:
        run_sanity(args, handle, methods, files, prompt)
        return
    settings = PerturbationSettings(removal=args.removal)
    out = Path(args.out) if args.out else None
    curves_dir = out / "evaluate" / "curves" if out else None
    job = EvaluateJob.for_handle(handle, {p.name: labels[p.name] for p in files}, methods, device=args.device,
                                 model_file=args.model_file, curves_dir=curves_dir, settings=settings,
                                 batch_size=args.batch_size, prompt=prompt, versus=versus)
    worker = EvaluateWorker(handle, job) if args.engine == "local" else None
    result, _ = run_job(job, files, args.engine, engine_options(args, batch_size=args.images_per_batch),
                        progress=progress, worker=worker)
    for name, reason in result.skipped:
        print(f"skipped {name}: {reason}", file=sys.stderr)
    accumulator = result.accumulator
    table = accumulator.table()
    print(format_table(table, accumulator.images, accumulator.correct, accumulator.left_out), flush=True)
    if out:
        curves, rows = gather_curves(curves_dir, files, {name for name, _ in result.skipped})
        np.savez_compressed(out / "curves.npz", **curves)
        record = {"model": handle.name, "weights": Path(handle.weights).name, "images": accumulator.images,
                  "clean_top1": accumulator.correct / accumulator.images, "settings": vars(settings),
                  "engine": args.engine, "skipped": [name for name, _ in result.skipped],
                  "target": None if prompt is None else {"prompt": prompt},
                  "contrast": None if versus is None else {"prompt": versus},
                  "score": "probability" if prompt is None else "cosine",
                  "methods": {m: {c: {"mean": v[0], "se": v[1]} for c, v in t.items()} for m, t in table.items()},
                  "left_out": accumulator.left_out}
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


def run_sanity(args: argparse.Namespace, handle, methods: tuple[str, ...], files: list[Path],
               prompt: str | None = None) -> None:
    """`--sanity`: `jobs.sanity.SanityJob` on the engine chosen; the two tables, `sanity.json`, `sanity.csv`."""
    from vit_inspect.jobs.sanity import (SanityJob, SanityWorker, format_sanity_table, format_steps_table, table_record,
                                        write_sanity_csv)
    from vit_inspect.studies.sanity import SanitySettings

    settings = SanitySettings(seed=args.seed, independent=not args.no_independent,
                              robustness=robustness_settings(args) if args.robustness else None)
    job = SanityJob.for_handle(handle, methods, settings, device=args.device, model_file=args.model_file,
                               prompt=prompt)
    worker = SanityWorker(handle, job) if args.engine == "local" else None
    result, _ = run_job(job, files, args.engine, engine_options(args, batch_size=args.images_per_batch),
                        progress=progress, worker=worker)
    for name, reason in result.skipped:
        print(f"skipped {name}: {reason}", file=sys.stderr)
    record = table_record(result)
    print(format_sanity_table(record) + "\n\nSpearman with the trained map along the cascading randomisation:\n"
          + format_steps_table(record), flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        robustness = settings.robustness
        record = {"model": handle.name, "weights": Path(handle.weights).name, "engine": args.engine,
                  "settings": {"seed": settings.seed, "independent": settings.independent,
                               "random_class": ("drawn with the seed among the other classes" if prompt is None
                                                else "drawn with the seed among the zero-shot labels"),
                               "robustness": None if robustness is None else vars(robustness)},
                  "target": None if prompt is None else {"prompt": prompt},
                  "skipped": [name for name, _ in result.skipped], **record}
        (out / "sanity.json").write_text(json.dumps(record, indent=1))
        write_sanity_csv(record, out / "sanity.csv")
