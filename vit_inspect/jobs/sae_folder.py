"""An SAE trained on a folder of images: the activation pass on an engine, then training from the spilled
tokens (`jobs.sae_train`), then, on held-out images, its quality (`jobs.sae.SAEEvalJob`)."""
from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.handle import ViTHandle
from vit_inspect.core.sae_file import SAEInfo, SparseAutoencoder, save_sae
from vit_inspect.jobs.engine import EngineOptions, Progress
from vit_inspect.jobs.run import run_job
from vit_inspect.jobs.sae import SAEActivationJob, SAEActivationWorker, SAEEvalJob, SAEEvalWorker, SAEQuality
from vit_inspect.jobs.sae_train import TrainOptions, check_buffer, train_sae
from vit_inspect.jobs.workers import absolute_model_file, model_source

MAX_CROPS = 16  # random crops per image an activation pass forwards at most


def train_from_folder(handle: ViTHandle, files: Sequence[Path], layer: int, options: TrainOptions,
                      tokens: str = "all", engine: str = "local", engine_options: EngineOptions = EngineOptions(),
                      spill: str | None = None, model_file: str | None = None,
                      on_images: Progress | None = None, on_steps: Callable[[int, int], None] | None = None,
                      mirror: bool = False, crops: int = 0) -> SparseAutoencoder:
    """An SAE of block `layer`'s output trained on `files` (with `mirror`, on each image's input mirrored left to
    right too: twice the tokens; with `crops` N, on N random square crops of each image too, seeded by
    `options.seed`: see `jobs.sae`; `options.prefix_weight` weighs the prefix tokens' error when `tokens` is
    "all"). The tokens are spilled to `spill` (kept), or to a temporary folder removed
    afterwards; memory holds the model, the SAE and the training buffer (`TrainOptions.buffer_bytes`), never the
    folder's tokens."""
    if not 0 <= layer < handle.depth:
        raise VitInspectError(f"--layer must be a block of {handle.name!r}: 0 to {handle.depth - 1}.")
    if not 0 <= crops <= MAX_CROPS:
        raise VitInspectError(f"--crops must be between 0 and {MAX_CROPS}; got {crops}.")
    check_buffer(options, handle.embed_dim)  # before the activation pass, not after it
    folder = Path(spill) if spill else Path(tempfile.mkdtemp(prefix="vit-inspect-sae-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        model, weights = model_source(handle)
        job = SAEActivationJob(model, layer, str(folder.resolve()), tokens, weights,
                               model_file=absolute_model_file(model_file), mirror=mirror, crops=crops,
                               seed=options.seed)
        started = time.perf_counter()
        stats, _ = run_job(job, files, engine, engine_options, on_images,
                           worker=SAEActivationWorker(handle, layer, tokens, str(folder.resolve()), mirror, crops,
                                                      options.seed))
        pass_seconds = time.perf_counter() - started
        layout = handle.layout()
        per_image = (layout.num_tokens, layout.num_prefix_tokens) if tokens == "all" else None
        result = train_sae(stats.files, handle.embed_dim, stats.tokens, stats.mean, stats.scale, options, on_steps,
                           per_image)
    finally:
        if not spill:
            shutil.rmtree(folder, ignore_errors=True)
    training = {"images": stats.images, "mirrored": mirror, "crops": crops, "tokens_per_epoch": stats.tokens,
                "epochs": options.epochs,
                "batch_tokens": options.batch_tokens, "lr": options.lr, "seed": options.seed,
                "prefix_weight": options.prefix_weight if per_image and per_image[1] else 1.0,
                "buffer_bytes": options.buffer_bytes, "dead_strategy": "AuxK (Gao et al. 2024)",
                "epoch_loss": [round(v, 6) for v in result.epoch_loss], "dead_at_end": result.dead_at_end,
                "activation_pass_seconds": round(pass_seconds, 1),
                "training_seconds": round(time.perf_counter() - started - pass_seconds, 1)}
    info = SAEInfo(model=handle.name, layer=layer, k=options.k, features=options.features, width=handle.embed_dim,
                   tokens=tokens, training_tokens=result.tokens_seen, training=training)
    return SparseAutoencoder(result.W_enc, result.b_enc, result.W_dec, result.b_dec, info,
                             torch.as_tensor(stats.mean, dtype=torch.float32),
                             torch.tensor(stats.scale, dtype=torch.float32))


def evaluate_sae(handle: ViTHandle, sae_path: str | Path, files: Sequence[Path], engine: str = "local",
                 engine_options: EngineOptions = EngineOptions(), layer: int | None = None,
                 model_file: str | None = None, progress: Progress | None = None,
                 sae: SparseAutoencoder | None = None) -> SAEQuality:
    """The quality of the SAE in `sae_path` on `files` (`sae`: the same SAE already loaded, saves a read)."""
    model, weights = model_source(handle)
    job = SAEEvalJob(model, str(Path(sae_path).resolve()), layer, weights, model_file=absolute_model_file(model_file))
    worker = SAEEvalWorker(handle, sae) if sae is not None else None
    quality, _ = run_job(job, files, engine, engine_options, progress, worker=worker)
    return quality


def split_held_out(files: Sequence[Path], held_out: int, seed: int | None = None) -> tuple[list[Path], list[Path]]:
    """(training files, held-out files) of `files` in their order: the last `held_out`, or, with `seed`, the
    `held_out` whose positions are the first of ``numpy.random.default_rng(seed).permutation(len(files))``."""
    if seed is None:
        cut = len(files) - held_out
        return list(files[:cut]), list(files[cut:])
    held = set(np.random.default_rng(seed).permutation(len(files))[:held_out].tolist())
    return [f for i, f in enumerate(files) if i not in held], [f for i, f in enumerate(files) if i in held]


def save_with_metrics(sae: SparseAutoencoder, path: str | Path, quality: SAEQuality | None,
                      selection: str | None = None) -> SparseAutoencoder:
    """`sae` written to `path`, with `quality` (held-out images, chosen as `selection` says) in its metadata
    when given."""
    if quality is not None:
        held_out = quality.as_dict() | ({"selection": selection} if selection else {})
        sae = replace(sae, info=replace(sae.info, metrics={"held_out": held_out}))
    save_sae(sae, path)
    return sae
