"""timm ViTs as `ViTHandle`s: by name, with a weights file, or from the hub through timm."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn

from vit_inspect.core import hub
from vit_inspect.core.errors import ModelNotFoundError, ModelTooLargeError, UnsupportedModelError, WeightsNotFoundError
from vit_inspect.core.handle import DEFAULT_MODEL, ViTHandle, resolve_device
from vit_inspect.core.images import Preprocess
from vit_inspect.core.weights import apply_state_dict, check_finite, fitted_state, read_state_dict


def load_timm(name: str, weights: str | os.PathLike | None, device: torch.device, *, pretrained: bool,
               input_size: tuple[int, int] | None, checkpoint_dir: Path, max_model_bytes: int | None = None) -> ViTHandle:
    """A timm ViT by name as a `ViTHandle` (see `load_model`): weights from ``weights``, else
    ``checkpoint_dir/<name>.safetensors`` (or ``.pth``), else the hub; built on the meta device first and
    refused when its float32 parameters exceed ``max_model_bytes``."""
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
    meta = _meta_model(name)  # keys, shapes and size without memory: refuse before any weights are looked for
    if meta is not None:
        check_inspectable(meta, name)
        check_model_bytes(name, meta, max_model_bytes)
    if weights:
        local: Path | None = Path(weights)
    elif pretrained:
        local = next((checkpoint_dir / f"{name}{s}" for s in (".safetensors", ".pth")
                      if (checkpoint_dir / f"{name}{s}").is_file()), None)
    else:
        local = None
    from_hub = pretrained and local is None
    state = read_state_dict(local) if local is not None else None  # read and checked before building
    if meta is not None:
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
    `_create_timm` refuses it, so it is named as no ViT before its weights are looked for."""
    try:
        with torch.device("meta"):
            return _create_timm(name, pretrained=False)
    except UnsupportedModelError:
        raise
    except Exception:
        return None


def check_model_bytes(name: str, meta: nn.Module, max_bytes: int | None) -> None:
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


def cached_on_this_machine(name: str) -> bool:
    """Whether the hub weights of a timm name (or the config of a Hugging Face id) are in the local hub cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    if "/" in name:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    return _hub_files_cached(_pretrained_cfg(name) or {})


def _hub_files_cached(cfg: dict) -> bool:
    """Whether the hub weights a timm config names are in the local hub cache (False without a hub id)."""
    from huggingface_hub import try_to_load_from_cache

    repo = cfg.get("hf_hub_id")
    if not repo:
        return False
    repo, _, revision = repo.partition("@")
    filenames = [cfg["hf_hub_filename"]] if cfg.get("hf_hub_filename") else ["model.safetensors", "pytorch_model.bin",
                                                                            "open_clip_pytorch_model.bin"]
    return any(isinstance(try_to_load_from_cache(repo, f, revision=revision or None), str) for f in filenames)


def _offline_and_not_cached(cfg: dict) -> bool:
    """True when the hub is switched off (HF_HUB_OFFLINE) and the hub weights of `cfg` are not in the
    local cache, so that building the model could only end in a failed download."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    if not constants.HF_HUB_OFFLINE or not cfg.get("hf_hub_id"):
        return False
    return not _hub_files_cached(cfg)


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


def check_inspectable(model: nn.Module, name: str) -> None:
    """UnsupportedModelError unless `model` (built, or on the meta device) is a plain ViT: a patch embedding
    and blocks whose attention is one softmax over every token. Windowed attention (Swin: attention inside
    shifted windows, in stages that merge patches) is named as such."""
    blocks = tuple(getattr(model, "blocks", ()))
    patch_embed = getattr(model, "patch_embed", None)
    attn = tuple(getattr(b, "attn", None) for b in blocks)
    if (blocks and patch_embed is not None and isinstance(getattr(patch_embed, "proj", None), nn.Conv2d)
            and all(a is not None and hasattr(a, "attn_drop") and hasattr(a, "fused_attn") for a in attn)):
        return
    if not blocks and any(hasattr(module, "window_size") for module in model.modules()):
        raise UnsupportedModelError(
            f"{name!r} uses windowed attention (each head attends only inside a local window, and the windows "
            "shift and merge from stage to stage), so it has no attention over the whole image to inspect; "
            "try a 'vit_', 'deit_' or 'deit3_' model.")
    raise UnsupportedModelError(
        f"{name!r} is not a plain ViT (patch embedding + blocks with standard attention); "
        "vit_inspect cannot capture its attention maps.")


def _timm_handle(model: nn.Module, name: str, device: torch.device, source: str,
                 input_size: tuple[int, int] | None) -> ViTHandle:
    from timm.data import ImageNetInfo, infer_imagenet_subset, resolve_data_config
    from timm.layers import resample_abs_pos_embed

    check_inspectable(model, name)
    blocks = tuple(model.blocks)
    patch_embed = model.patch_embed
    attn = tuple(b.attn for b in blocks)
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
