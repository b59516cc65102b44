"""Helpers every test layer uses: repository paths, tiny random ViTs of every token layout, test images.

Plain names and functions only; pytest fixtures live in the conftest.py files."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
DEIT_WEIGHTS = SHARED / "models" / "deit_tiny_patch16_224.safetensors"
PHOTOS = REPO / "assets"
IMAGENET = SHARED / "data" / "imagenet_samples"


# name -> (timm VisionTransformer kwargs, input size (H, W)); every layout the tool must handle
TINY_TIMM = {
    "cls": (dict(img_size=32, patch_size=8), (32, 32)),
    "gap": (dict(img_size=32, patch_size=8, class_token=False, global_pool="avg"), (32, 32)),
    "distilled": (dict(img_size=32, patch_size=8, distilled=True), (32, 32)),
    "reg4": (dict(img_size=32, patch_size=8, reg_tokens=4, no_embed_class=True), (32, 32)),
    "no_embed_class": (dict(img_size=32, patch_size=8, no_embed_class=True), (32, 32)),
    "patch14": (dict(img_size=28, patch_size=14), (28, 28)),
    "patch16": (dict(img_size=32, patch_size=16), (32, 32)),
    "nonsquare": (dict(img_size=32, patch_size=8), (32, 48)),
}


EXPECTED_PREFIX = {"cls": 1, "gap": 0, "distilled": 2, "reg4": 5, "no_embed_class": 1,
                   "patch14": 1, "patch16": 1, "nonsquare": 1}


def make_layout(cls: bool, dist: int, reg: int, grid_h: int = 2, grid_w: int = 2, patch_h: int = 16,
                patch_w: int = 16):
    """A TokenLayout for hand-made arrays: class token or not, `dist` distillation and `reg` register
    tokens, then a grid_h x grid_w grid of patch_h x patch_w pixel patches."""
    from vit_inspect.core.tokens import TokenLayout

    return TokenLayout(int(cls) + dist + reg, cls, dist, reg, grid_h, grid_w, patch_h, patch_w)


def make_tiny_timm(kind: str, seed: int = 0):
    """A 2-block, 2-head, 32-dim random timm ViT of the given layout, in eval mode."""
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    kwargs, _ = TINY_TIMM[kind]
    kwargs = dict(kwargs)
    cls = VisionTransformerDistilled if kwargs.pop("distilled", False) else VisionTransformer
    torch.manual_seed(seed)
    return cls(embed_dim=32, depth=2, num_heads=2, num_classes=10, dynamic_img_size=True, **kwargs).eval()


def tiny_handle(kind: str, seed: int = 0):
    from vit_inspect.core.timm_models import handle_from_timm

    return handle_from_timm(make_tiny_timm(kind, seed), name=f"tiny-{kind}", device="cpu",
                            input_size=TINY_TIMM[kind][1])


def sharpen_attention(handle):
    """Random init gives near-uniform attention; larger query/key weights make every head matter."""
    with torch.no_grad():
        for attn in handle.attention_modules:
            for name in ("qkv", "q_proj", "k_proj"):
                if hasattr(attn, name):
                    getattr(attn, name).weight.mul_(8)
    return handle


def tiny_hf(distilled: bool = False, seed: int = 0):
    """A 2-layer random Hugging Face ViT (or DeiT with teacher) built from a config, no download."""
    from transformers import (
        DeiTConfig,
        DeiTForImageClassificationWithTeacher,
        ViTConfig,
        ViTForImageClassification,
    )

    torch.manual_seed(seed)
    common = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, num_labels=7)
    if distilled:
        return DeiTForImageClassificationWithTeacher(DeiTConfig(**common)).eval()
    return ViTForImageClassification(ViTConfig(**common)).eval()


def dog_and_cat(path) -> None:
    """Two shared ImageNet photos side by side at one height, a German shepherd left and a tabby right
    (a wide picture for the input-geometry tests)."""
    from PIL import Image

    height = 224
    pictures = [Image.open(IMAGENET / name).convert("RGB")
                for name in ("n02106662_German_shepherd.JPEG", "n02123045_tabby.JPEG")]
    pictures = [p.resize((round(p.width * height / p.height), height)) for p in pictures]
    pair = Image.new("RGB", (sum(p.width for p in pictures), height))
    pair.paste(pictures[0], (0, 0))
    pair.paste(pictures[1], (pictures[0].width, 0))
    pair.save(path)


def write_folder(tmp_path, count: int = 3):
    rng = np.random.default_rng(0)
    lines = ["filename,class_index"]
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(tmp_path / f"img{i}.png")
        lines.append(f"img{i}.png,{i % 10}")
    (tmp_path / "labels.csv").write_text("\n".join(lines) + "\n")
    return tmp_path / "labels.csv"


def offline_hub_cache(root: Path, repo: str, config) -> None:
    """`repo` in a Hugging Face cache at `root` as a download leaves it, with only its config.json."""
    revision = "0" * 40
    folder = root / f"models--{repo.replace('/', '--')}"
    config.save_pretrained(folder / "snapshots" / revision)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(revision)


def run_cli(capsys, *argv):
    """(exit code, stdout, stderr) of `vit-inspect ARGV...` run in this process."""
    from vit_inspect.cli.main import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_on_both_engines(capsys, argv_for) -> dict:
    """engine -> (exit code, stdout, stderr) of `vit-inspect` run with ``argv_for(engine)`` on the local engine
    and on a local Ray of 2 CPUs (started here if none runs, and shut down afterwards)."""
    import ray

    from vit_inspect.jobs.ray_engine import start_ray

    started = start_ray(num_cpus=2)
    try:
        return {engine: run_cli(capsys, *argv_for(engine)) for engine in ("local", "ray")}
    finally:
        if started:
            ray.shutdown()


def zero_biases(model: torch.nn.Module) -> None:
    """Every parameter whose name ends in "bias" set to 0 (LRP conservation holds exactly without biases)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.zero_()
