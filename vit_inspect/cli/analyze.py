"""`vit-inspect analyze IMAGE_OR_FOLDER...`: one JSON line per image, figures under --out."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from vit_inspect.cli.common import (figure_stems, model_options, progress, prompt_options, save_png, targets,
                                    with_prompt_options)
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.geometry import GEOMETRY_MODES, InputGeometry, parse_size
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.images import find_images
from vit_inspect.core.load import load_model
from vit_inspect.methods import method_record
from vit_inspect.passes.options import PassOptions
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.passes.records import target_text
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.plots import distance as distance_plots
from vit_inspect.plots import maps as map_plots


def add_parser(sub) -> None:
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
                         "null): one forward and one ordinary backward per image, about a third of the full pass")
    prompt_options(analyze)
    model_options(analyze)
    analyze.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    target, contrast = targets(args)
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    handle = with_prompt_options(handle, args)
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
        options = PassOptions(input_size=parse_size(args.input_size), autocast=args.half, geometry=geometry,
                              relevance=not args.no_relevance)
        result = analyze_image(handle, path, target, options, contrast=contrast)
        print(json.dumps(method_record(handle, result, str(path))), flush=True)
        if out:
            write_image_figures(handle, result, out, stems[done - 1])
        if len(files) > 1:
            progress(done, len(files))


def write_image_figures(handle: ViTHandle, result: ImageAnalysis, out: Path, stem: str) -> None:
    maps, relu, units = map_plots.titled_pass_maps(result, handle)
    title = f"{handle.name} · {stem}"
    if result.gradcam is not None:
        title += f" · {target_text(handle, result.target, result.prompt)}"
        if result.contrast is not None:
            title += f" versus {target_text(handle, result.contrast, result.versus)}"
    save_png(map_plots.maps_figure(result.rgb, maps, relu_names=relu, units=units, title=title),
             out / f"{stem}_maps.png")
    save_png(distance_plots.attention_distance_figure(result.mean_distance, image_width=result.layout.input_size[1],
                                             title=f"mean attention distance: {handle.name} · {stem}"),
          out / f"{stem}_distance.png")
