"""Training a top-k SAE (Gao et al. 2024, arXiv:2406.04093) on tokens spilled to disk, streamed through a
buffer of fixed size in bytes.

Loss (their Sec. 2.1 and A.2): the normalised MSE Σ w‖x - x̂‖² / Σ w‖x‖² of the batch (x centred and scaled,
see `jobs.sae.ActivationStats`; w = 1 for every token unless `prefix_weight` weights the prefix tokens: the class,
distillation and register tokens), plus α = 1/32 times the AuxK loss of the k_aux most active dead latents (`analysis.sae.
auxk_loss`): a latent is dead when it has not fired for `dead_tokens` tokens. Adam; W_enc starts as W_dec's
transpose, W_dec's rows have unit norm after every step, and the part of their gradient parallel to them is
removed first (Bricken et al. 2023); the learning rate decays linearly to 0 over the last fifth of the steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from vit_inspect.analysis.sae import auxk_loss, decode_sparse, pre_activations, top_k
from vit_inspect.core.errors import VitInspectError

AUXK_COEFFICIENT = 1 / 32  # α of Gao et al. 2024, Sec. A.2
GAO_DEAD_TOKENS = 10_000_000  # tokens without firing after which Gao et al. call a latent dead
MAX_PREFIX_WEIGHT = 1000.0


@dataclass(frozen=True)
class TrainOptions:
    """How an SAE is trained; the numbers, not the engine."""

    features: int  # F, dictionary size
    k: int  # active features per token
    epochs: int = 12  # passes over the spilled tokens
    batch_tokens: int = 1024  # tokens per Adam step
    lr: float = 1e-3  # Adam's learning rate before the final decay
    buffer_bytes: int = 64 * 2 ** 20  # float32 tokens the shuffle buffer holds at most
    k_aux: int | None = None  # dead latents in the AuxK loss (None: d / 2, Gao et al.)
    dead_tokens: int | None = None  # tokens without firing that make a latent dead (None: half an epoch, ≤ 10M)
    seed: int = 0
    prefix_weight: float = 1.0  # w of the prefix tokens (class, distillation, registers) in the loss; patches 1

    def __post_init__(self) -> None:
        if not 0 < self.k <= self.features:
            raise VitInspectError(f"--k must be between 1 and --features ({self.features}); got {self.k}.")
        if min(self.epochs, self.batch_tokens) < 1 or not 0 < self.lr < math.inf:
            raise VitInspectError("--epochs, the batch size and the learning rate must be positive.")
        if self.buffer_bytes < 1:
            raise VitInspectError("--buffer-mib must be positive.")
        if not 0 < self.prefix_weight <= MAX_PREFIX_WEIGHT:
            raise VitInspectError(f"--prefix-weight must be above 0 and at most {MAX_PREFIX_WEIGHT:g}; "
                                  f"got {self.prefix_weight:g}.")


@dataclass(frozen=True)
class TrainResult:
    """The trained tensors (normalised units) and how the loss went."""

    W_enc: torch.Tensor  # (d, F)
    b_enc: torch.Tensor  # (F,)
    W_dec: torch.Tensor  # (F, d)
    b_dec: torch.Tensor  # (d,)
    epoch_loss: tuple[float, ...]  # mean normalised MSE of each epoch, weighted (without the AuxK term)
    dead_at_end: float  # fraction of latents dead (by `dead_tokens`) when training stopped
    tokens_seen: int


def check_buffer(options: TrainOptions, width: int) -> None:
    """A sentence when the shuffle buffer cannot hold two batches of `width`-wide tokens (and their weights): its
    bytes are the bound the training keeps, so a batch may not outgrow it."""
    needed = 2 * options.batch_tokens * 4 * (width + 1)
    if needed > options.buffer_bytes:
        raise VitInspectError(f"The shuffle buffer (--buffer-mib {options.buffer_bytes / 2 ** 20:g}) must hold two "
                              f"batches of {options.batch_tokens:,} tokens of width {width}: at least "
                              f"{math.ceil(needed / 2 ** 20):,} MiB, or fewer --batch-tokens.")


def read_rows(path: Path, width: int) -> np.ndarray:
    """(n, d) float32 tokens of one spilled `.npy` file, memory-mapped (nothing is unpickled)."""
    rows = np.load(path, mmap_mode="r", allow_pickle=False)
    if rows.ndim != 2 or rows.shape[1] != width or rows.dtype != np.float32:
        raise VitInspectError(f"{path.name!r} is not a file of {width}-wide float32 tokens.")
    return rows


def shuffled_batches(files: Sequence[Path], width: int, batch: int, buffer_bytes: int, rng: np.random.Generator,
                     position_weights: np.ndarray | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """((batch, d) float32 tokens, (batch,) float32 weights) of every token of `files` once, shuffled through a
    buffer of at most `buffer_bytes` (files in random order; the buffer is filled, permuted, and its tail emitted
    until half is left room for the next piece). A token's weight is ``position_weights[j % n]`` for row j of its
    file (n = len(position_weights): every file holds whole images of n tokens, and the buffer holds each
    token's weight beside it), or 1. Memory: the buffer, whatever the number of files. A last short batch is
    emitted too."""
    weighted = position_weights is not None
    capacity = max(2 * batch, buffer_bytes // (4 * (width + weighted)))
    try:  # the tokens, then their weight when weighted
        buffer = np.empty((capacity, width + weighted), np.float32)
    except (MemoryError, ValueError):
        raise VitInspectError(f"The shuffle buffer of {buffer_bytes / 2 ** 20:,.0f} MiB could not be allocated; "
                              "give a smaller --buffer-mib.") from None
    held = 0

    def emitted(rows: slice) -> tuple[np.ndarray, np.ndarray]:
        tokens = buffer[rows, :width].copy()
        return tokens, buffer[rows, width].copy() if weighted else np.ones(len(tokens), np.float32)

    def drain(limit: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:  # permute, emit until ≤ `limit` are held
        nonlocal held
        buffer[:held] = buffer[rng.permutation(held)]
        while held > limit and held >= batch:
            held -= batch
            yield emitted(slice(held, held + batch))
        if limit == 0 and held:
            yield emitted(slice(0, held))
            held = 0

    for index in rng.permutation(len(files)):
        rows = read_rows(files[index], width)
        if weighted and len(rows) % len(position_weights):
            raise VitInspectError(f"{files[index].name!r} does not hold whole images of {len(position_weights)} "
                                  "tokens.")
        for start in range(0, len(rows), capacity // 2):
            piece = rows[start:start + capacity // 2]
            if held + len(piece) > capacity:
                yield from drain(capacity - len(piece))
            buffer[held:held + len(piece), :width] = piece
            if weighted:
                buffer[held:held + len(piece), width] = position_weights[
                    np.arange(start, start + len(piece)) % len(position_weights)]
            held += len(piece)
    yield from drain(0)


def unit_norm_step(optimiser: torch.optim.Optimizer, W_dec: torch.Tensor, lr: float, step: int, total: int
                   ) -> None:
    """One optimiser step of an SAE whose gradients are set: the part of W_dec's gradient along each of its rows is
    dropped first and the rows are put back at unit norm after (Bricken et al. 2023); from step 0.8·`total` on, the
    learning rate decays linearly from `lr` to 0 at `total`."""
    with torch.no_grad():
        W_dec.grad -= (W_dec.grad * W_dec).sum(1, keepdim=True) * W_dec
    decay_from = int(0.8 * total)
    if step >= decay_from:
        for group in optimiser.param_groups:
            group["lr"] = lr * max(0.0, (total - step) / max(1, total - decay_from))
    optimiser.step()
    with torch.no_grad():
        W_dec /= W_dec.norm(dim=1, keepdim=True).clamp_min(1e-12)


def train_sae(files: Sequence[Path], width: int, tokens: int, mean: np.ndarray, scale: float,
              options: TrainOptions, progress: Callable[[int, int], None] | None = None,
              layout: tuple[int, int] | None = None) -> TrainResult:
    """Train on the (n, d) tokens of `files` (`tokens` of them), normalised as (x - mean) / scale. `layout`
    (tokens per image, prefix tokens first among them) places the prefix tokens `options.prefix_weight` weights;
    without it every token weighs 1."""
    check_buffer(options, width)
    torch.manual_seed(options.seed)
    rng = np.random.default_rng(options.seed)
    f, d = options.features, width
    k_aux = options.k_aux or max(1, d // 2)
    dead_tokens = options.dead_tokens or max(1, min(GAO_DEAD_TOKENS, tokens // 2))
    W_dec = torch.randn(f, d)
    W_dec /= W_dec.norm(dim=1, keepdim=True)
    W_dec = W_dec.requires_grad_()
    W_enc = W_dec.detach().T.clone().requires_grad_()
    b_enc = torch.zeros(f, requires_grad=True)
    b_dec = torch.zeros(d, requires_grad=True)
    optimiser = torch.optim.Adam([W_enc, b_enc, W_dec, b_dec], lr=options.lr)
    steps_per_epoch = max(1, math.ceil(tokens / options.batch_tokens))
    total = steps_per_epoch * options.epochs
    mean_t, since_fired = torch.as_tensor(mean, dtype=torch.float32), torch.zeros(f, dtype=torch.long)
    step, seen, epoch_loss = 0, 0, []
    position_weights = None
    if layout is not None and layout[1] and options.prefix_weight != 1:
        position_weights = np.ones(layout[0], np.float32)
        position_weights[:layout[1]] = options.prefix_weight
    for _ in range(options.epochs):
        loss_sum, batches = 0.0, 0
        for rows, weights in shuffled_batches(files, d, options.batch_tokens, options.buffer_bytes, rng,
                                              position_weights):
            x = (torch.from_numpy(rows) - mean_t) / scale  # (B, d)
            w = torch.from_numpy(weights)[:, None]  # (B, 1)
            pre = pre_activations(x, W_enc, b_enc, b_dec)  # (B, F)
            values, indices = top_k(pre, options.k)  # (B, k) each
            x_hat = decode_sparse(values, indices, W_dec, b_dec)  # (B, d)
            mse = (w * (x - x_hat) ** 2).sum() / (w * x ** 2).sum().clamp_min(1e-12)
            fired = torch.zeros(f, dtype=torch.bool)
            fired[indices[values > 0]] = True
            since_fired = torch.where(fired, 0, since_fired + len(x))
            dead = since_fired > dead_tokens
            loss = mse + AUXK_COEFFICIENT * auxk_loss((x - x_hat).detach(), pre, dead, W_dec, k_aux)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            unit_norm_step(optimiser, W_dec, options.lr, step, total)
            loss_sum, batches, step, seen = loss_sum + float(mse.detach()), batches + 1, step + 1, seen + len(x)
            if progress is not None:
                progress(min(step, total), total)
        epoch_loss.append(loss_sum / max(batches, 1))
    return TrainResult(W_enc.detach(), b_enc.detach(), W_dec.detach(), b_dec.detach(), tuple(epoch_loss),
                       float((since_fired > dead_tokens).double().mean()), seen)
