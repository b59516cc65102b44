"""`vit-inspect sanity IMAGE [IMAGE ...]`: the sanity checks of every map, one record per image, figures under --out.

Per image (`studies.sanity.sanity_check`): cascading and independent randomisation of the model, the
random-logit test, max-sensitivity and infidelity, for a class or (OpenCLIP models) a text prompt, `--prompt`.
Without `--json` a table per image; with it one JSON object per line: `image`, `model`, `weights`, `target`
(`{index, label}`, or `{prompt}`) and `random_class` (`{index, label}`), `settings`, and
`methods.<name>` with `cascading` (a list of `{randomised_from_block, spearman, ssim, top10_overlap}` that
starts with nothing randomised), `independent` (one `{block, ...}` per block), `random_logit`,
`max_sensitivity`, `infidelity` and `passes_randomisation`; `left_out`: method -> the sentence saying why it
failed and was left out of every test (empty when none did). With `--out`, `<image>_cascading.png` (the maps
at each step, Adebayo et al. Fig. 2) and `<image>_similarity.png` (the similarity curves).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from vit_inspect.cli.common import (figure_stems, model_options, progress_line, prompt_options, robustness_flags,
                                   robustness_settings, save_png, targets, with_prompt_options)
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.images import find_images, load_image
from vit_inspect.core.load import load_model
from vit_inspect.core.prompts import Prompt
from vit_inspect.passes.records import class_record, target_record
from vit_inspect.plots import sanity as sanity_plots
from vit_inspect.studies.faithfulness import faithfulness_methods
from vit_inspect.studies.sanity import PASS_THRESHOLD, ImageSanity, SanitySettings, sanity_check, sanity_methods


def add_parser(sub) -> None:
    sanity = sub.add_parser("sanity", help="sanity checks of every map: model randomisation, random logit, "
                                           "max-sensitivity and infidelity")
    sanity.add_argument("images", nargs="+", metavar="IMAGE")
    sanity.add_argument("--methods", help="comma-separated subset of 'random' and the methods `vit-inspect methods` "
                                          "lists (default: every one it lists as checked by sanity)")
    sanity.add_argument("--json", action="store_true", help="one JSON object per image per line instead of a table")
    sanity.add_argument("--target", type=int, help="class to explain (default: the top prediction)")
    sanity.add_argument("--random-class", type=int, help="the other class of the random-logit test (default: "
                                                         "drawn with --seed and the image's pixels)")
    sanity.add_argument("--seed", type=int, default=0, help="seed of the re-drawn weights, the random class and "
                                                            "the perturbations (default 0)")
    sanity.add_argument("--no-independent", action="store_true", help="leave out the independent randomisation")
    sanity.add_argument("--no-robustness", action="store_true", help="leave out max-sensitivity and infidelity "
                                                                     "(which need captum)")
    robustness_flags(sanity)
    prompt_options(sanity)
    model_options(sanity, out_help="folder for the cascading figure and the similarity curves")
    sanity.set_defaults(func=run)


def settings_of(args: argparse.Namespace) -> SanitySettings:
    robustness = None if args.no_robustness else robustness_settings(args)
    return SanitySettings(seed=args.seed, random_class=args.random_class, independent=not args.no_independent,
                          robustness=robustness)


def summary(result: ImageSanity) -> str:
    """A Markdown table of one image: every layer random, the random logit, the robustness numbers, the verdict."""
    def number(value: float | None) -> str:
        return "–" if value is None else f"{value:.2f}"

    record = result.record()["methods"]
    lines = ["| method | random model: Spearman | SSIM | top-10 % | random logit: Spearman | max-sensitivity "
             f"| infidelity | passes (Spearman < {PASS_THRESHOLD}) |", "| --- |" + " --- |" * 7]
    for method, entry in record.items():
        last, logit = entry["cascading"][-1], entry["random_logit"] or {}
        verdict = {True: "yes", False: "no", None: "–"}[entry["passes_randomisation"]]
        cells = [number(last["spearman"]), number(last["ssim"]), number(last["top10_overlap"]),
                 number(logit.get("spearman")), number(entry["max_sensitivity"]),
                 "–" if entry["infidelity"] is None else f"{entry['infidelity']:.3g}", verdict]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> None:
    known = faithfulness_methods()
    methods = tuple(args.methods.split(",")) if args.methods else sanity_methods()
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise VitInspectError(f"Unknown method(s) {', '.join(unknown)}; choose from {', '.join(known)}.")
    settings = settings_of(args)
    target, versus = targets(args)  # the prompt, or the class index of --target; checked against each other
    if versus is not None:
        raise VitInspectError("The sanity checks explain one prompt; --versus is not supported with sanity.")
    files = find_images(args.images)
    if not files:
        raise VitInspectError("No images found in the paths given.")
    handle = with_prompt_options(load_model(args.model, weights=args.weights, device=args.device,
                                            model_file=args.model_file), args)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    for path, stem in zip(files, figure_stems(files)):
        picture = load_image(path)
        result = sanity_check(handle, picture, methods, target=target, settings=settings,
                              progress=progress_line(f"{path.name}: {{done}}/{{total}} passes"))
        head = {"image": str(path), "model": handle.name, "weights": Path(handle.weights).name,
                "target": target_record(handle, result.target,
                                        None if result.prompt is None else Prompt(result.prompt)),
                "random_class": class_record(handle, result.random_class),
                "settings": {"seed": settings.seed, "independent": settings.independent,
                             "robustness": None if settings.robustness is None else asdict(settings.robustness),
                             "pass_threshold": PASS_THRESHOLD}}
        named = (f"prompt {result.prompt!r}" if result.prompt is not None
                 else f"{handle.label(result.target)} (class {result.target})")
        if args.json:
            record = result.record()
            print(json.dumps({**head, "methods": record["methods"], "left_out": record["left_out"]}), flush=True)
        else:
            other = head["random_class"]
            print(f"{path.name}: {named}"
                  + (f", random logit: {other['label']} (class {other['index']})" if other else ""))
            print(summary(result) + "\n", flush=True)
        if out:
            rgb = handle.preprocess.apply(picture)[1]
            title = f"{handle.name}, {named}: {path.name}"
            save_png(sanity_plots.cascading_figure(rgb, result, title=f"Cascading randomisation — {title}"),
                     out / f"{stem}_cascading.png")
            save_png(sanity_plots.similarity_figure(result, title=f"Similarity to the trained map — {title}"),
                     out / f"{stem}_similarity.png")
