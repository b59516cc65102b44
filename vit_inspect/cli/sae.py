"""`vit-inspect sae train|eval|index|features`: top-k sparse autoencoders on one block's output tokens
(docs/sae.md).

`train FOLDER --layer L --features F --k K --out FILE` runs the model over the folder's images (all but the
`--holdout` held out: the last N by name, or N drawn at random with `--holdout-seed`), trains the SAE (then, with
`--kl-steps`, fine-tunes it on the KL of the model with it in place: `jobs.sae_finetune`), measures it on the
held-out images and writes one safetensors file, then its feature index beside it
(`<stem>.index.safetensors`, unless `--no-index`); it prints the file's metadata as JSON. `eval FOLDER --sae FILE` prints the quality on the folder's images (the held-out ones when `--holdout` is
given) as JSON. `index FOLDER --sae FILE` writes the feature index of an SAE over the folder's images (all but
the held-out ones) and prints a summary as JSON. `features IMAGE --sae FILE` prints the image's top
features, over the image or at one patch, with their labels when the index is beside the SAE.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

from vit_inspect.cli.common import engine_flags, progress, progress_line
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import DEFAULT_MODEL
from vit_inspect.core.images import find_images, load_image
from vit_inspect.core.load import load_model
from vit_inspect.core.sae_file import SparseAutoencoder
from vit_inspect.core.sae_index import SAEIndex, index_bytes, index_path, read_index, save_index
from vit_inspect.core.sae_load import load_sae
from vit_inspect.jobs.engine import EngineOptions
from vit_inspect.jobs.sae_finetune import FineTuneOptions, fine_tune_kl
from vit_inspect.jobs.sae_folder import evaluate_sae, save_with_metrics, split_held_out, train_from_folder
from vit_inspect.jobs.sae_index import DEFAULT_CROP, DEFAULT_LABELS, DEFAULT_TOP, build_index
from vit_inspect.jobs.sae_train import TrainOptions
from vit_inspect.passes.sae import image_features

TRAIN_DEFAULTS = TrainOptions(features=1, k=1)
FINE_TUNE_DEFAULTS = FineTuneOptions(steps=1)


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", help="folder of images (sorted by name)")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"timm name, HF id or folder (default {DEFAULT_MODEL})")
    p.add_argument("--weights", help="weights file (.safetensors preferred)")
    p.add_argument("--model-file", metavar="FILE.py:FUNCTION", help="a hand-written ViT (see README)")
    p.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--holdout", type=int, default=0,
                   help="N images of the folder are held out (the last N by name, unless --holdout-seed): train "
                        "skips them, eval uses only them")
    p.add_argument("--holdout-seed", type=int, metavar="S",
                   help="hold out N images drawn at random with seed S instead of the last N (names that sort by "
                        "class, as ImageNet's do, put whole groups of classes last)")
    p.add_argument("--cache", help="folder for the engine's shards (resume) and, in train, the spilled tokens")
    engine_flags(p)


def add_parser(sub) -> None:
    sae = sub.add_parser("sae", help="top-k sparse autoencoders on one block's output: train, eval")
    commands = sae.add_subparsers(dest="sae_command", required=True)
    train = commands.add_parser("train", help="train a top-k SAE on a folder's tokens (Gao et al. 2024)")
    _model_flags(train)
    train.add_argument("--layer", type=int, required=True, help="block whose output (residual stream) it reads")
    train.add_argument("--features", type=int, required=True, help="F, the number of features")
    train.add_argument("--k", type=int, required=True, help="active features per token")
    train.add_argument("--out", required=True, help="the SAE file to write (.safetensors)")
    train.add_argument("--tokens", choices=("all", "patches"), default="all",
                       help="train on every token of the block's output, or on the patch tokens only (default all)")
    train.add_argument("--mirror", action="store_true",
                       help="train on each image mirrored left to right too: twice the tokens, from the same images")
    train.add_argument("--crops", type=int, default=0, metavar="N",
                       help="train on N random square crops of each image too (50-100%% of its shorter side, "
                            "mirrored at random, seeded by --seed; default 0)")
    train.add_argument("--prefix-weight", type=float, default=TRAIN_DEFAULTS.prefix_weight, metavar="W",
                       help="weight of the prefix tokens (class, distillation, registers) in the reconstruction "
                            "loss, the patch tokens' being 1 (default 1). The class token carries the prediction "
                            "to the head: weighting it lowers the KL of the replaced model at the same variance "
                            "explained")
    train.add_argument("--epochs", type=int, default=TRAIN_DEFAULTS.epochs,
                       help=f"passes over the tokens (default {TRAIN_DEFAULTS.epochs})")
    train.add_argument("--lr", type=float, default=TRAIN_DEFAULTS.lr, help=f"Adam (default {TRAIN_DEFAULTS.lr})")
    train.add_argument("--batch-tokens", type=int, default=TRAIN_DEFAULTS.batch_tokens,
                       help=f"tokens per step (default {TRAIN_DEFAULTS.batch_tokens})")
    train.add_argument("--buffer-mib", type=float, default=TRAIN_DEFAULTS.buffer_bytes / 2 ** 20,
                       help="MiB of tokens the shuffle buffer holds (default "
                            f"{TRAIN_DEFAULTS.buffer_bytes // 2 ** 20}; the folder's size does not change it)")
    train.add_argument("--kl-steps", type=int, default=0, metavar="N",
                       help="after training, fine-tune the SAE for N steps on the KL between the model and the model "
                            "with the SAE in place, plus the normalised MSE (Karvonen 2025; default 0: none). Runs "
                            "here, whatever --engine, two forwards and one backward per view")
    train.add_argument("--kl-lr", type=float, default=FINE_TUNE_DEFAULTS.lr,
                       help=f"the fine-tune's Adam learning rate (default {FINE_TUNE_DEFAULTS.lr:g})")
    train.add_argument("--kl-images", type=int, default=FINE_TUNE_DEFAULTS.images, metavar="N",
                       help="images per fine-tune step, each in the views --mirror and --crops give "
                            f"(default {FINE_TUNE_DEFAULTS.images})")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--no-index", action="store_true", help="do not build the feature index after training")
    _index_flags(train)
    train.set_defaults(func=run_train)
    evaluate = commands.add_parser("eval", help="an SAE's quality on a folder: variance explained, L0, dead "
                                                "features, top-1 agreement and KL with the tokens replaced")
    _model_flags(evaluate)
    evaluate.add_argument("--sae", required=True, help="the SAE file (.safetensors, or saev's format)")
    evaluate.add_argument("--layer", type=int, help="the block it reads, for saev files (which do not say)")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object (the default output too)")
    evaluate.set_defaults(func=run_eval)
    index = commands.add_parser("index", help="an SAE's feature index over a folder: each feature's top patches "
                                              "with crops, and the classes where it fires")
    _model_flags(index)
    index.add_argument("--sae", required=True, help="the SAE file (.safetensors, or saev's format)")
    index.add_argument("--layer", type=int, help="the block it reads, for saev files (which do not say)")
    index.add_argument("--out", help="the index file to write (default: <SAE stem>.index.safetensors beside it)")
    _index_flags(index)
    index.set_defaults(func=run_index)
    features = commands.add_parser("features", help="an image's top SAE features, over the image or at one patch")
    features.add_argument("image", help="an image file")
    features.add_argument("--sae", required=True, help="the SAE file (.safetensors, or saev's format)")
    features.add_argument("--layer", type=int, help="the block it reads, for saev files (which do not say)")
    features.add_argument("--patch", type=_patch, metavar="ROW,COL",
                          help="rank the features at this patch of the model's grid (default: over the image)")
    features.add_argument("--top", type=int, default=10, help="features shown (default 10)")
    features.add_argument("--index", help="the feature index for the labels (default: the one beside the SAE)")
    features.add_argument("--model", default=DEFAULT_MODEL, help=f"timm name, HF id or folder (default {DEFAULT_MODEL})")
    features.add_argument("--weights", help="weights file (.safetensors preferred)")
    features.add_argument("--model-file", metavar="FILE.py:FUNCTION", help="a hand-written ViT (see README)")
    features.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available)")
    features.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    features.set_defaults(func=run_features)


def _index_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index-top", type=int, default=DEFAULT_TOP,
                   help=f"top-activating patches kept per feature (default {DEFAULT_TOP})")
    p.add_argument("--index-crop", type=int, default=DEFAULT_CROP,
                   help=f"side in pixels of each patch's crop of the preprocessed image (default {DEFAULT_CROP})")
    p.add_argument("--index-labels", type=int, default=DEFAULT_LABELS,
                   help=f"classes in each feature's label (default {DEFAULT_LABELS})")


def _patch(text: str) -> tuple[int, int]:
    try:
        row, col = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("--patch takes ROW,COL, two integers") from None
    return row, col


def _split(args: argparse.Namespace) -> tuple[list, list]:
    files = find_images([args.folder])
    if not files:
        raise VitInspectError(f"No images found in {args.folder!r}.")
    if not 0 <= args.holdout < len(files):
        raise VitInspectError(f"--holdout must be between 0 and {len(files) - 1} (the folder has {len(files)} "
                              "images).")
    if args.holdout_seed is not None and args.holdout_seed < 0:
        raise VitInspectError(f"--holdout-seed must be 0 or more; got {args.holdout_seed}.")
    return split_held_out(files, args.holdout, args.holdout_seed)


def _held_out_words(args: argparse.Namespace) -> str:
    """How the held-out images were chosen, for the SAE's metadata."""
    if args.holdout_seed is None:
        return f"the last {args.holdout} by file name"
    return f"{args.holdout} drawn at random with seed {args.holdout_seed}"


def _engine(args: argparse.Namespace, job: str) -> EngineOptions:
    out = os.path.join(args.cache, job) if args.cache else None
    return EngineOptions(batch_size=args.batch_size, shard_size=args.shard_size, out=out,
                         ray_address=args.ray_address, concurrency=args.concurrency, num_gpus=args.num_gpus)


def _writable_folder(path: str, flag: str) -> None:
    """A sentence now, before any work, when the file `path` cannot be written: its folder is missing or read-only."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise VitInspectError(f"{flag}: the folder {folder!r} does not exist; create it first.")
    if not os.access(folder, os.W_OK):
        raise VitInspectError(f"{flag}: the folder {folder!r} cannot be written to.")


def run_train(args: argparse.Namespace) -> None:
    _writable_folder(args.out, "--out")
    train_files, held_out = _split(args)
    if not 0 < args.buffer_mib < math.inf:
        raise VitInspectError(f"--buffer-mib must be a positive number of MiB; got {args.buffer_mib:g}.")
    options = TrainOptions(features=args.features, k=args.k, epochs=args.epochs, batch_tokens=args.batch_tokens,
                           lr=args.lr, buffer_bytes=int(args.buffer_mib * 2 ** 20), seed=args.seed,
                           prefix_weight=args.prefix_weight)
    fine_tune = FineTuneOptions(args.kl_steps, args.kl_lr, args.kl_images, seed=args.seed) if args.kl_steps else None
    if fine_tune is not None:
        fine_tune.check_images(len(train_files))
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    spill = os.path.join(args.cache, "tokens") if args.cache else None
    sae = train_from_folder(handle, train_files, args.layer, options, args.tokens, args.engine,
                            _engine(args, "train"), spill, args.model_file, progress,
                            progress_line("{done}/{total} training steps"), mirror=args.mirror, crops=args.crops)
    if args.kl_steps:
        sae = fine_tune_kl(handle, sae, train_files, fine_tune, args.mirror, args.crops, args.seed,
                           progress_line("{done}/{total} fine-tune steps"))
    save_with_metrics(sae, args.out, None)
    quality = None
    if held_out:
        quality = evaluate_sae(handle, args.out, held_out, args.engine, _engine(args, "holdout"),
                               model_file=args.model_file, progress=progress, sae=sae)
    sae = save_with_metrics(sae, args.out, quality, _held_out_words(args))
    if not args.no_index:
        _write_index(args, handle, sae, args.out, train_files, index_path(args.out))
    print(sae.info.to_json())


def _write_index(args: argparse.Namespace, handle, sae: SparseAutoencoder, sae_path: str, files: list,
                 out) -> dict:
    """Build and write the feature index of `sae` over `files`; prints where, returns a summary."""
    index = build_index(handle, sae, sae_path, files, args.index_top, args.index_crop, args.index_labels,
                        args.engine, _engine(args, "index"), args.layer, args.model_file, progress)
    save_index(index, out)
    summary = {"index": os.path.basename(out), "features": index.features, "top": index.top,
               "crop": args.index_crop, "bytes": index_bytes(index.features, index.top, args.index_crop,
                                                             args.index_labels),
               "live_features": int((index.image[:, 0] >= 0).sum()), **index.built_from}
    print(f"wrote the feature index {summary['index']} ({summary['bytes']:,} bytes of tensors)", file=sys.stderr)
    return summary


def run_index(args: argparse.Namespace) -> None:
    _writable_folder(args.out or index_path(args.sae), "--out")
    files, _ = _split(args)
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    sae = load_sae(args.sae, layer=args.layer, model=handle.name)
    summary = _write_index(args, handle, sae, args.sae, files, args.out or index_path(args.sae))
    print(json.dumps(summary))


def _labels(args: argparse.Namespace, sae: SparseAutoencoder) -> SAEIndex | None:
    """The index for the labels: `--index`, or the one beside the SAE when there is one; a note when unusable."""
    path = args.index or index_path(args.sae)
    if not args.index and not os.path.isfile(path):
        return None
    try:
        return read_index(path, sae)
    except VitInspectError as exc:
        print(f"note: no labels: {exc}", file=sys.stderr)
        return None


def run_features(args: argparse.Namespace) -> None:
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    sae = load_sae(args.sae, layer=args.layer, model=handle.name)
    index = _labels(args, sae)
    rgb = handle.preprocess.apply(load_image(args.image))[1]
    found = image_features(handle, sae, rgb, args.top, args.patch, index)
    record = {"model": handle.name, "image": os.path.basename(args.image), "sae": os.path.basename(args.sae),
              "layer": found.layer, "features": sae.info.features, "k": sae.info.k,
              "patch": list(args.patch) if args.patch else None,
              "index": os.path.basename(str(args.index or index_path(args.sae))) if index is not None else None,
              "top": [f.as_dict() for f in found.features]}
    if args.json:
        print(json.dumps(record))
        return
    where = f"at patch {args.patch}" if args.patch else "summed over the patches"
    print(f"{handle.name} · {record['image']} · block {found.layer} · {record['sae']}: activation {where}")
    print(f"{'feature':>8} {'activation':>11} {'peak':>8}  {'at':>8}  label")
    for f in found.features:
        print(f"{f.feature:>8} {f.activation:>11.3f} {f.peak:>8.3f}  {str(f.peak_patch):>8}  {f.label}")


def run_eval(args: argparse.Namespace) -> None:
    _, held_out = _split(args)
    files = held_out or find_images([args.folder])
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    sae = load_sae(args.sae, layer=args.layer, model=handle.name)
    quality = evaluate_sae(handle, args.sae, files, args.engine, _engine(args, "eval"), args.layer,
                           args.model_file, progress, sae=sae)
    for name, reason in quality.skipped:
        print(f"skipped {name}: {reason}", file=sys.stderr)
    print(json.dumps({"sae": os.path.basename(args.sae), "layer": sae.info.layer, "k": sae.info.k,
                      "features": sae.info.features, **quality.as_dict()}))
