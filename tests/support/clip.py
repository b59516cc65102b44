"""Tiny random OpenCLIP models for the tests: a CLIP (OpenCLIP's own VisionTransformer, the CLIP tokenizer from
the wheel) and a SigLIP-style one (a timm trunk shaped as SigLIP's: no class token, attention pooling; its
tokenizer would come from the hub, so its tests give text embeddings instead). Their configurations are OpenCLIP model configs in
tests/support/open_clip/, registered under their file names."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

TINY_CLIP = "ViT-Tiny-8-test"  # 2 blocks, 2 heads, width 32, 8-px patches of a 32x32 input; 16-dim embeddings
TINY_SIGLIP = "ViT-Tiny-SigLIP-test"  # the trunk below, 192-dim embeddings
TINY_SIGLIP_TRUNK = "vit_tiny_patch16_siglip_test"  # timm: 4 blocks, 3 heads, width 192, no class token, MAP pooling
CONFIGS = Path(__file__).resolve().parent / "open_clip"


def register_tiny_configs() -> None:
    """Make OpenCLIP know the tiny architectures, and timm the SigLIP-shaped trunk (idempotent)."""
    import open_clip
    import timm

    if not timm.is_model(TINY_SIGLIP_TRUNK):
        timm.models.register_model(_vit_tiny_patch16_siglip_test)

    for name in (TINY_CLIP, TINY_SIGLIP):
        if name not in open_clip.list_models():
            open_clip.add_model_config(CONFIGS / f"{name}.json")


def _vit_tiny_patch16_siglip_test(pretrained: bool = False, **kwargs):
    """`vit_base_patch16_siglip_224` of timm at ViT-Ti width and 4 blocks: no class token, MAP pooling."""
    from timm.models.vision_transformer import VisionTransformer

    for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):  # timm's factory passes these
        kwargs.pop(key, None)
    return VisionTransformer(**(dict(patch_size=16, embed_dim=192, depth=4, num_heads=3, class_token=False,
                                     global_pool="map") | kwargs))


_vit_tiny_patch16_siglip_test.__name__ = TINY_SIGLIP_TRUNK  # timm registers a model under its function's name


def make_clip(arch: str = TINY_CLIP, seed: int = 0):
    """A random OpenCLIP model of ``arch`` (tiny configs registered), in eval mode."""
    import open_clip

    register_tiny_configs()
    torch.manual_seed(seed)
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        return open_clip.create_model(arch, pretrained=None).eval()
    finally:
        logging.disable(previous)


def clip_handle(arch: str = TINY_CLIP, seed: int = 0, labels=("cat", "dog", "car"), templates=("a photo of a {}.",),
                model=None):
    """A handle of a random OpenCLIP model with a small zero-shot list (the default ImageNet one costs minutes)."""
    from vit_inspect.core.open_clip_models import handle_from_open_clip

    return handle_from_open_clip(model if model is not None else make_clip(arch, seed), arch, device="cpu",
                                 labels=labels, templates=templates)


def save_clip(model, path: Path) -> Path:
    """The model's state dict as a safetensors file, as OpenCLIP's hub copies hold it."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def siglip_embeddings(model, count: int, seed: int = 1) -> torch.Tensor:
    """(count, E) random unit text embeddings standing in for SigLIP's tokenizer and text tower."""
    generator = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(count, model.visual.trunk.num_features, generator=generator),
                                         dim=-1)
