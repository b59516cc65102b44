"""Command line: `vit-inspect analyze IMAGE_OR_FOLDER...`, `vit-inspect model` and `vit-inspect compare`
(or `python -m vit_inspect`).

`analyze` prints one JSON object per image on its own line and writes figures under `--out`;
`model` prints one JSON object with the model-level (ViT Fig. 7) analyses. Progress goes to
stderr; an error is one line on stderr and a non-zero exit.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .engine import ENGINES, EngineOptions, run_job
from .errors import VitInspectError
from .geometry import GEOMETRY_MODES, InputGeometry
from .jobs import AttentionDistanceJob, AttentionDistanceWorker
from .evaluate import add_evaluate_parser
from .models import DEFAULT_MODEL, ViTHandle, load_model
from .pipeline import ImageAnalysis, analyze_image, find_images, model_report
from . import model_plots, plotting


def _rounded(array: np.ndarray | None, digits: int = 6):
    return None if array is None else np.round(np.asarray(array, dtype=np.float64), digits).tolist()


def class_record(handle: ViTHandle, index: int | None) -> dict | None:
    """{"index", "label"} of a class, None for none."""
    return None if index is None else {"index": int(index), "label": handle.label(int(index))}


def analysis_record(handle: ViTHandle, result: ImageAnalysis, image: str) -> dict:
    """The JSON object `analyze` prints for one image. `target` is the class the gradient maps explain
    (`contrast`: the class it is compared with, gradients of logit target - logit contrast)."""
    layout = result.layout
    gradcam = None if result.gradcam is None else result.gradcam[-1]
    return {
        "image": image,
        "model": handle.name,
        "weights": Path(handle.weights).name if Path(handle.weights).is_absolute() else handle.weights,
        "input_geometry": result.geometry,
        "target": class_record(handle, result.target),
        "contrast": class_record(handle, result.contrast),
        "input_size": list(layout.input_size),
        "patch_size": [layout.patch_h, layout.patch_w],
        "grid": [layout.grid_h, layout.grid_w],
        "num_prefix_tokens": layout.num_prefix_tokens,
        "topk": handle.top_labels(result.probs, 5) if result.probs.size else [],
        "mean_attention_distance": _rounded(result.mean_distance, 3),
        "rollout": _rounded(result.rollout()),
        "gradcam": _rounded(gradcam),
        "chefer": _rounded(result.chefer),
        "legrad": _rounded(result.legrad),
        "attnlrp": _rounded(result.attnlrp),
    }


def _save(fig, path: Path) -> None:
    path.write_bytes(plotting.figure_to_png(fig))


def _write_image_figures(handle: ViTHandle, result: ImageAnalysis, out: Path, stem: str) -> None:
    maps = {"attention (last layer, mean of heads)": result.attention_map(result.depth - 1),
            "rollout (mean fusion, all layers)": result.rollout()}
    units = {"attention (last layer, mean of heads)": "attention weight (probability)",
             "rollout (mean fusion, all layers)": "rollout weight (fraction)"}
    title = f"{handle.name} · {stem}"
    if result.gradcam is not None:
        explained = class_record(handle, result.target)
        title += f" · class {explained['label']} (#{explained['index']})"
        if result.contrast is not None:
            title += f" versus {handle.label(result.contrast)} (#{result.contrast})"
        maps["Grad-CAM (last block, ReLU)"] = result.gradcam[-1]
        maps["gradient-weighted attention"] = result.chefer
        units |= {"Grad-CAM (last block, ReLU)": "activation × gradient",
                  "gradient-weighted attention": "relevance (logit units)"}
    for name, values in (("LeGrad", result.legrad), ("AttnLRP", result.attnlrp)):
        if values is not None:
            maps[name] = values
            units[name] = "relevance (logit units)"
    _save(plotting.maps_figure(result.rgb, maps, relu_names=("Grad-CAM (last block, ReLU)",), units=units,
                               title=title), out / f"{stem}_maps.png")
    _save(plotting.attention_distance_figure(result.mean_distance, image_width=result.layout.input_size[1],
                                             title=f"mean attention distance: {handle.name} · {stem}"),
          out / f"{stem}_distance.png")


def _parse_size(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise VitInspectError(f"--input-size must look like 224x320 (height x width), got {text!r}") from None
    return height, width


def figure_stems(files: list[Path]) -> list[str]:
    """One name per image for its figures: the file's stem, and for a stem already taken (two folders'
    chelsea.png) the stem with the first free ``_2``, ``_3``, ... so that no figure overwrites another."""
    taken: set[str] = set()
    stems = []
    for path in files:
        stem, number = path.stem, 1
        while stem in taken:
            number += 1
            stem = f"{path.stem}_{number}"
        taken.add(stem)
        stems.append(stem)
    return stems


def _progress(done: int, total: int) -> None:
    print(f"\r{done}/{total} images", end="" if done < total else "\n", file=sys.stderr, flush=True)


def cmd_analyze(args: argparse.Namespace) -> None:
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    if args.shorter_side is not None and args.geometry != "keep":
        raise VitInspectError("--shorter-side applies only with --geometry keep.")
    files = find_images(args.images)
    if not files:
        raise VitInspectError("No images found in the paths given.")
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    stems = figure_stems(files)
    for done, path in enumerate(files, 1):
        geometry = None if args.geometry is None else InputGeometry(args.geometry, args.shorter_side)
        result = analyze_image(handle, path, target=args.target, input_size=_parse_size(args.input_size),
                               autocast=args.half, geometry=geometry, contrast=args.contrast,
                               relevance=not args.no_relevance)
        print(json.dumps(analysis_record(handle, result, str(path))), flush=True)
        if out:
            _write_image_figures(handle, result, out, stems[done - 1])
        if len(files) > 1:
            _progress(done, len(files))


def cmd_model(args: argparse.Namespace) -> None:
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    report = model_report(handle, k=args.components)
    record = {
        "model": handle.name,
        "filter_pca": {"components": _rounded(report.filter_pca.components),
                       "explained_variance_ratio": _rounded(report.filter_pca.explained_variance_ratio)},
        "pos_embed_similarity": _rounded(report.pos_similarity),
    }
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
        _save(model_plots.filter_pca_figure(report.filter_pca, model=handle.name), out / "filter_pca.png")
        if report.pos_similarity is not None:
            grid = f"{report.grid[0]}×{report.grid[1]}"
            _save(model_plots.pos_similarity_figure(
                report.pos_similarity, title=f"{handle.name}: position embedding similarity, {grid} grid"),
                out / "pos_embed_similarity.png")
    if args.images:
        files = find_images([args.images])
        if not files:
            raise VitInspectError(f"No images found in {args.images!r}.")
        job = AttentionDistanceJob.for_handle(handle, device=args.device, model_file=args.model_file)
        stats, _ = run_job(job, files, args.engine, engine_options(args), progress=_progress,
                           worker=AttentionDistanceWorker(handle))
        for name, reason in stats.skipped:
            print(f"skipped {name}: {reason}", file=sys.stderr)
        record["dataset_mean_attention_distance"] = _rounded(stats.distances, 3)
        record["num_images"] = stats.num_images
        if out:
            _save(plotting.attention_distance_figure(
                stats.distances, image_width=handle.input_size[1],
                title=f"mean attention distance: {handle.name}, over {stats.num_images} "
                      f"image{'' if stats.num_images == 1 else 's'}"),
                out / "mean_attention_distance.png")
    print(json.dumps(record), flush=True)


def engine_options(args: argparse.Namespace, batch_size: int | None = None) -> EngineOptions:
    """The engine flags of a folder-level command (see `engine_flags`); `batch_size`: images per worker
    call when the command's own --batch-size means something else."""
    return EngineOptions(batch_size=batch_size or args.batch_size, shard_size=args.shard_size, out=args.out,
                         ray_address=args.ray_address, concurrency=args.concurrency, num_gpus=args.num_gpus)


def engine_flags(p: argparse.ArgumentParser, batch_size: bool = True) -> None:
    """Flags shared by every folder-level command: engine choice, batching, shards, Ray placement."""
    p.add_argument("--engine", choices=ENGINES, default="local",
                   help="local: in-process loop (default); ray: Ray Data, model replicas as actors")
    if batch_size:
        p.add_argument("--batch-size", type=int, default=16, help="images per model call (default 16)")
    p.add_argument("--shard-size", type=int, default=256,
                   help="files per shard; with --out each finished shard is saved and a rerun skips it (default 256)")
    p.add_argument("--ray-address", help="join this Ray cluster (e.g. auto, ray://head:10001); "
                                         "default: start a local Ray on this machine")
    p.add_argument("--concurrency", type=int, help="model actors under Ray (default: one per GPU, else 1)")
    p.add_argument("--num-gpus", type=float, help="GPUs per actor under Ray (default: 1 when the cluster has GPUs)")


def _rows_progress(done: int, total: int) -> None:
    print(f"\rhead importance: {done}/{total} rows", end="" if done < total else "\n", file=sys.stderr, flush=True)


def _reference_progress(done: int, total: int) -> None:
    print(f"\rmean head outputs: {done}/{total} reference images", end="" if done < total else "\n", file=sys.stderr,
          flush=True)


def cmd_heads(args: argparse.Namespace) -> None:
    from .heads_report import heads_record

    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    record = heads_record(handle, args.image, ablate=args.ablate, mode=args.mode, reference=args.reference,
                          importance=args.importance, lens=args.lens, target=args.target,
                          batch_size=args.batch_size, progress=_rows_progress if args.importance else None, out=out,
                          reference_progress=_reference_progress)
    print(json.dumps(record), flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vit-inspect", description="Look inside Vision Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_options(p: argparse.ArgumentParser,
                      out_help: str = "folder for the PNG figures (and the shards of a folder-level job)") -> None:
        p.add_argument("--model", default=DEFAULT_MODEL, help=f"timm name, HF id or folder (default {DEFAULT_MODEL})")
        p.add_argument("--weights", help="weights file (.safetensors preferred, .pth read with weights_only)")
        p.add_argument("--model-file", metavar="FILE.py:FUNCTION",
                       help="a hand-written ViT: imports FILE.py (runs its code) and calls FUNCTION() for "
                            "(model, ModuleSpec); replaces --model (see README, 'Your own ViT')")
        p.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available)")
        p.add_argument("--out", help=out_help)

    analyze = sub.add_parser("analyze", help="per-image maps and numbers, one JSON line per image")
    analyze.add_argument("images", nargs="+", metavar="IMAGE_OR_FOLDER")
    analyze.add_argument("--target", type=int, help="class index for Grad-CAM and gradient-weighted attention "
                                                      "(default: the top prediction)")
    analyze.add_argument("--contrast", type=int, help="explain --target versus this class: gradients of "
                                                        "logit(target) - logit(contrast)")
    analyze.add_argument("--input-size", help="HxW input size, e.g. 224x320 (default: the model's own)")
    analyze.add_argument("--geometry", choices=GEOMETRY_MODES, help="crop: the model's centre crop (default); "
                         "squash: the whole image resized to the model's size; keep: the whole image, aspect "
                         "ratio kept, on a non-square grid (see --shorter-side)")
    analyze.add_argument("--shorter-side", type=int, help="with --geometry keep: the shorter side in pixels "
                                                            "(default: the model's input size)")
    analyze.add_argument("--half", action="store_true", help="half-precision autocast (float16 on CUDA, bfloat16 "
                                                             "on CPU; fast on GPUs, slow on most CPUs)")
    analyze.add_argument("--no-relevance", action="store_true", help="skip AttnLRP and LeGrad (their keys are "
                         "null): one forward and one ordinary backward per image, about 0.4x the time of the full pass")
    model_options(analyze)
    analyze.set_defaults(func=cmd_analyze)

    model = sub.add_parser("model", help="ViT Fig. 7: filter PCA, position similarity, dataset attention distance")
    model.add_argument("--images", help="folder of images for the dataset mean attention distance")
    model.add_argument("--components", type=int, default=28, help="principal components of the filters (default 28)")
    engine_flags(model)
    model_options(model)
    model.set_defaults(func=cmd_model)

    heads = sub.add_parser("heads", help="head statistics, ablation, per-image head importance and logit lens (JSON)")
    heads.add_argument("image", metavar="IMAGE")
    heads.add_argument("--ablate", metavar="L:H,...", help="heads to ablate together, e.g. 3:1,5:0")
    heads.add_argument("--mode", choices=("zero", "mean", "uniform"), default="zero", help="ablation mode (default zero)")
    heads.add_argument("--reference", metavar="FOLDER", help="images whose mean head outputs --mode mean uses")
    heads.add_argument("--importance", action="store_true", help="drop in the target logit per head ablated alone")
    heads.add_argument("--lens", action="store_true", help="logit lens: top-5 and the final class's rank per block")
    heads.add_argument("--target", type=int, help="class index (default: the top prediction)")
    heads.add_argument("--batch-size", type=int, default=16, help="rows per forward for --importance and --reference")
    model_options(heads)
    heads.set_defaults(func=cmd_heads)
    add_evaluate_parser(sub, model_options, engine_flags)
    from .compare_cli import add_compare_parser  # imported here: compare_cli uses this module's helpers
    add_compare_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except VitInspectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
