"""Load a ViT from a timm name, a local weights file or a Hugging Face model, as one `ViTHandle`.

The handle carries everything later code needs, read from the model itself: patch size, token
layout for any input size, position and patch embeddings, labels and the model's own preprocessing.
Weights files are read without unpickling code: safetensors, or `torch.load(weights_only=True)`.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

import torch

from vit_inspect.core.errors import InputError, ModelNotFoundError
from vit_inspect.core.handle import DEFAULT_MODEL, ViTHandle, default_checkpoint_dir, resolve_device
from vit_inspect.core.hf_models import load_hf
from vit_inspect.core.open_clip_models import is_open_clip_name, load_open_clip
from vit_inspect.core.timm_models import cached_on_this_machine, load_timm

_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$")


def validate_name(name: str) -> str:
    """A model name or hub id made only of the characters such names use; never evaluated."""
    name = name.strip()
    if not name or len(name) > 200 or not _NAME_PATTERN.match(name) or ".." in name:
        raise ModelNotFoundError(
            f"{name[:80]!r} is not a valid model name. Use a timm name such as '{DEFAULT_MODEL}' "
            "or a Hugging Face id such as 'google/vit-base-patch16-224'.")
    return name


def load_model(name: str = DEFAULT_MODEL, weights: str | os.PathLike | None = None,
               device: str | torch.device | None = None, *, pretrained: bool = True,
               input_size: tuple[int, int] | None = None, checkpoint_dir: str | os.PathLike | None = None,
               allow_local_dirs: bool = True, model_file: str | os.PathLike | None = None,
               max_model_bytes: int | None = None, labels: Sequence[str] | None = None,
               templates: Sequence[str] | None = None) -> ViTHandle:
    """Load a ViT by timm name, timm name + weights file, Hugging Face folder / hub id, or OpenCLIP name
    (``open_clip:ARCH[:TAG]``, `core.open_clip_models`: the vision tower, its text tower beside it).

    `model_file` ("path.py:function", see `load_model_file`) imports and runs that Python file instead:
    only the operator passes it (a command-line flag), never a value a web client sent.

    Weights for a timm name come from, in order: `weights`; `checkpoint_dir/<name>.safetensors`
    (or `.pth`); the Hugging Face hub through timm (its cache first). `pretrained=False` gives random
    weights (tests, benchmarks). `input_size` overrides the default (H, W) the model is fed.
    A name with a '/' (or an existing folder, when `allow_local_dirs`) is a Hugging Face model.
    A model whose float32 parameters exceed `max_model_bytes` is refused before it is built or its
    weights downloaded: built on the meta device from its timm name or its Hugging Face config (a few
    kB). A weights file that does not fit a timm model is refused the same way. A hub id's files are
    then sized from the hub's listing before they are downloaded (`hub.fetch_configs`). The app passes its
    memory budget for names a web user sends. ``labels`` (with ``templates``) are an OpenCLIP model's
    zero-shot list in place of the 1000 ImageNet classes; other models have no text tower and refuse them.
    """
    if model_file is not None:
        from vit_inspect.core.module_spec import load_model_file
        return load_model_file(model_file, weights, device)
    device = resolve_device(device)
    if is_open_clip_name(name):
        # a web user's name: a text tower's zero-shot list costs thousands of text passes, the operator's choice
        if not allow_local_dirs:
            raise ModelNotFoundError(f"{name[:120]!r}: OpenCLIP models are loaded by the operator only (--model).",
                                     public="This app loads OpenCLIP models only when its operator starts it with "
                                            "--model open_clip:NAME.")
        return load_open_clip(name, weights, device, pretrained=pretrained, input_size=input_size,
                              checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir(),
                              max_model_bytes=max_model_bytes, labels=labels, templates=templates)
    if labels is not None or templates is not None:
        raise InputError(f"{name[:120]!r} has no text tower: a zero-shot list is for OpenCLIP models only.")
    if allow_local_dirs and Path(name).is_dir():
        return load_hf(str(Path(name)), device, pretrained=pretrained, input_size=input_size,
                        max_model_bytes=max_model_bytes)
    name = validate_name(name)
    if "/" in name:
        if not allow_local_dirs and Path(name).exists():  # transformers would read the server's folder
            raise ModelNotFoundError(f"{name!r} is a path on this server, and a web user's names are hub ids only.",
                                     public=f"{name!r} is not a Hugging Face hub id this app loads.")
        return load_hf(name, device, pretrained=pretrained, input_size=input_size, max_model_bytes=max_model_bytes)
    return load_timm(name, weights, device, pretrained=pretrained, input_size=input_size,
                      checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir(),
                      max_model_bytes=max_model_bytes)


def weights_at_hand(name: str, checkpoint_dir: str | os.PathLike | None = None) -> bool:
    """Whether the pretrained weights of a timm name are on this machine, so that it loads without the hub:
    a file `checkpoint_dir/<name>.safetensors` (or `.pth`), or its hub weights in the local hub cache. Reads
    only file names and timm's config; a Hugging Face id (with '/') asks for its config in the hub cache."""
    folder = Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir()
    if "/" not in name and any((folder / f"{name}{suffix}").is_file() for suffix in (".safetensors", ".pth")):
        return True
    return cached_on_this_machine(name)
