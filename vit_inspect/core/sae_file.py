"""A top-k sparse autoencoder's weights and what it was trained on, as one safetensors file.

The file holds the tensors `W_enc` (d, F), `b_enc` (F), `W_dec` (F, d), `b_dec` (d), and optionally
`input_mean` (d) and `input_scale` (a scalar or d), all float32; its header's `__metadata__` holds one
JSON string under the key "vit_inspect.sae" (model name, layer, k, F, d, the tokens trained on, the number
of training tokens, the metrics). The encoder and decoder these tensors define are in `analysis.sae`.

Files are untrusted: the header is read and every name, dtype and shape checked against the metadata
before a tensor is loaded, and nothing in the file is ever executed.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vit_inspect.core.errors import WeightsError
from vit_inspect.core.weights import check_finite, check_safetensors_header

METADATA_KEY = "vit_inspect.sae"
TOKEN_SETS = ("all", "patches")  # every token of the block's output, or the patch tokens only
MAX_WIDTH = 2 ** 22  # features or model width a file may declare: 4M features of 1024 dims is 32 GB already
MAX_SAE_BYTES = 2 ** 32  # tensor bytes a file may hold (4 GiB)


@dataclass(frozen=True)
class SAEInfo:
    """What an SAE reads and how it was made (the file's JSON metadata)."""

    model: str  # the model it was trained on, as `load_model` names it
    layer: int  # index of the block whose output (the residual stream) it reads, from 0
    k: int  # active features per token (TopK_k)
    features: int  # F, the dictionary size
    width: int  # d, the model's embedding width
    tokens: str = "all"  # the tokens it was trained on and replaces: "all" or "patches" (prefix tokens left alone)
    training_tokens: int = 0  # tokens seen in training (counting repeats over epochs)
    training: dict = field(default_factory=dict)  # how it was trained (epochs, seed, images, losses ...)
    metrics: dict = field(default_factory=dict)  # quality measured after training (see `analysis.sae`)
    source: str = "vit_inspect"  # "vit_inspect", or the format it was converted from ("saev")

    def to_json(self) -> str:
        return json.dumps({"model": self.model, "layer": self.layer, "k": self.k, "F": self.features,
                           "d": self.width, "tokens": self.tokens, "training_tokens": self.training_tokens,
                           "training": self.training, "metrics": self.metrics, "source": self.source})


@dataclass(frozen=True, eq=False)
class SparseAutoencoder:
    """A top-k SAE's tensors (float32, on the CPU unless moved) with its `SAEInfo`."""

    W_enc: torch.Tensor  # (d, F)
    b_enc: torch.Tensor  # (F,)
    W_dec: torch.Tensor  # (F, d); each row is one feature's direction in the residual stream
    b_dec: torch.Tensor  # (d,)
    info: SAEInfo
    input_mean: torch.Tensor | None = None  # (d,) subtracted from a token before it is encoded
    input_scale: torch.Tensor | None = None  # () or (d,) the centred token is divided by

    def tensors(self) -> dict[str, torch.Tensor]:
        named = {"W_enc": self.W_enc, "b_enc": self.b_enc, "W_dec": self.W_dec, "b_dec": self.b_dec,
                 "input_mean": self.input_mean, "input_scale": self.input_scale}
        return {name: t for name, t in named.items() if t is not None}

    def to(self, device: torch.device | str) -> SparseAutoencoder:
        moved = {name: t.to(device) for name, t in self.tensors().items()}
        return SparseAutoencoder(info=self.info, **moved)


def expected_shapes(info: SAEInfo) -> dict[str, tuple[tuple[int, ...], ...]]:
    """The shapes each tensor may have for `info` (a name absent here may not be in the file)."""
    d, f = info.width, info.features
    return {"W_enc": ((d, f),), "b_enc": ((f,),), "W_dec": ((f, d),), "b_dec": ((d,),),
            "input_mean": ((d,),), "input_scale": ((), (1,), (d,))}


def check_info(info: SAEInfo, name: str) -> None:
    """WeightsError when the metadata's numbers are out of range."""
    if not (0 < info.width <= MAX_WIDTH and 0 < info.features <= MAX_WIDTH):
        raise WeightsError(f"{name!r} declares {info.features} features of width {info.width}; both must be "
                           f"between 1 and {MAX_WIDTH:,}.")
    if not 0 < info.k <= info.features:
        raise WeightsError(f"{name!r} declares k = {info.k} for {info.features} features; k must be 1 to F.")
    if info.layer < 0:
        raise WeightsError(f"{name!r} declares block {info.layer}; blocks count from 0.")
    if info.tokens not in TOKEN_SETS:
        raise WeightsError(f"{name!r} was trained on tokens {info.tokens!r}; this tool knows {TOKEN_SETS}.")


def save_sae(sae: SparseAutoencoder, path: str | os.PathLike) -> None:
    """Write `sae` as one safetensors file (tensors float32 and contiguous, metadata in the header)."""
    from safetensors.torch import save_file

    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in sae.tensors().items()}
    save_file(tensors, str(path), metadata={METADATA_KEY: sae.info.to_json()})


def read_header(path: Path) -> tuple[dict[str, Any], SAEInfo]:
    """(tensor entries, metadata) of an SAE file, from its header alone; WeightsError for anything else."""
    check_safetensors_header(path)
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    raw = (header.get("__metadata__") or {}).get(METADATA_KEY) if isinstance(header.get("__metadata__"), dict) else None
    if not isinstance(raw, str):
        raise WeightsError(f"{path.name!r} is a safetensors file but not a vit_inspect SAE (its header has no "
                           f"{METADATA_KEY!r} metadata).", public="This safetensors file is not an SAE file.")
    try:
        meta = json.loads(raw)
        info = SAEInfo(model=str(meta["model"]), layer=int(meta["layer"]), k=int(meta["k"]),
                       features=int(meta["F"]), width=int(meta["d"]), tokens=str(meta.get("tokens", "all")),
                       training_tokens=int(meta.get("training_tokens", 0)),
                       training=dict(meta.get("training") or {}), metrics=dict(meta.get("metrics") or {}),
                       source=str(meta.get("source", "vit_inspect")))
    except (ValueError, KeyError, TypeError):
        raise WeightsError(f"{path.name!r} has damaged SAE metadata (model, layer, k, F and d are required).",
                           public="The SAE file's metadata is damaged.") from None
    check_info(info, path.name)
    return {k: v for k, v in header.items() if k != "__metadata__"}, info


def check_entries(entries: dict[str, Any], info: SAEInfo, name: str) -> None:
    """Names, dtypes and shapes of the tensors listed against those `info` implies, before any is read."""
    shapes = expected_shapes(info)
    missing = sorted({"W_enc", "b_enc", "W_dec", "b_dec"} - set(entries))
    unexpected = sorted(set(entries) - set(shapes))
    if missing or unexpected:
        raise WeightsError(f"{name!r} is not a top-k SAE file: " + "; ".join(
            part for part in (missing and f"missing {', '.join(missing)}",
                              unexpected and f"unexpected {', '.join(unexpected)}") if part) + ".")
    total = 0
    for key in sorted(entries, key=list(shapes).index):  # in the format's order: W_enc, b_enc, W_dec, ...
        entry = entries[key]
        shape = tuple(entry.get("shape", ())) if isinstance(entry, dict) else None
        if shape not in shapes[key]:
            raise WeightsError(f"{name!r}: {key} has shape {shape}, but an SAE of {info.features} features on "
                               f"{info.width}-wide tokens needs {' or '.join(map(str, shapes[key]))}.")
        if entry.get("dtype") not in ("F32", "F16", "BF16", "F64"):
            raise WeightsError(f"{name!r}: {key} is stored as {entry.get('dtype')}; an SAE's tensors are floats.")
        total += 8 * max(1, int(torch.tensor(shape).prod()) if shape else 1)
    if total > MAX_SAE_BYTES:
        raise WeightsError(f"{name!r} holds more than {MAX_SAE_BYTES:,} bytes of tensors; refusing to read it.")


def read_sae_safetensors(path: Path) -> SparseAutoencoder:
    """An SAE from its safetensors file; names, dtypes and shapes are checked against the metadata before
    any tensor is read."""
    entries, info = read_header(path)
    check_entries(entries, info, path.name)
    from safetensors.torch import load_file

    try:
        state = {k: v.float() for k, v in load_file(str(path), device="cpu").items()}
    except Exception as exc:  # safetensors raises several types for a damaged body
        raise WeightsError(f"{path.name!r} is not a valid safetensors file (truncated or damaged?): {exc}",
                           public=f"{path.name!r} is not a valid safetensors file.") from None
    check_finite(state.items(), repr(path.name))
    return SparseAutoencoder(info=info, **state)


def check_fits(sae: SparseAutoencoder, model: str, depth: int, width: int, source: str = "this SAE") -> None:
    """WeightsError with a sentence when `sae` was made for another model, block or width."""
    info = sae.info
    if info.width != width:
        raise WeightsError(f"{source} reads {info.width}-wide tokens, but {model!r} has {width}-wide tokens; "
                           "it was trained for another model.")
    if info.layer >= depth:
        raise WeightsError(f"{source} reads block {info.layer}, but {model!r} has {depth} blocks (0 to {depth - 1}).")
    if info.model and Path(info.model).name != Path(model).name and info.source == "vit_inspect":
        raise WeightsError(f"{source} was trained on {info.model!r}, not on {model!r}.")
