"""`load_sae`: an SAE from a file of any format this tool reads, or a sentence saying why not."""
from __future__ import annotations

import os
from pathlib import Path

from vit_inspect.core.errors import WeightsError
from vit_inspect.core.sae_file import SparseAutoencoder, read_sae_safetensors
from vit_inspect.core.saev import read_saev

PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".pkl")


def load_sae(path: str | os.PathLike, layer: int | None = None, model: str = "") -> SparseAutoencoder:
    """An SAE from its file: this tool's safetensors file (`core.sae_file`), or saev's format (a line of JSON,
    then a state dict; `core.saev`, which needs `layer`, the block it reads, and takes `model` for display).
    Pickled checkpoints (ViT-Prisma's `.pt`) are refused with a sentence on how to convert them."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"No SAE file at {str(path)!r}.", public=f"The SAE file {path.name!r} is not available.")
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise WeightsError(
            f"{path.name!r} is a pickled checkpoint: loading it can run any code it carries, so it is refused. "
            "On a machine you trust, load it with torch.load and write its W_enc (d×F), b_enc, W_dec (F×d) and "
            "b_dec tensors with vit_inspect.core.sae_file.save_sae, which stores them as safetensors with the "
            "metadata the SAE docs describe.",
            public=f"{path.name!r} is a pickled checkpoint, which is refused; convert it to safetensors.")
    with open(path, "rb") as handle:
        first = handle.read(1)
    if first == b"{":
        return read_saev(path, layer=layer, model=model)
    if path.suffix.lower() != ".safetensors":
        raise WeightsError(f"Unsupported SAE file type {path.suffix!r}; use .safetensors or saev's format.")
    return read_sae_safetensors(path)
