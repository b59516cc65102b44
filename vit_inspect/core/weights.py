"""Weights files read without unpickling code: safetensors (its header sized first), or
`torch.load(weights_only=True)`; then fitted to a model's own shapes."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

from vit_inspect.core.errors import WeightsError

WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
NESTED_STATE_KEYS = ("model", "state_dict", "model_state_dict", "module")  # wrappers used by training scripts


# What a ViT's safetensors file needs, with room to spare: DeiT-Ti's header is 14 KB for 152 tensors, a
# 40-block giant ViT's about 0.1 MB for ~650. A file beyond them is refused from its header alone, before
# its tensors are read: a 17 MiB upload of 250,000 one-number tensors held a worker for seconds.
MAX_SAFETENSORS_HEADER = 2 ** 20  # bytes
MAX_TENSORS = 10_000


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors from a weights file without running code from it.

    `.safetensors` is read with safetensors; `.pth/.pt/.bin` with `torch.load(weights_only=True)`,
    which refuses any pickled object that is not a tensor or plain container. A state dict nested
    under `model`/`state_dict` is unpacked and a `module.` prefix (DataParallel) is dropped.
    """
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"No weights file at {str(path)!r}.", public=f"The weights file {path.name!r} is not available.")
    if path.stat().st_size == 0:
        raise WeightsError(f"The weights file {path.name!r} is empty (0 bytes).")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        check_safetensors_header(path)
        try:
            state = load_file(str(path), device="cpu")
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise WeightsError(f"{path.name!r} is not a valid safetensors file (truncated or damaged?): {exc}",
                               public=f"{path.name!r} is not a valid safetensors file (truncated or damaged?).") from None
    elif suffix in (".pth", ".pt", ".bin", ".ckpt"):
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # the unpickler raises many types; none of them may pass through
            raise WeightsError(
                f"Refused to load {path.name!r}: it is not a plain tensor checkpoint ({type(exc).__name__}). "
                "Files that carry Python objects can run code when loaded, so only tensors are accepted; "
                "convert the weights to .safetensors.") from None
    else:
        raise WeightsError(f"Unsupported weights file type {suffix!r}; use .safetensors (preferred) or .pth.")
    tensors = _unwrap_state_dict(state, path.name)
    check_finite(tensors.items(), repr(path.name))
    return tensors


def check_safetensors_header(path: Path) -> int:
    """The number of tensors a safetensors file lists, read from its header alone (format: an 8-byte
    little-endian header length, then that many bytes of JSON, one entry per tensor plus an optional
    "__metadata__"). WeightsError when the header is longer than `MAX_SAFETENSORS_HEADER` bytes or
    lists more than `MAX_TENSORS` tensors, or is not such a header (a length beyond the file's end
    included)."""
    invalid = f"{path.name!r} is not a valid safetensors file (truncated or damaged?)."
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise WeightsError(invalid)
        length = int.from_bytes(prefix, "little")
        if length > path.stat().st_size - 8:  # not a safetensors file (a pickle renamed, a cut download)
            raise WeightsError(invalid)
        if length > MAX_SAFETENSORS_HEADER:
            raise WeightsError(
                f"{path.name!r} has a {length:,}-byte safetensors header, more than the {MAX_SAFETENSORS_HEADER:,} "
                "bytes a ViT's weights need (DeiT-Ti's: 14,160 for 152 tensors); refusing to read it.")
        text = handle.read(length)
    try:
        header = json.loads(text) if len(text) == length else None
    except (ValueError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        raise WeightsError(invalid)
    count = len(header) - int("__metadata__" in header)
    if count > MAX_TENSORS:
        raise WeightsError(f"{path.name!r} lists {count:,} tensors, more than the {MAX_TENSORS:,} a ViT's weights "
                           "need (DeiT-Ti has 152); refusing to read them.")
    return count


def check_finite(named_tensors, source: str) -> None:
    """Refuse weights holding NaN or ±inf: such a model gives confident nonsense, never an error."""
    bad = [name for name, t in named_tensors
           if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        shown = ", ".join(bad[:5]) + (f", … ({len(bad) - 5} more)" if len(bad) > 5 else "")
        raise WeightsError(f"This model's weights contain NaN/Inf ({source}: {len(bad)} tensor(s): {shown}); "
                           "refusing to use them.")


def _unwrap_state_dict(state: object, filename: str) -> dict[str, torch.Tensor]:
    for _ in range(3):
        if isinstance(state, dict):
            nested = next((state[k] for k in NESTED_STATE_KEYS if isinstance(state.get(k), dict)), None)
            if nested is None:
                break
            state = nested
    if not isinstance(state, dict) or not state:
        raise WeightsError(f"{filename!r} holds no state dict of tensors.")
    tensors = {str(k).removeprefix("module."): v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise WeightsError(f"{filename!r} holds no tensors.")
    return tensors


def apply_state_dict(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load `state` strictly, reporting missing/unexpected keys and shape mismatches readably.

    Tensors whose shape differs from the model's are refused (a wrong architecture), except the
    position embeddings, which timm's own checkpoint filter resamples to the model's grid. The
    filter also converts foreign key layouts (original DeiT/DINO checkpoints) when keys differ.
    """
    model.load_state_dict(fitted_state(model, state, source), strict=True)


def fitted_state(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """`state` as `apply_state_dict` loads it (through timm's checkpoint filter where keys differ), or a
    WeightsError listing what does not fit; only keys and shapes are read, so ``model`` may be on the meta
    device (checked before the real model is built)."""
    own = model.state_dict()
    mismatched = _shape_mismatches(own, state, skip=("pos_embed",))
    needs_filter = set(own) != set(state) or any(k.endswith("pos_embed") for k in _shape_mismatches(own, state))
    if needs_filter and not mismatched:
        filter_fn = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
        if filter_fn is not None:
            try:
                state = filter_fn(state, model)
            except Exception:  # a foreign layout the filter does not know; report the raw keys below
                pass
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = mismatched or _shape_mismatches(own, state)
    if missing or unexpected or mismatched:
        parts = [f"The weights in {source} do not fit this architecture."]
        for title, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched)):
            if keys:
                shown = ", ".join(keys[:8]) + (f", … ({len(keys) - 8} more)" if len(keys) > 8 else "")
                parts.append(f"{len(keys)} {title} key(s): {shown}.")
        raise WeightsError(" ".join(parts))
    check_floating(own, state, source)
    return state


def check_floating(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor], source: str) -> None:
    """Refuse integer tensors (int8, uint8, ...) for a model's floating-point parameters: `load_state_dict`
    would cast the stored integers to floats, and the model would run on numbers that were never its weights
    (a quantised file's scales live elsewhere), giving nonsense or attention that misses every patch."""
    integer = sorted(k for k in set(own) & set(state)
                     if own[k].is_floating_point() and not (state[k].is_floating_point() or state[k].is_complex()))
    if integer:
        dtypes = sorted({str(state[k].dtype).removeprefix("torch.") for k in integer})
        shown = ", ".join(integer[:3]) + (f", … ({len(integer) - 3} more)" if len(integer) > 3 else "")
        raise WeightsError(f"The weights in {source} store {len(integer)} floating-point parameter(s) as "
                           f"{'/'.join(dtypes)} ({shown}): quantised weights are not supported. Use the float32, "
                           "float16 or bfloat16 weights of this model.")


def _shape_mismatches(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> list[str]:
    return sorted(f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                  for k in set(own) & set(state) if state[k].shape != own[k].shape and not k.endswith(skip))
