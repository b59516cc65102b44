"""`vit-inspect model`: the ViT paper's Fig. 7 analyses of one model, as one JSON object."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vit_inspect.cli.common import engine_flags, engine_options, model_options, progress, save_png
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.images import find_images
from vit_inspect.core.load import load_model
from vit_inspect.jobs.distance import AttentionDistanceJob, AttentionDistanceWorker
from vit_inspect.jobs.run import run_job
from vit_inspect.passes.records import rounded
from vit_inspect.plots import distance as distance_plots
from vit_inspect.plots import model as model_plots
from vit_inspect.studies.model_report import model_report


def add_parser(sub) -> None:
    model = sub.add_parser("model", help="ViT Fig. 7: filter PCA, position similarity, dataset attention distance")
    model.add_argument("--images", help="folder of images for the dataset mean attention distance")
    model.add_argument("--components", type=int, default=28, help="principal components of the filters (default 28)")
    engine_flags(model)
    model_options(model)
    model.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    report = model_report(handle, k=args.components)
    record = {
        "model": handle.name,
        "filter_pca": {"components": rounded(report.filter_pca.components),
                       "explained_variance_ratio": rounded(report.filter_pca.explained_variance_ratio)},
        "pos_embed_similarity": rounded(report.pos_similarity),
    }
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        save_png(model_plots.filter_pca_figure(report.filter_pca, model=handle.name), out / "filter_pca.png")
        if report.pos_similarity is not None:
            grid = f"{report.grid[0]}×{report.grid[1]}"
            save_png(model_plots.pos_similarity_figure(
                report.pos_similarity, title=f"{handle.name}: position embedding similarity, {grid} grid"),
                out / "pos_embed_similarity.png")
    if args.images:
        files = find_images([args.images])
        if not files:
            raise VitInspectError(f"No images found in {args.images!r}.")
        job = AttentionDistanceJob.for_handle(handle, device=args.device, model_file=args.model_file)
        stats, _ = run_job(job, files, args.engine, engine_options(args), progress=progress,
                           worker=AttentionDistanceWorker(handle))
        for name, reason in stats.skipped:
            print(f"skipped {name}: {reason}", file=sys.stderr)
        record["dataset_mean_attention_distance"] = rounded(stats.distances, 3)
        record["num_images"] = stats.num_images
        if out:
            save_png(distance_plots.attention_distance_figure(
                stats.distances, image_width=handle.input_size[1],
                title=f"mean attention distance: {handle.name}, over {stats.num_images} "
                      f"image{'' if stats.num_images == 1 else 's'}"),
                out / "mean_attention_distance.png")
    print(json.dumps(record), flush=True)
