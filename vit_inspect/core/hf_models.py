"""Hugging Face ViTs as `ViTHandle`s: a hub id or a local folder, with the settings of
a known image processor."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from vit_inspect.core import hub
from vit_inspect.core.errors import ModelNotFoundError, UnsupportedModelError, VitInspectError, WeightsError
from vit_inspect.core.handle import ViTHandle, resolve_device
from vit_inspect.core.images import Preprocess
from vit_inspect.core.timm_models import check_model_bytes
from vit_inspect.core.weights import check_finite

# The Hugging Face model types vit_inspect loads, each with the image processor its repositories use by default
_HF_DEFAULT_PROCESSOR = {"vit": "ViTImageProcessor", "deit": "DeiTImageProcessor", "beit": "BeitImageProcessor",
                         "data2vec-vision": "BeitImageProcessor", "dinov2": "BitImageProcessor",
                         "dinov2_with_registers": "BitImageProcessor", "vit_msn": "ViTImageProcessor"}

HF_MODEL_TYPES = tuple(_HF_DEFAULT_PROCESSOR)


_HF_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def load_hf(source: str, device: torch.device, *, pretrained: bool, input_size: tuple[int, int] | None,
             max_model_bytes: int | None = None) -> ViTHandle:
    """A Hugging Face ViT from a folder or hub id as a `ViTHandle` (see `load_model`): eager attention, float32,
    preprocessing from its image-processor file; sized from its config before weights are read when
    ``max_model_bytes`` is given."""
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
        check_model_bytes(shown, meta, max_model_bytes)
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
        from vit_inspect.core.geometry import check_input_size
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
