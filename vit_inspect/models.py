"""Load a ViT from a timm name, a local weights file or a Hugging Face model, as one `ViTHandle`.

The handle carries everything later code needs, read from the model itself: patch size, token
layout for any input size, position and patch embeddings, labels and the model's own preprocessing.
Weights files are read without unpickling code: safetensors, or `torch.load(weights_only=True)`.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from . import hub
from .errors import (ModelNotFoundError, ModelTooLargeError, UnsupportedModelError, VitInspectError, WeightsError,
                     WeightsNotFoundError)
from .images import Preprocess
from .tokens import TokenLayout

DEFAULT_MODEL = "deit_tiny_patch16_224"
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
NESTED_STATE_KEYS = ("model", "state_dict", "model_state_dict", "module")  # wrappers used by training scripts
# The Hugging Face model types vit_inspect loads, each with the image processor its repositories use by default
_HF_DEFAULT_PROCESSOR = {"vit": "ViTImageProcessor", "deit": "DeiTImageProcessor", "beit": "BeitImageProcessor",
                         "data2vec-vision": "BeitImageProcessor", "dinov2": "BitImageProcessor",
                         "dinov2_with_registers": "BitImageProcessor", "vit_msn": "ViTImageProcessor"}
HF_MODEL_TYPES = tuple(_HF_DEFAULT_PROCESSOR)
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$")
_HF_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
# What a ViT's safetensors file needs, with room to spare: DeiT-Ti's header is 14 KB for 152 tensors, a
# 40-block giant ViT's about 0.1 MB for ~650. A file beyond them is refused from its header alone, before
# its tensors are read: a 17 MiB upload of 250,000 one-number tensors held a worker for seconds.
MAX_SAFETENSORS_HEADER = 2 ** 20  # bytes
MAX_TENSORS = 10_000


def default_checkpoint_dir() -> Path:
    """`$VIT_INSPECT_CHECKPOINTS`, else `checkpoints/` next to the package (the repository's)."""
    env = os.environ.get("VIT_INSPECT_CHECKPOINTS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "checkpoints"


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """CUDA when available and nothing is asked for; otherwise the device asked for, checked."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"Unknown device {device!r}; use 'cpu', 'cuda', 'cuda:0' or 'auto'.") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("CUDA was asked for but no CUDA GPU is available; use --device cpu.")
    return resolved


@dataclass(frozen=True, eq=False)
class ViTHandle:
    """A loaded ViT in eval mode plus its geometry, labels and preprocessing."""

    name: str  # what the user asked for: timm name, HF id or folder
    family: str  # "timm", "hf", or "module" (a hand-written model opened with a ModuleSpec)
    model: nn.Module  # in eval mode, on `device`
    device: torch.device
    weights: str  # where the weights came from, for display ("random" when none)
    patch_size: tuple[int, int]  # (ph, pw) in input pixels
    native_grid: tuple[int, int]  # (grid_h, grid_w) the position embeddings were trained for
    num_prefix_tokens: int  # class + distillation + register tokens
    has_class_token: bool
    num_dist_tokens: int
    num_reg_tokens: int
    no_embed_class: bool  # position embeddings have no slots for prefix tokens (timm's no_embed_class)
    global_pool: str  # readout of the head: "token" (class token) or "avg" (mean of patch tokens)
    depth: int  # number of transformer blocks
    num_heads: int
    embed_dim: int
    labels: tuple[str, ...]  # class names by index; empty for a model without a classification head
    preprocess: Preprocess
    blocks: tuple[nn.Module, ...] = field(repr=False)  # the transformer blocks, input to output
    attention_modules: tuple[nn.Module, ...] = field(repr=False)  # one attention module per block
    norm1_modules: tuple[nn.Module, ...] = field(repr=False)  # the first LayerNorm of each block
    patch_projection: nn.Conv2d = field(repr=False)  # the patch-embedding convolution
    _forward: Callable[[torch.Tensor], torch.Tensor] = field(repr=False)  # pixels -> logits (or features)
    _pos_embed: Callable[[tuple[int, int]], torch.Tensor | None] = field(repr=False)  # grid -> (gh*gw, D)

    @property
    def input_size(self) -> tuple[int, int]:
        """The model's default (H, W) input size."""
        return self.preprocess.input_size

    @property
    def has_head(self) -> bool:
        return bool(self.labels)

    def layout(self, input_size: tuple[int, int] | None = None) -> TokenLayout:
        """Token layout for an (H, W) input (default: the model's own size)."""
        height, width = input_size or self.input_size
        ph, pw = self.patch_size
        if height < ph or width < pw:
            raise ValueError(f"input {height}×{width} is smaller than one {ph}×{pw} patch")
        return TokenLayout(
            num_prefix_tokens=self.num_prefix_tokens, has_class_token=self.has_class_token,
            num_dist_tokens=self.num_dist_tokens, num_reg_tokens=self.num_reg_tokens,
            grid_h=height // ph, grid_w=width // pw, patch_h=ph, patch_w=pw)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) normalised pixels -> (B, num_classes) logits, or (B, D) features without a head."""
        return self._forward(pixels.to(self.device))

    def patch_embed_weight(self) -> np.ndarray:
        """(embed_dim, C, ph, pw) weights of the patch-embedding projection (ViT's E, Eq. 1)."""
        return self.patch_projection.weight.detach().float().cpu().numpy()

    def patch_pos_embed(self, grid: tuple[int, int] | None = None) -> np.ndarray | None:
        """(grid_h, grid_w, D) position embeddings of the patch slots, prefix slots removed.

        For a grid other than the native one they are resampled exactly as the model does it in its
        own forward pass. None when the model has no learned absolute position embeddings.
        """
        grid_h, grid_w = grid or self.native_grid
        with torch.no_grad():
            pos = self._pos_embed((grid_h, grid_w))
        if pos is None:
            return None
        return pos.detach().float().cpu().numpy().reshape(grid_h, grid_w, -1)

    def top_labels(self, probs: np.ndarray, k: int = 5) -> list[dict]:
        """The k most probable classes as {index, label, prob}."""
        order = np.argsort(-probs)[:k]
        return [{"index": int(i), "label": self.label(int(i)), "prob": float(probs[i])} for i in order]

    def label(self, index: int) -> str:
        return self.labels[index] if 0 <= index < len(self.labels) else str(index)


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
               max_model_bytes: int | None = None) -> ViTHandle:
    """Load a ViT by timm name, timm name + weights file, or Hugging Face folder / hub id.

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
    memory budget for names a web user sends.
    """
    if model_file is not None:
        from .module_spec import load_model_file
        return load_model_file(model_file, weights, device)
    device = resolve_device(device)
    if allow_local_dirs and Path(name).is_dir():
        return _load_hf(str(Path(name)), device, pretrained=pretrained, input_size=input_size,
                        max_model_bytes=max_model_bytes)
    name = validate_name(name)
    if "/" in name:
        if not allow_local_dirs and Path(name).exists():  # transformers would read the server's folder
            raise ModelNotFoundError(f"{name!r} is a path on this server, and a web user's names are hub ids only.",
                                     public=f"{name!r} is not a Hugging Face hub id this app loads.")
        return _load_hf(name, device, pretrained=pretrained, input_size=input_size, max_model_bytes=max_model_bytes)
    return _load_timm(name, weights, device, pretrained=pretrained, input_size=input_size,
                      checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir(),
                      max_model_bytes=max_model_bytes)


# ----------------------------------------------------------------------------------------- weights

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
    return state


def _shape_mismatches(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> list[str]:
    return sorted(f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                  for k in set(own) & set(state) if state[k].shape != own[k].shape and not k.endswith(skip))


# -------------------------------------------------------------------------------------------- timm

def _load_timm(name: str, weights: str | os.PathLike | None, device: torch.device, *, pretrained: bool,
               input_size: tuple[int, int] | None, checkpoint_dir: Path, max_model_bytes: int | None = None) -> ViTHandle:
    import timm
    from timm.models import split_model_name_tag

    arch, tag = split_model_name_tag(name)
    if not timm.is_model(arch):
        raise ModelNotFoundError(
            f"Unknown model {name!r}: it is not a timm architecture (e.g. '{DEFAULT_MODEL}', "
            "'vit_base_patch16_224.augreg2_in21k_ft_in1k') nor a Hugging Face id with a '/'.")
    if tag and _pretrained_cfg(name) is None:
        tags = [t.split(".", 1)[1] for t in timm.list_pretrained(f"{arch}.*")]
        raise ModelNotFoundError(f"{arch!r} has no pretrained tag {tag!r}"
                                 + (f"; its tags are: {', '.join(tags[:8])}." if tags else "; it has no tagged weights."))
    if weights:
        local: Path | None = Path(weights)
    elif pretrained:
        local = next((checkpoint_dir / f"{name}{s}" for s in (".safetensors", ".pth")
                      if (checkpoint_dir / f"{name}{s}").is_file()), None)
    else:
        local = None
    from_hub = pretrained and local is None
    state = read_state_dict(local) if local is not None else None  # read and checked before building
    meta = _meta_model(name)  # keys, shapes and size without memory: refuse before the real build
    if meta is not None:
        _check_model_bytes(name, meta, max_model_bytes)
        if state is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # timm's filter on meta shapes; only the verdict is used
                fitted_state(meta, dict(state), repr(Path(local).name))
    if from_hub:
        model = _create_timm_from_hub(name, checkpoint_dir)
        check_finite(model.state_dict().items(), "the hub's weights")
        source = f"Hugging Face hub ({model.pretrained_cfg.get('hf_hub_id') or 'timm'})"
    else:
        model = _create_timm(name, pretrained=False)
        source = "random" if local is None else str(local)
        if state is not None:
            apply_state_dict(model, state, repr(Path(local).name))
    return _timm_handle(model, name, device, source, input_size)


def _create_timm(name: str, pretrained: bool) -> nn.Module:
    import timm
    try:
        return timm.create_model(name, pretrained=pretrained, dynamic_img_size=True)
    except TypeError:
        raise UnsupportedModelError(
            f"{name!r} is a timm model but not a Vision Transformer that vit_inspect can inspect "
            "(it has no patch tokens with attention); try a 'vit_', 'deit_' or 'deit3_' model.") from None


def _meta_model(name: str) -> nn.Module | None:
    """timm's `name` built on the meta device (no memory, no weights), or None when that fails (the real
    build then says why). A model that takes no ViT arguments (a CNN such as resnet50) is refused here, as
    `_create_timm` refuses it, so it is named as no ViT before its weights are looked for; one found not to
    be inspectable only once built (a Swin) is left to the real build."""
    try:
        with torch.device("meta"):
            return _create_timm(name, pretrained=False)
    except UnsupportedModelError:
        raise
    except Exception:
        return None


def _check_model_bytes(name: str, meta: nn.Module, max_bytes: int | None) -> None:
    """ModelTooLargeError when the model's parameters and buffers, in float32, exceed ``max_bytes``."""
    if max_bytes is None:
        return
    tensors = [*meta.parameters(), *meta.buffers()]
    nbytes = sum(t.numel() * 4 for t in tensors)
    if nbytes > max_bytes:
        count = sum(p.numel() for p in meta.parameters())
        unit, scale = ("GiB", 2 ** 30) if max_bytes >= 2 ** 30 else ("MiB", 2 ** 20)
        raise ModelTooLargeError(
            f"{name!r} has {f'{count / 1e6:,.0f} M' if count >= 10 ** 6 else f'{count:,}'} parameters "
            f"({nbytes / scale:,.1f} {unit} in float32), more than the {max_bytes / scale:,.1f} {unit} this server "
            "allows one model; the operator can raise --memory-budget.")


def _pretrained_cfg(name: str) -> dict | None:
    """timm's pretrained config of a name (with or without tag) as a dict, without building the model;
    None for an unknown tag."""
    from timm.models import get_pretrained_cfg
    try:
        cfg = get_pretrained_cfg(name, allow_unregistered=False)
    except RuntimeError:  # "Invalid pretrained tag"
        return None
    return None if cfg is None else cfg.to_dict()


def _offline_and_not_cached(cfg: dict) -> bool:
    """True when the hub is switched off (HF_HUB_OFFLINE) and the hub weights of `cfg` are not in the
    local cache, so that building the model could only end in a failed download."""
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:
        return False
    repo = cfg.get("hf_hub_id")
    if not constants.HF_HUB_OFFLINE or not repo:
        return False
    repo, _, revision = repo.partition("@")
    filenames = [cfg["hf_hub_filename"]] if cfg.get("hf_hub_filename") else ["model.safetensors", "pytorch_model.bin",
                                                                            "open_clip_pytorch_model.bin"]
    return not any(isinstance(try_to_load_from_cache(repo, f, revision=revision or None), str) for f in filenames)


def _create_timm_from_hub(name: str, checkpoint_dir: Path) -> nn.Module:
    """The model with its hub weights. Whether weights exist (and, offline, whether they are cached) is
    checked from timm's config BEFORE the model is built: a failed load builds nothing."""
    wanted = checkpoint_dir / f"{name}.safetensors"
    missing = (f"Weights for {name!r} are not available on this server (no network access to the Hugging Face "
               "hub and no local copy).")
    cfg = _pretrained_cfg(name) or {}
    if not (cfg.get("hf_hub_id") or cfg.get("url") or cfg.get("file")):
        raise WeightsNotFoundError(
            f"timm knows no pretrained weights for {name!r}. Put a weights file at {wanted} "
            "or pass one with --weights.", public=f"timm knows no pretrained weights for {name!r}.")
    with hub.hub_access(name) as online:  # a recent failure is raised here at once; an unanswering hub: offline
        if _offline_and_not_cached(cfg):
            raise WeightsNotFoundError(
                f"Could not get weights for {name!r}: the Hugging Face hub is offline (HF_HUB_OFFLINE) or does not "
                f"answer, and they are not in its cache. Put the weights file at {wanted} (or pass --weights FILE).",
                public=missing)
        try:
            return _create_timm(name, pretrained=True)
        except UnsupportedModelError:
            raise
        except Exception as exc:  # network, cache and hub errors come in many types
            why = (f"from the Hugging Face hub ({type(exc).__name__})" if online else
                   "in the local hub cache, and the hub is offline (HF_HUB_OFFLINE=1) or does not answer")
            raise WeightsNotFoundError(
                f"Could not get weights for {name!r} {why}. Without network access, put the weights file at "
                f"{wanted} (or pass --weights FILE).", public=missing) from None


def _timm_handle(model: nn.Module, name: str, device: torch.device, source: str,
                 input_size: tuple[int, int] | None) -> ViTHandle:
    from timm.data import ImageNetInfo, infer_imagenet_subset, resolve_data_config
    from timm.layers import resample_abs_pos_embed

    blocks = tuple(getattr(model, "blocks", ()))
    patch_embed = getattr(model, "patch_embed", None)
    attn = tuple(getattr(b, "attn", None) for b in blocks)
    if (not blocks or patch_embed is None or not isinstance(getattr(patch_embed, "proj", None), nn.Conv2d)
            or any(a is None or not hasattr(a, "attn_drop") or not hasattr(a, "fused_attn") for a in attn)):
        raise UnsupportedModelError(
            f"{name!r} is not a plain ViT (patch embedding + blocks with standard attention); "
            "vit_inspect cannot capture its attention maps.")
    model = model.eval().to(device)
    cfg = resolve_data_config({}, model=model)
    height, width = input_size or tuple(patch_embed.img_size)  # the size the model was built for
    preprocess = Preprocess(input_size=(int(height), int(width)), mode="crop", crop_pct=float(cfg.get("crop_pct", 1.0)),
                            interpolation=str(cfg.get("interpolation", "bicubic")),
                            mean=tuple(float(v) for v in cfg["mean"]), std=tuple(float(v) for v in cfg["std"]))
    num_classes = int(getattr(model, "num_classes", 0) or 0)
    labels: tuple[str, ...] = ()
    if num_classes:
        subset = infer_imagenet_subset(model)
        if subset:
            info = ImageNetInfo(subset)
            labels = tuple(info.index_to_description(i) for i in range(num_classes))
        else:
            labels = tuple(str(i) for i in range(num_classes))
    has_class_token = getattr(model, "cls_token", None) is not None
    num_dist = int(getattr(model, "dist_token", None) is not None)
    num_prefix = int(model.num_prefix_tokens)
    no_embed_class = bool(getattr(model, "no_embed_class", False))
    native_grid = tuple(int(g) for g in patch_embed.grid_size)

    def pos_embed(grid: tuple[int, int]) -> torch.Tensor | None:
        if getattr(model, "pos_embed", None) is None:
            return None
        prefix = 0 if no_embed_class else num_prefix
        pos = resample_abs_pos_embed(model.pos_embed, new_size=list(grid), old_size=list(native_grid),
                                     num_prefix_tokens=prefix)  # (1, prefix + gh*gw, D)
        return pos[0, prefix:]

    return ViTHandle(
        name=name, family="timm", model=model, device=device, weights=source,
        patch_size=tuple(int(p) for p in patch_embed.patch_size), native_grid=native_grid,
        num_prefix_tokens=num_prefix, has_class_token=has_class_token, num_dist_tokens=num_dist,
        num_reg_tokens=num_prefix - int(has_class_token) - num_dist, no_embed_class=no_embed_class,
        global_pool="token" if getattr(model, "global_pool", "token") in ("token", "") and has_class_token else "avg",
        depth=len(blocks), num_heads=int(attn[0].num_heads), embed_dim=int(model.embed_dim), labels=labels,
        preprocess=preprocess, blocks=blocks, attention_modules=attn,
        norm1_modules=tuple(b.norm1 for b in blocks), patch_projection=patch_embed.proj,
        _forward=model, _pos_embed=pos_embed)


def handle_from_timm(model: nn.Module, name: str = "custom", device: str | torch.device | None = None,
                     input_size: tuple[int, int] | None = None) -> ViTHandle:
    """A handle for an already built timm ViT (it must be built with `dynamic_img_size=True`
    to accept input sizes other than its own)."""
    return _timm_handle(model, name, resolve_device(device), "given module", input_size)


# -------------------------------------------------------------------------------------------- HF

def _load_hf(source: str, device: torch.device, *, pretrained: bool, input_size: tuple[int, int] | None,
             max_model_bytes: int | None = None) -> ViTHandle:
    from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

    shown = Path(source).name if Path(source).is_dir() else source  # a server folder by its base name only
    local = Path(source).is_dir()
    listing = None  # a web user's hub id: every file sized from the hub's listing before it is downloaded
    with (contextlib.nullcontext(True) if local else hub.hub_access(source)) as online:
        if online and not local and max_model_bytes is not None:
            listing = hub.fetch_configs(source)
        # the listed commit from the local cache only: nothing that was not sized is downloaded; a hub that
        # does not answer: every read below from the local cache too, not only the config's
        cached = ({"revision": listing.revision, "local_files_only": True} if listing else
                  {} if online else {"local_files_only": True})
        try:
            config = AutoConfig.from_pretrained(source, trust_remote_code=False, **cached)
        except Exception as exc:  # missing folder, no network, not a model repo
            why = type(exc).__name__ if online else "the hub is offline or does not answer"
            advice = ("Give a local folder with config.json, or a hub id such as 'google/vit-base-patch16-224' "
                      "(needs network).")
            raise ModelNotFoundError(
                f"Could not read a Hugging Face model config for {source!r} ({why}). {advice}",
                public=f"Could not read a Hugging Face model config for {shown!r} ({why}). {advice}") from None
    if config.model_type not in HF_MODEL_TYPES:
        supported = f"vit_inspect supports these Hugging Face types: {', '.join(HF_MODEL_TYPES)}."
        raise UnsupportedModelError(f"{source!r} is a {config.model_type!r} model; {supported}",
                                    public=f"{shown!r} is a {config.model_type!r} model; {supported}")
    is_classifier = any(a.endswith(("ForImageClassification", "ForImageClassificationWithTeacher"))
                        for a in (config.architectures or []))
    auto = AutoModelForImageClassification if is_classifier else AutoModel
    if max_model_bytes is not None:  # sized from its config alone, before its weights are downloaded or read
        with torch.device("meta"):
            meta = auto.from_config(config, attn_implementation="eager")
        _check_model_bytes(shown, meta, max_model_bytes)
    if listing is not None and pretrained:
        with hub.hub_access(source):
            hub.fetch_weights(listing, max_model_bytes, getattr(config, "transformers_weights", None))
    try:
        if pretrained:
            model = auto.from_pretrained(source, attn_implementation="eager", trust_remote_code=False,
                                         dtype=torch.float32, **cached)  # not the config's dtype: float32 was sized
        else:
            model = auto.from_config(config, attn_implementation="eager", dtype=torch.float32)
    except Exception as exc:
        raise WeightsError(f"Could not load the weights of {source!r}: {type(exc).__name__}: {exc}"[:600],
                           public=f"Could not load the weights of {shown!r} ({type(exc).__name__}).") from None
    check_finite(model.state_dict().items(), repr(shown))
    handle = _hf_handle(model, source, device, "random" if not pretrained else source,
                        _hf_processor(source, shown, config, cached), input_size)
    if input_size is None:  # the size the repository's own files ask for, never a pass beyond the bound
        from .geometry import check_input_size
        try:
            check_input_size(handle, handle.preprocess.input_size)
        except VitInspectError as exc:
            height, width = handle.preprocess.input_size
            raise UnsupportedModelError(f"{shown!r} asks for {height}x{width}-pixel inputs in its own files, which "
                                        f"this server does not run: {exc.public}") from None
    return handle


# The image processors vit_inspect reads settings from (sizes, crop, mean, std, resampling), by name. Any other
# class is refused: a processor's constructor may read files (OneFormer's fetches a JSON file from any hub
# repository, with the server's token, or from a server path its config names).
HF_IMAGE_PROCESSORS = ("ViTImageProcessor", "DeiTImageProcessor", "BeitImageProcessor", "BitImageProcessor",
                       "CLIPImageProcessor")


def _hf_processor(source: str, shown: str, config, cached: dict) -> object | None:
    """The model's image processor, built from its preprocessor_config.json's settings by one of
    `HF_IMAGE_PROCESSORS` (the class that file names, as transformers reads it: ``image_processor_type``, else
    ``feature_extractor_type``, else the config's, else the model type's own); None without that file (the
    config's image size is used). Never `AutoImageProcessor`, which builds whatever class the file names."""
    import transformers
    from transformers.image_processing_utils import ImageProcessingMixin

    try:
        settings, _ = ImageProcessingMixin.get_image_processor_dict(source, **cached)
    except Exception:  # no preprocessor_config.json: the config's image size
        return None
    named = (settings.get("image_processor_type")
             or str(settings.get("feature_extractor_type") or "").replace("FeatureExtractor", "ImageProcessor")
             or getattr(config, "image_processor_type", None) or _HF_DEFAULT_PROCESSOR[config.model_type])
    base = named[:-4] if isinstance(named, str) and named.endswith("Fast") else named
    if base not in HF_IMAGE_PROCESSORS:
        raise UnsupportedModelError(f"{shown!r} asks for the image processor {str(named)[:80]!r}; vit_inspect reads "
                                    f"the settings of {', '.join(HF_IMAGE_PROCESSORS)} only.")
    try:
        return getattr(transformers, base).from_dict(settings)
    except Exception:  # settings its class cannot take: the config's image size, as without the file
        return None


def _hf_preprocess(model: nn.Module, processor: object | None, input_size: tuple[int, int] | None) -> Preprocess:
    image_size = getattr(model.config, "image_size", 224)
    default = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    size = getattr(processor, "size", None) or {}
    crop = getattr(processor, "crop_size", None) or {}
    get = (lambda d, k: d.get(k) if isinstance(d, dict) else getattr(d, k, None))
    resized = (get(size, "height"), get(size, "width"))
    do_crop = bool(getattr(processor, "do_center_crop", False)) and get(crop, "height")
    if do_crop:
        target = (int(get(crop, "height")), int(get(crop, "width")))
        short = get(size, "shortest_edge")
        crop_pct = target[0] / (short or resized[0] or target[0])
        mode = "crop" if short else "squash"
    else:
        target = (int(resized[0]), int(resized[1])) if resized[0] else default
        crop_pct, mode = 1.0, "squash"
    mean = tuple(float(v) for v in (getattr(processor, "image_mean", None) or (0.5, 0.5, 0.5)))
    std = tuple(float(v) for v in (getattr(processor, "image_std", None) or (0.5, 0.5, 0.5)))
    resample = getattr(processor, "resample", 2)
    interpolation = _HF_RESAMPLE.get(int(getattr(resample, "value", resample) or 2), "bilinear")
    return Preprocess(input_size=tuple(input_size or target), mode=mode, crop_pct=float(crop_pct),
                      interpolation=interpolation, mean=mean, std=std)


def _hf_layers(backbone: nn.Module) -> tuple[nn.Module, ...]:
    for path in ("layers", "encoder.layer", "encoder.layers"):
        found: object = backbone
        for part in path.split("."):
            found = getattr(found, part, None)
        if isinstance(found, nn.ModuleList):
            return tuple(found)
    raise UnsupportedModelError(f"Cannot find the transformer layers of {type(backbone).__name__}.")


def _hf_handle(model: nn.Module, name: str, device: torch.device, source: str, processor: object | None,
               input_size: tuple[int, int] | None) -> ViTHandle:
    config = model.config
    backbone = model.base_model
    embeddings = backbone.embeddings
    projection = getattr(getattr(embeddings, "patch_embeddings", None), "projection", None)
    if not isinstance(projection, nn.Conv2d):
        raise UnsupportedModelError(f"{name!r} has no convolutional patch embedding.")
    layers = _hf_layers(backbone)
    attention = tuple(getattr(layer, "attention", None) for layer in layers)
    norm1 = tuple(getattr(layer, "layernorm_before", None) or getattr(layer, "norm1", None) for layer in layers)
    if any(a is None for a in attention) or any(n is None for n in norm1):
        raise UnsupportedModelError(f"{name!r} has layers without the attention/LayerNorm modules vit_inspect hooks.")
    model = model.eval().to(device)
    has_class_token = getattr(embeddings, "cls_token", None) is not None
    num_dist = int(getattr(embeddings, "distillation_token", None) is not None)
    registers = getattr(embeddings, "register_tokens", None)
    num_reg = int(registers.shape[1]) if registers is not None else 0
    patch_size = tuple(int(p) for p in projection.kernel_size)
    image_size = getattr(config, "image_size", 224)
    native = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    native_grid = (native[0] // patch_size[0], native[1] // patch_size[1])
    num_prefix = int(has_class_token) + num_dist + num_reg
    classifier = getattr(model, "classifier", None) or getattr(model, "cls_classifier", None)
    labels: tuple[str, ...] = ()
    if classifier is not None:
        id2label = getattr(config, "id2label", None) or {}
        labels = tuple(str(id2label.get(i, i)) for i in range(int(config.num_labels)))
    use_mean = bool(getattr(config, "use_mean_pooling", False))

    def forward(pixels: torch.Tensor) -> torch.Tensor:
        out = model(pixel_values=pixels, interpolate_pos_encoding=True)
        if classifier is not None:
            return out.logits
        return out.pooler_output if getattr(out, "pooler_output", None) is not None else out.last_hidden_state[:, 0]

    def pos_embed(grid: tuple[int, int]) -> torch.Tensor | None:
        table = getattr(embeddings, "position_embeddings", None)
        if not isinstance(table, torch.Tensor):
            return None
        pos_prefix = table.shape[1] - native_grid[0] * native_grid[1]  # prefix slots in the table
        if tuple(grid) == native_grid:
            return table[0, pos_prefix:]
        dummy = table.new_zeros(1, pos_prefix + grid[0] * grid[1], table.shape[-1])
        pos = embeddings.interpolate_pos_encoding(dummy, grid[0] * patch_size[0], grid[1] * patch_size[1])
        return pos[0, pos_prefix:]

    return ViTHandle(
        name=name, family="hf", model=model, device=device, weights=source, patch_size=patch_size,
        native_grid=native_grid, num_prefix_tokens=num_prefix, has_class_token=has_class_token,
        num_dist_tokens=num_dist, num_reg_tokens=num_reg, no_embed_class=False,
        global_pool="avg" if use_mean or not has_class_token else "token", depth=len(layers),
        num_heads=int(config.num_attention_heads), embed_dim=int(config.hidden_size), labels=labels,
        preprocess=_hf_preprocess(model, processor, input_size), blocks=layers, attention_modules=attention,
        norm1_modules=norm1, patch_projection=projection, _forward=forward, _pos_embed=pos_embed)


def handle_from_hf(model: nn.Module, name: str = "custom-hf", device: str | torch.device | None = None,
                   image_processor: object | None = None, input_size: tuple[int, int] | None = None) -> ViTHandle:
    """A handle for an already built transformers ViT (loaded with `attn_implementation="eager"`)."""
    return _hf_handle(model, name, resolve_device(device), "given module", image_processor, input_size)
