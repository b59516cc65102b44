"""`vit-inspect sae train|eval`: top-k sparse autoencoders on one block's output tokens (docs/sae.md).

`train FOLDER --layer L --features F --k K --out FILE` runs the model over the folder's images (all but the
last `--holdout`), trains the SAE, measures it on the held-out images and writes one safetensors file; it
prints the file's metadata as JSON. `eval FOLDER --sae FILE` prints the quality on the folder's images (the
last `--holdout` of them when given) as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from vit_inspect.cli.common import engine_flags, progress, progress_line
from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import DEFAULT_MODEL
from vit_inspect.core.images import find_images
from vit_inspect.core.load import load_model
from vit_inspect.core.sae_load import load_sae
from vit_inspect.jobs.engine import EngineOptions
from vit_inspect.jobs.sae_folder import evaluate_sae, save_with_metrics, train_from_folder
from vit_inspect.jobs.sae_train import TrainOptions

TRAIN_DEFAULTS = TrainOptions(features=1, k=1)


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", help="folder of images (sorted by name)")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"timm name, HF id or folder (default {DEFAULT_MODEL})")
    p.add_argument("--weights", help="weights file (.safetensors preferred)")
    p.add_argument("--model-file", metavar="FILE.py:FUNCTION", help="a hand-written ViT (see README)")
    p.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available)")
    p.add_argument("--holdout", type=int, default=0,
                   help="the last N images of the folder are held out: train skips them, eval uses only them")
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
    train.add_argument("--epochs", type=int, default=TRAIN_DEFAULTS.epochs,
                       help=f"passes over the tokens (default {TRAIN_DEFAULTS.epochs})")
    train.add_argument("--lr", type=float, default=TRAIN_DEFAULTS.lr, help=f"Adam (default {TRAIN_DEFAULTS.lr})")
    train.add_argument("--batch-tokens", type=int, default=TRAIN_DEFAULTS.batch_tokens,
                       help=f"tokens per step (default {TRAIN_DEFAULTS.batch_tokens})")
    train.add_argument("--buffer-mib", type=float, default=TRAIN_DEFAULTS.buffer_bytes / 2 ** 20,
                       help="MiB of tokens the shuffle buffer holds (default "
                            f"{TRAIN_DEFAULTS.buffer_bytes // 2 ** 20}; the folder's size does not change it)")
    train.add_argument("--seed", type=int, default=0)
    train.set_defaults(func=run_train)
    evaluate = commands.add_parser("eval", help="an SAE's quality on a folder: variance explained, L0, dead "
                                                "features, top-1 agreement and KL with the tokens replaced")
    _model_flags(evaluate)
    evaluate.add_argument("--sae", required=True, help="the SAE file (.safetensors, or saev's format)")
    evaluate.add_argument("--layer", type=int, help="the block it reads, for saev files (which do not say)")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object (the default output too)")
    evaluate.set_defaults(func=run_eval)


def _split(args: argparse.Namespace) -> tuple[list, list]:
    files = find_images([args.folder])
    if not files:
        raise VitInspectError(f"No images found in {args.folder!r}.")
    if not 0 <= args.holdout < len(files):
        raise VitInspectError(f"--holdout must be between 0 and {len(files) - 1} (the folder has {len(files)} "
                              "images).")
    cut = len(files) - args.holdout
    return files[:cut], files[cut:]


def _engine(args: argparse.Namespace, job: str) -> EngineOptions:
    out = os.path.join(args.cache, job) if args.cache else None
    return EngineOptions(batch_size=args.batch_size, shard_size=args.shard_size, out=out,
                         ray_address=args.ray_address, concurrency=args.concurrency, num_gpus=args.num_gpus)


def run_train(args: argparse.Namespace) -> None:
    train_files, held_out = _split(args)
    options = TrainOptions(features=args.features, k=args.k, epochs=args.epochs, batch_tokens=args.batch_tokens,
                           lr=args.lr, buffer_bytes=int(args.buffer_mib * 2 ** 20), seed=args.seed)
    handle = load_model(args.model, weights=args.weights, device=args.device, model_file=args.model_file)
    spill = os.path.join(args.cache, "tokens") if args.cache else None
    sae = train_from_folder(handle, train_files, args.layer, options, args.tokens, args.engine,
                            _engine(args, "train"), spill, args.model_file, progress,
                            progress_line("{done}/{total} training steps"))
    save_with_metrics(sae, args.out, None)
    quality = None
    if held_out:
        quality = evaluate_sae(handle, args.out, held_out, args.engine, _engine(args, "holdout"),
                               model_file=args.model_file, progress=progress, sae=sae)
    sae = save_with_metrics(sae, args.out, quality)
    print(sae.info.to_json())


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
