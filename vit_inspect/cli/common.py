"""What every command shares: model and engine options, progress lines and PNG files."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import DEFAULT_MODEL, ViTHandle
from vit_inspect.jobs.engine import ENGINES, EngineOptions
from vit_inspect.plots import canvas
from vit_inspect.studies.robustness import RobustnessSettings


def model_options(p: argparse.ArgumentParser,
                  out_help: str = "folder for the PNG figures (and the shards of a folder-level job)") -> None:
    """Flags shared by every single-model command: which model, its weights, the device, the output folder."""
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"timm name, HF id or folder (default {DEFAULT_MODEL})")
    p.add_argument("--weights", help="weights file (.safetensors preferred, .pth read with weights_only)")
    p.add_argument("--model-file", metavar="FILE.py:FUNCTION",
                   help="a hand-written ViT: imports FILE.py (runs its code) and calls FUNCTION() for "
                        "(model, ModuleSpec); replaces --model (see README, 'Your own ViT')")
    p.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--out", help=out_help)


def prompt_options(p: argparse.ArgumentParser) -> None:
    """Flags of a text target (OpenCLIP models, --model open_clip:ARCH[:TAG]): the prompt, a versus prompt and
    the zero-shot list."""
    p.add_argument("--prompt", help="explain this text prompt instead of a class (OpenCLIP models): every gradient "
                                    "map explains the cosine similarity of the image and the prompt")
    p.add_argument("--versus", help="with --prompt: explain the prompt versus this one (the difference of the two "
                                    "similarities)")
    p.add_argument("--zero-shot", metavar="LABELS", help="OpenCLIP: the zero-shot labels, comma-separated or a text "
                   "file with one per line (default: the 1000 ImageNet classes with OpenAI's templates, slow on a CPU)")
    p.add_argument("--templates", help="OpenCLIP: '|'-separated templates for --zero-shot labels, each with one {} "
                                       "(default 'a photo of a {}.'; '{}' uses each label as it is)")


def with_prompt_options(handle: ViTHandle, args: argparse.Namespace) -> ViTHandle:
    """``handle`` with the zero-shot list of --zero-shot/--templates (OpenCLIP models only)."""
    if getattr(args, "zero_shot", None) is None and getattr(args, "templates", None) is None:
        return handle
    from vit_inspect.core.open_clip_models import with_zero_shot

    from vit_inspect.core.prompts import read_labels

    labels = None if args.zero_shot is None else read_labels(args.zero_shot)
    templates = None if args.templates is None else args.templates.split("|")
    return with_zero_shot(handle, labels, templates)


def targets(args: argparse.Namespace) -> tuple[object, object]:
    """(target, contrast) of a command: --prompt/--versus, or the class indices --target/--contrast."""
    prompt, versus = getattr(args, "prompt", None), getattr(args, "versus", None)
    if versus is not None and prompt is None:
        raise VitInspectError("--versus needs --prompt: give the prompt it is compared with.")
    if prompt is not None and (getattr(args, "target", None) is not None or getattr(args, "contrast", None) is not None):
        raise VitInspectError("--prompt replaces --target and --contrast; give one or the other.")
    if prompt is not None:
        return prompt, versus
    return getattr(args, "target", None), getattr(args, "contrast", None)


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


def engine_options(args: argparse.Namespace, batch_size: int | None = None) -> EngineOptions:
    """The engine flags of a folder-level command (see `engine_flags`); `batch_size`: images per worker
    call when the command's own --batch-size means something else."""
    return EngineOptions(batch_size=batch_size or args.batch_size, shard_size=args.shard_size, out=args.out,
                         ray_address=args.ray_address, concurrency=args.concurrency, num_gpus=args.num_gpus)


def robustness_flags(p: argparse.ArgumentParser, when: str = "") -> None:
    """The perturbation flags of max-sensitivity and infidelity (`studies.robustness.RobustnessSettings`);
    `when` starts each help text (e.g. "with --robustness: ")."""
    defaults = RobustnessSettings()
    p.add_argument("--radius", type=float, default=defaults.radius,
                   help=f"{when}max-sensitivity: L-inf radius of the input noise on the 0..1 pixel scale "
                        f"(default {defaults.radius}, about 5 grey levels)")
    p.add_argument("--samples", type=int, default=defaults.sensitivity_samples,
                   help=f"{when}max-sensitivity: noisy inputs per image (default {defaults.sensitivity_samples})")
    p.add_argument("--removals", type=int, default=defaults.infidelity_samples,
                   help=f"{when}infidelity: random patch removals per image (default {defaults.infidelity_samples}, "
                        f"each patch removed with probability {defaults.removal_probability})")


def robustness_settings(args: argparse.Namespace) -> RobustnessSettings:
    """The `robustness_flags` (and --seed) as settings; a sentence for a number out of range."""
    try:
        return RobustnessSettings(radius=args.radius, sensitivity_samples=args.samples,
                                  infidelity_samples=args.removals, seed=args.seed)
    except ValueError as exc:
        raise VitInspectError(f"--radius, --samples or --removals: {exc}.") from None


def save_png(fig, path: Path) -> None:
    """A matplotlib figure as a PNG file; the figure is cleared afterwards, written or not."""
    try:
        path.write_bytes(canvas.figure_to_png(fig))
    finally:
        fig.clear()


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


class _ProgressLine:
    open = False  # a progress line on a terminal is being rewritten and has not been ended yet


def progress_line(template: str = "{done}/{total} images"):
    """A progress callback (done, total) on stderr. On a terminal it rewrites one line, ending it when
    done == total; anywhere else (a log file, a pipe, CI) each update is a line of its own."""
    def progress(done: int, total: int) -> None:
        text = template.format(done=done, total=total)
        if not sys.stderr.isatty():
            print(text, file=sys.stderr, flush=True)
            return
        _ProgressLine.open = done < total
        print("\r" + text, end="" if done < total else "\n", file=sys.stderr, flush=True)
    return progress


def end_progress_line() -> None:
    """End a terminal's progress line left open (a command that failed half-way), so that what is printed
    next starts a line of its own."""
    if _ProgressLine.open:
        print(file=sys.stderr, flush=True)
        _ProgressLine.open = False


progress = progress_line()  # "3/10 images"
