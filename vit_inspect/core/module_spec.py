"""Open a hand-written ViT: a `ModuleSpec` names, by attribute path, where its parts are.

A ViT written by hand (a `Conv2d` patch embedder, a class token, learned position embeddings, blocks
whose attention returns `(output, weights)`) is neither a timm model nor a Hugging Face one. The spec
tells `handle_from_module` where its blocks, attention probabilities, first norms, patch embedding and
position embeddings are, and how its inputs are prepared. One dummy forward pass then checks every
captured shape against the declared geometry, so a wrong spec fails at once with the module and the
shape, never later as a wrong map. `load_model_file` imports a Python file that builds such a model:
only the operator may call it (command line), never with a name that came from a web client.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from vit_inspect.core.errors import ModelNotFoundError, UnsupportedModelError, WeightsNotFoundError
from vit_inspect.core.handle import ViTHandle, resolve_device
from vit_inspect.core.images import Preprocess
from vit_inspect.core.weights import apply_state_dict, read_state_dict

ATTENTION_OUTPUTS = ("tuple", "probs")
READOUTS = ("token", "avg")
ROW_SUM_TOLERANCE = 1e-3  # attention rows are softmax probabilities: each sums to 1 within this


@dataclass(frozen=True)
class ModuleSpec:
    """Where a hand-written ViT keeps the parts vit_inspect reads. Paths are dotted attribute paths
    (`"encoder.layers"`, `"blocks.0.attn"`); `attention` and `norm1` are relative to each block."""

    blocks: str  # the ModuleList (or Sequential) of transformer blocks, input to output
    attention: str  # in each block: the module whose forward gives the attention probabilities
    norm1: str  # in each block: the norm applied before attention (Grad-CAM reads its output)
    patch_embed: str  # the patch-embedding Conv2d (kernel = stride = patch size)
    num_heads: int  # attention heads per block
    input_size: tuple[int, int]  # (H, W) in pixels the model takes
    attention_output: str = "tuple"  # "tuple": the module returns (output, weights); "probs": its output IS them
    pos_embed: str | None = None  # learned absolute position embeddings, (1, slots + grid_h*grid_w, D); None: none
    pos_embed_prefix_slots: int = 0  # how many of pos_embed's slots belong to prefix tokens (before the patches)
    class_token: bool = True  # token 0 is a class token
    num_dist_tokens: int = 0  # distillation tokens after the class token
    num_reg_tokens: int = 0  # register tokens after class and distillation tokens
    readout: str = "token"  # what the head reads: "token" (class token) or "avg" (mean of patch tokens)
    labels: tuple[str, ...] = ()  # class names by logit index; empty: the model returns features, not logits
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)  # per-channel mean on the 0..1 scale
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)  # per-channel std on the 0..1 scale
    interpolation: str = "bilinear"  # PIL resampling used to resize an image to input_size
    crop_pct: float = 1.0  # fraction kept by the centre crop after resizing (1.0: resize the short side, crop)

    def __post_init__(self) -> None:
        for name in ("input_size", "labels", "mean", "std"):  # lists from a dict or JSON become tuples
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.attention_output not in ATTENTION_OUTPUTS:
            raise ValueError(f"ModuleSpec.attention_output must be one of {ATTENTION_OUTPUTS}, "
                             f"got {self.attention_output!r}")
        if self.readout not in READOUTS:
            raise ValueError(f"ModuleSpec.readout must be one of {READOUTS}, got {self.readout!r}")
        if self.readout == "token" and not self.class_token:
            raise ValueError("ModuleSpec.readout='token' needs class_token=True; use readout='avg' otherwise")
        if self.num_heads < 1:
            raise ValueError(f"ModuleSpec.num_heads must be at least 1, got {self.num_heads}")
        if len(self.input_size) != 2 or min(self.input_size) < 1:
            raise ValueError(f"ModuleSpec.input_size must be (height, width), got {self.input_size}")
        if not 0 <= self.pos_embed_prefix_slots <= self.num_prefix_tokens:
            raise ValueError(f"ModuleSpec.pos_embed_prefix_slots={self.pos_embed_prefix_slots} must be between 0 "
                             f"and the {self.num_prefix_tokens} prefix token(s)")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ValueError("ModuleSpec.mean and .std need three values (R, G, B)")

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + self.num_dist_tokens + self.num_reg_tokens

    @classmethod
    def from_dict(cls, values: Mapping) -> ModuleSpec:
        """A spec from a plain dict; an unknown key is an error (a typo must not pass silently)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Unknown ModuleSpec key(s): {', '.join(unknown)}. Known: {', '.join(sorted(known))}.")
        return cls(**values)


def _attribute(root: nn.Module, path: str, what: str) -> object:
    """Follow a dotted attribute path; the error names the step that is missing and what exists there."""
    found: object = root
    walked: list[str] = []
    for part in path.split("."):
        if not hasattr(found, part):
            children = [n for n, _ in found.named_children()] if isinstance(found, nn.Module) else []
            where = type(found).__name__ + (f" at {'.'.join(walked)!r}" if walked else "")
            raise UnsupportedModelError(
                f"ModuleSpec.{what} = {path!r}: {where} has no attribute {part!r}"
                + (f"; its children are: {', '.join(children[:12])}." if children else "."))
        found = getattr(found, part)
        walked.append(part)
    return found


def _module(root: nn.Module, path: str, what: str) -> nn.Module:
    found = _attribute(root, path, what)
    if not isinstance(found, nn.Module):
        raise UnsupportedModelError(f"ModuleSpec.{what} = {path!r} is a {type(found).__name__}, not a torch module.")
    return found


def handle_from_module(model: nn.Module, spec: ModuleSpec | Mapping, name: str = "custom",
                       device: str | torch.device | None = None, weights: str = "given module") -> ViTHandle:
    """A `ViTHandle` for a hand-written ViT described by `spec` (a `ModuleSpec` or a dict of its fields).

    The model is put in eval mode on `device` and run once on a dummy input of `spec.input_size`. Every
    captured shape is checked against the declared geometry: the patch-embedding output (1, D, grid_h,
    grid_w), each first norm's output (1, N, D), each block's attention probabilities (1, heads, N, N)
    with rows summing to 1, the position embeddings (1, slots + grid_h*grid_w, D) and the logits
    (1, len(labels)), where N = prefix tokens + grid_h*grid_w. A mismatch raises `UnsupportedModelError`
    naming the module and both shapes. The model takes `spec.input_size` only: its position embeddings
    are not resampled for other sizes, because how it would do so is not declared.
    """
    spec = spec if isinstance(spec, ModuleSpec) else ModuleSpec.from_dict(spec)
    device = resolve_device(device)
    blocks_obj = _attribute(model, spec.blocks, "blocks")
    if not isinstance(blocks_obj, (nn.ModuleList, nn.Sequential)) or len(blocks_obj) == 0:
        raise UnsupportedModelError(f"ModuleSpec.blocks = {spec.blocks!r} is a {type(blocks_obj).__name__}; "
                                    "expected a non-empty nn.ModuleList or nn.Sequential of blocks.")
    blocks = tuple(blocks_obj)
    attention = tuple(_module(b, spec.attention, f"attention (in {spec.blocks}.{i})") for i, b in enumerate(blocks))
    norm1 = tuple(_module(b, spec.norm1, f"norm1 (in {spec.blocks}.{i})") for i, b in enumerate(blocks))
    projection = _module(model, spec.patch_embed, "patch_embed")
    if not isinstance(projection, nn.Conv2d):
        raise UnsupportedModelError(f"ModuleSpec.patch_embed = {spec.patch_embed!r} is a "
                                    f"{type(projection).__name__}; expected the patch-embedding nn.Conv2d.")
    patch_size = tuple(int(k) for k in projection.kernel_size)
    if tuple(int(s) for s in projection.stride) != patch_size or projection.in_channels != 3:
        raise UnsupportedModelError(
            f"ModuleSpec.patch_embed = {spec.patch_embed!r} is Conv2d(in={projection.in_channels}, kernel="
            f"{projection.kernel_size}, stride={projection.stride}); a patch embedding takes 3 colour channels "
            "with stride equal to its kernel (non-overlapping patches).")
    height, width = spec.input_size
    if height % patch_size[0] or width % patch_size[1]:
        raise UnsupportedModelError(f"ModuleSpec.input_size {height}×{width} is not a whole number of "
                                    f"{patch_size[0]}×{patch_size[1]} patches.")
    native_grid = (height // patch_size[0], width // patch_size[1])
    embed_dim = int(projection.out_channels)
    pos_table = None
    if spec.pos_embed is not None:
        pos_table = _attribute(model, spec.pos_embed, "pos_embed")
        expected = spec.pos_embed_prefix_slots + native_grid[0] * native_grid[1]
        if not isinstance(pos_table, torch.Tensor) or tuple(pos_table.shape[-2:]) != (expected, embed_dim) \
                or pos_table.ndim not in (2, 3) or (pos_table.ndim == 3 and pos_table.shape[0] != 1):
            shape = tuple(pos_table.shape) if isinstance(pos_table, torch.Tensor) else type(pos_table).__name__
            raise UnsupportedModelError(
                f"ModuleSpec.pos_embed = {spec.pos_embed!r} has shape {shape}; the declared geometry needs "
                f"(1, {expected}, {embed_dim}) = (1, {spec.pos_embed_prefix_slots} prefix slot(s) + "
                f"{native_grid[0]}×{native_grid[1]} patches, embed_dim).")

    model = model.eval().to(device)

    def forward(pixels: torch.Tensor) -> torch.Tensor:
        if tuple(pixels.shape[-2:]) != spec.input_size:
            raise UnsupportedModelError(
                f"{name!r} takes {height}×{width} inputs only, got {pixels.shape[-2]}×{pixels.shape[-1]} "
                "(its ModuleSpec declares no resampling of the position embeddings).")
        return model(pixels)

    def pos_embed(grid: tuple[int, int]) -> torch.Tensor | None:
        if pos_table is None:
            return None
        if tuple(grid) != native_grid:
            raise UnsupportedModelError(
                f"{name!r} has position embeddings for its own {native_grid[0]}×{native_grid[1]} grid only; "
                f"how it would resample them for a {grid[0]}×{grid[1]} grid is not declared in its ModuleSpec.")
        return pos_table.reshape(-1, embed_dim)[spec.pos_embed_prefix_slots:]  # (gh*gw, D)

    handle = ViTHandle(
        name=name, family="module", model=model, device=device, weights=weights, patch_size=patch_size,
        native_grid=native_grid, num_prefix_tokens=spec.num_prefix_tokens, has_class_token=spec.class_token,
        num_dist_tokens=spec.num_dist_tokens, num_reg_tokens=spec.num_reg_tokens,
        no_embed_class=spec.pos_embed_prefix_slots == 0, global_pool=spec.readout, depth=len(blocks),
        num_heads=spec.num_heads, embed_dim=embed_dim, labels=tuple(str(label) for label in spec.labels),
        preprocess=Preprocess(input_size=spec.input_size, mode="crop", crop_pct=float(spec.crop_pct),
                              interpolation=spec.interpolation, mean=spec.mean, std=spec.std),
        blocks=blocks, attention_modules=attention, norm1_modules=norm1, patch_projection=projection,
        _forward=forward, _pos_embed=pos_embed)
    _check_dummy_forward(handle, spec)
    return handle


def _check_dummy_forward(handle: ViTHandle, spec: ModuleSpec) -> None:
    """One forward pass on a dummy input; every hooked output must have the declared shape."""
    layout = handle.layout()
    tokens, dim, heads = layout.num_tokens, handle.embed_dim, handle.num_heads
    seen: dict[str, object] = {}
    hooks = []

    def record(key: str):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            seen.setdefault(key, output)
        return hook

    try:
        hooks.append(handle.patch_projection.register_forward_hook(record("patch_embed")))
        for i, (attn, norm) in enumerate(zip(handle.attention_modules, handle.norm1_modules)):
            hooks.append(attn.register_forward_hook(record(f"attention{i}")))
            hooks.append(norm.register_forward_hook(record(f"norm1{i}")))
        dummy = torch.randn(1, 3, *spec.input_size, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            try:
                output = handle.forward(dummy.to(handle.device))
            except UnsupportedModelError:
                raise
            except Exception as exc:  # the user's own forward failed on the declared input size
                raise UnsupportedModelError(
                    f"The model's forward pass failed on a dummy (1, 3, {spec.input_size[0]}, {spec.input_size[1]}) "
                    f"input, the ModuleSpec's input_size: {type(exc).__name__}: {exc}") from None
    finally:
        for hook in hooks:
            hook.remove()

    def shape_of(value: object) -> str:
        return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__

    grid = (layout.grid_h, layout.grid_w)
    patches = seen.get("patch_embed")
    if not isinstance(patches, torch.Tensor) or tuple(patches.shape) != (1, dim, *grid):
        raise UnsupportedModelError(
            f"ModuleSpec.patch_embed = {spec.patch_embed!r} gave {shape_of(patches)}; expected (1, {dim}, "
            f"{grid[0]}, {grid[1]}) for a {spec.input_size[0]}×{spec.input_size[1]} input.")
    for i in range(handle.depth):
        where = f"{spec.blocks}.{i}"
        norm_out = seen.get(f"norm1{i}")
        if not isinstance(norm_out, torch.Tensor) or tuple(norm_out.shape) != (1, tokens, dim):
            raise UnsupportedModelError(
                f"ModuleSpec.norm1: {where}.{spec.norm1} gave {shape_of(norm_out)}; expected (1, {tokens}, {dim}) = "
                f"(batch, {layout.num_prefix_tokens} prefix + {grid[0]}×{grid[1]} patch tokens, embed_dim).")
        raw = seen.get(f"attention{i}")
        module = f"{where}.{spec.attention}"
        if spec.attention_output == "tuple":
            if not isinstance(raw, tuple) or len(raw) < 2:
                raise UnsupportedModelError(
                    f"ModuleSpec.attention: {module} returned {shape_of(raw)}, not a tuple (output, weights); "
                    "if its output is the probabilities themselves, set attention_output='probs'.")
            probs = raw[1]
        else:
            probs = raw
        expected = (1, heads, tokens, tokens)
        if not isinstance(probs, torch.Tensor) or tuple(probs.shape) != expected:
            hint = ""
            if isinstance(probs, torch.Tensor) and probs.ndim == 3:
                hint = (" Weights averaged over heads (nn.MultiheadAttention's default) cannot be inspected per "
                        "head: call it with average_attn_weights=False.")
            elif isinstance(probs, tuple):
                hint = " If it returns (output, weights), set attention_output='tuple'."
            raise UnsupportedModelError(
                f"ModuleSpec.attention: {module} gave attention weights of shape {shape_of(probs)}; expected "
                f"{expected} = (batch, {heads} heads, {tokens} tokens, {tokens} tokens) with {tokens} = "
                f"{layout.num_prefix_tokens} prefix + {grid[0]}×{grid[1]} patches.{hint}")
        row_sums = probs.float().sum(-1)
        if probs.min() < 0 or not torch.allclose(row_sums, torch.ones_like(row_sums), atol=ROW_SUM_TOLERANCE):
            raise UnsupportedModelError(
                f"ModuleSpec.attention: {module} gave a {tuple(probs.shape)} tensor that is not attention "
                f"probabilities: rows sum to {float(row_sums.min()):.3g}..{float(row_sums.max()):.3g}, minimum "
                f"{float(probs.min()):.3g} (expected non-negative rows summing to 1: the softmax output).")
    if spec.labels:
        if not isinstance(output, torch.Tensor) or tuple(output.shape) != (1, len(spec.labels)):
            raise UnsupportedModelError(
                f"The model's forward returned {shape_of(output)}; with {len(spec.labels)} labels in the "
                f"ModuleSpec it must return logits of shape (1, {len(spec.labels)}).")
    elif not isinstance(output, torch.Tensor) or output.ndim != 2:
        raise UnsupportedModelError(f"The model's forward returned {shape_of(output)}; expected a (batch, "
                                    "features) tensor (or logits, with labels in the ModuleSpec).")


def parse_model_file(reference: str | os.PathLike) -> tuple[Path, str]:
    """"path/to/file.py:function" -> (path, function); the function defaults to `build`."""
    text = str(reference)
    path_text, function = text.rsplit(":", 1) if ":" in text and not text.endswith(".py") else (text, "build")
    if not path_text.endswith(".py") or not function.isidentifier():
        raise ModelNotFoundError(f"--model-file wants FILE.py:FUNCTION (e.g. examples/toy_vit.py:build); got {text!r}.")
    return Path(path_text), function


def model_file_name(reference: str | os.PathLike) -> str:
    """The name a model file's handle goes by: "file.py:function", without the folders."""
    path, function = parse_model_file(reference)
    return f"{path.name}:{function}"


def missing_weights(path: Path, function: str, weights: Path) -> WeightsNotFoundError:
    """The error for a hand-written model's weights file that is not there (yet): such weights come from
    training it, so it names the training scripts beside the model file (`train*.py`), or the untrained
    model as `function` builds it. Checked before the file is imported, so nothing is built first."""
    trainers = sorted(p for p in path.parent.glob("train*.py") if p.is_file())[:2]
    train = (f"beside {path.name} {'is a training script' if len(trainers) == 1 else 'are training scripts'}: "
             f"{' or '.join(f'python {p}' for p in trainers)} (see its --help for where it writes them)"
             if trainers else "train it and save its state dict as .safetensors")
    return WeightsNotFoundError(
        f"No weights file at {str(weights)!r}. A hand-written model's weights come from training it; {train}. "
        f"Or leave out --weights to inspect the model untrained, as {function}() makes it.",
        public=f"The weights file {weights.name!r} is not available.")


def load_model_file(reference: str | os.PathLike, weights: str | os.PathLike | None = None,
                    device: str | torch.device | None = None) -> ViTHandle:
    """Import the Python file `path.py:function` and open the model its function builds.

    OPERATOR ONLY: this runs the file's code. Call it with a path typed by whoever runs the program
    (`--model-file`), never with one that came from a web page or any other client.
    The function takes no arguments and returns `(model, spec)`, or the model alone when the file
    defines `SPEC`. `weights` (safetensors preferred; `.pth` read with `weights_only=True`) are loaded
    strictly; without them the model keeps the weights its function gave it.
    """
    path, function = parse_model_file(reference)
    if not path.is_file():
        raise ModelNotFoundError(f"--model-file {str(reference)!r}: there is no file {str(path)!r}.")
    if weights is not None and not Path(weights).is_file():
        raise missing_weights(path, function, Path(weights))
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    module_name = f"vit_inspect_model_file_{path.stem}_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module  # dataclasses and pickling look classes up here
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise ModelNotFoundError(f"Importing {path.name} failed: {type(exc).__name__}: {exc}") from None
    build = getattr(module, function, None)
    if not callable(build):
        raise ModelNotFoundError(f"{path.name} has no function {function!r}.")
    built = build()
    if isinstance(built, tuple) and len(built) == 2:
        model, spec = built
    else:
        model, spec = built, getattr(module, "SPEC", None)
    if not isinstance(model, nn.Module) or spec is None:
        raise UnsupportedModelError(f"{path.name}:{function}() must return (model, spec), or the model when the "
                                    "file defines SPEC.")
    if weights is not None:
        apply_state_dict(model, read_state_dict(weights), repr(Path(weights).name))
    return handle_from_module(model, spec, name=model_file_name(reference), device=device,
                              weights=str(weights) if weights is not None else f"as built by {function}()")
