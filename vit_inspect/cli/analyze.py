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
from vit_inspect.core.sae_load import load_sae
from vit_inspect.methods import MethodContext, method_record
from vit_inspect.passes.options import PassOptions
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.passes.records import target_text
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.passes.targets import TARGET_METHODS, TargetMaps, concept_target, feature_target, target_maps
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
    analyze.add_argument("--feature", metavar="SAE_FILE:I", help="also explain feature I of this SAE (its "
                         "activation summed over the patch tokens at the SAE's block) by Grad-CAM, LeGrad and "
                         "AttnLRP: the record's key target_maps, the figure IMAGE_feature.png")
    analyze.add_argument("--concept", metavar="LAYER:K:C[:SEED]", help="also explain concept C of the image's K DFF "
                         "concepts at block LAYER (NMF seed SEED, default 0) by Grad-CAM, LeGrad and AttnLRP: its "
                         "coefficient summed over the patches; the record's key target_maps, IMAGE_concept.png")
    prompt_options(analyze)
    model_options(analyze)
    analyze.set_defaults(func=run)


def parse_feature(text: str) -> tuple[str, int]:
    """(SAE file, feature index) of --feature SAE_FILE:I."""
    path, _, index = text.rpartition(":")
    if not path or not index.isdigit():
        raise VitInspectError(f"--feature takes SAE_FILE:I, a file and a feature index, not {text!r}.")
    return path, int(index)


def parse_concept(text: str) -> tuple[int, int, int, int]:
    """(block, k, concept, seed) of --concept LAYER:K:C[:SEED] (the block may count from the end: -1)."""
    parts = text.split(":")
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (3, 4) or any(n < 0 for n in numbers[1:]):
        raise VitInspectError(f"--concept takes LAYER:K:C or LAYER:K:C:SEED, whole numbers, not {text!r}.")
    return (*numbers[:3], numbers[3] if len(numbers) == 4 else 0)


def explained_target(handle: ViTHandle, result: ImageAnalysis, args: argparse.Namespace, feature) -> TargetMaps | None:
    """The maps of --feature (``feature``, made once) or --concept for this image's pass; None without either.
    With --no-relevance, Grad-CAM only."""
    if feature is None and args.concept is None:
        return None
    if feature is None:
        layer, k, index, seed = parse_concept(args.concept)
        feature = concept_target(handle, result, index, k, layer, seed)
    methods = ("gradcam",) if args.no_relevance else TARGET_METHODS
    return target_maps(handle, MethodContext(result, handle).model_input(), feature, methods)


def run(args: argparse.Namespace) -> None:
    target, contrast = targets(args)
    if args.feature and args.concept:
        raise VitInspectError("--feature and --concept each name a target; give one of them.")
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    handle = with_prompt_options(handle, args)
    feature = None
    if args.feature:
        path, index = parse_feature(args.feature)
        feature = feature_target(handle, load_sae(path, model=handle.name), index, path)
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
        record = method_record(handle, result, str(path))
        explained = explained_target(handle, result, args, feature)
        if explained is not None:
            record["target_maps"] = explained.record()
        print(json.dumps(record), flush=True)
        if out:
            write_image_figures(handle, result, out, stems[done - 1])
            if explained is not None:
                kind = "feature" if feature is not None else "concept"
                save_png(map_plots.target_maps_figure(result.rgb, explained, f"{handle.name} · {stems[done - 1]}"),
                         out / f"{stems[done - 1]}_{kind}.png")
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
