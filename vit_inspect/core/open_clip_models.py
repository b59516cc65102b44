"""OpenCLIP models (CLIP and SigLIP) as `ViTHandle`s: the vision tower inspected, the text tower beside it.

A name is ``open_clip:ARCH`` or ``open_clip:ARCH:TAG`` (OpenCLIP's own architecture names and pretrained tags,
as `open_clip.list_pretrained()` prints them: ``open_clip:ViT-B-16:openai``, ``open_clip:ViT-B-16-SigLIP:webli``).
Weights come from, in order: ``weights=FILE`` (safetensors only: OpenCLIP checkpoints are never unpickled);
``checkpoint_dir/open_clip_ARCH_TAG.safetensors`` (``open_clip_ARCH.safetensors`` without a tag); the tag's
``open_clip_model.safetensors`` on the Hugging Face hub, sized from the hub's listing before it is downloaded
(`hub.list_repo`), through `hub.hub_access` (fails fast offline, remembers failures). A tag also gives its
preprocessing (mean, std, resize mode) and activation (QuickGELU), also with a file. ``pretrained=False``:
random weights (tests).

The handle's forward is the vision tower followed by a `ZeroShotHead`: one logit s·cos(f, t) + b per zero-shot
label (default: the 1000 ImageNet class names, each the mean over OpenAI's seven selected templates, OpenCLIP's
``SIMPLE_IMAGENET_TEMPLATES``, computed on first use), then one per prompt (`with_prompts`). Attention capture:
OpenCLIP's own VisionTransformer runs `nn.MultiheadAttention`, which never hands out differentiable
probabilities; each is replaced by `SelfAttention`, the same computation written out as timm's `Attention`
(same parameters, same state-dict keys). SigLIP towers are timm VisionTransformers and are captured as such.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vit_inspect.core import hub
from vit_inspect.core.errors import (InputError, ModelNotFoundError, UnsupportedModelError, WeightsError,
                                     WeightsNotFoundError)
from vit_inspect.core.handle import ViTHandle, resolve_device
from vit_inspect.core.images import Preprocess
from vit_inspect.core.prompts import (DEFAULT_TEMPLATES, ClipParts, Prompt, ZeroShotHead, as_prompt, check_labels,
                                      label_embeddings)
from vit_inspect.core.timm_models import _timm_handle, check_model_bytes
from vit_inspect.core.weights import apply_state_dict, check_finite, fitted_state, read_state_dict

PREFIX = "open_clip:"
SAFE_WEIGHTS = "open_clip_model.safetensors"  # OpenCLIP's safetensors name on the hub (HF_SAFE_WEIGHTS_NAME)
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")
TEXT_CACHE = 512  # prompt embeddings kept per text tower
CLASSIFIER_CACHE = 4  # zero-shot lists kept per text tower


def is_open_clip_name(name: str) -> bool:
    return isinstance(name, str) and name.strip().startswith(PREFIX)


def parse_name(name: str) -> tuple[str, str | None]:
    """"open_clip:ARCH[:TAG]" -> (ARCH, TAG or None), both known to OpenCLIP; ModelNotFoundError otherwise."""
    try:
        import open_clip
    except ImportError:
        raise ModelNotFoundError("OpenCLIP models need open-clip-torch: pip install -r requirements-clip.txt (the "
                                 "[clip] extra).", public="This server has no OpenCLIP installed.") from None

    parts = name.strip()[len(PREFIX):].split(":")
    if len(parts) > 2 or not all(_PART.match(p) for p in parts):
        raise ModelNotFoundError(f"{name[:120]!r} is not an OpenCLIP name; write open_clip:ARCH or open_clip:ARCH:TAG, "
                                 "e.g. open_clip:ViT-B-16:openai.")
    arch, tag = parts[0], (parts[1] if len(parts) == 2 else None)
    if arch not in open_clip.list_models():
        near = [m for m in open_clip.list_models() if m.lower().startswith(arch.lower()[:5])][:6]
        raise ModelNotFoundError(f"OpenCLIP has no architecture {arch!r}"
                                 + (f"; similar: {', '.join(near)}." if near else "; see open_clip.list_models()."))
    if tag is not None and not open_clip.get_pretrained_cfg(arch, tag):
        tags = open_clip.list_pretrained_tags_by_model(arch)
        raise ModelNotFoundError(f"OpenCLIP's {arch!r} has no pretrained tag {tag!r}"
                                 + (f"; its tags are: {', '.join(tags[:10])}." if tags else "; it has no tagged weights."))
    return arch, tag


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """OpenCLIP logs a warning per random or partial build; the handle's `weights` says where weights came from."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def _create(arch: str, tag_cfg: dict, device: str = "cpu") -> nn.Module:
    import open_clip

    config = open_clip.get_model_config(arch) or {}
    if "hf_model_name" in config.get("text_cfg", {}):
        raise UnsupportedModelError(f"OpenCLIP's {arch!r} has a Hugging Face transformers text tower; vit_inspect "
                                    "loads OpenCLIP's own text towers only.")
    with _quiet():
        return open_clip.create_model(arch, pretrained=None, device=device,
                                      force_quick_gelu=bool(tag_cfg.get("quick_gelu", False)))


def local_weights_name(arch: str, tag: str | None) -> str:
    """The file name looked for in the checkpoint folder: open_clip_ARCH_TAG.safetensors (no tag: open_clip_ARCH)."""
    return f"open_clip_{arch}{'_' + tag if tag else ''}.safetensors"


def load_open_clip(name: str, weights: str | os.PathLike | None, device: torch.device, *, pretrained: bool,
                   input_size: tuple[int, int] | None, checkpoint_dir: Path, max_model_bytes: int | None = None,
                   labels: Sequence[str] | None = None, templates: Sequence[str] | None = None) -> ViTHandle:
    """The handle of OpenCLIP model ``name`` (see the module docstring for where its weights come from).

    Sized on the meta device first (`check_model_bytes`, both towers), before any weights are read or downloaded.
    ``labels`` (with ``templates``, default "a photo of a {}.") replace the default ImageNet zero-shot list."""
    import open_clip

    arch, tag = parse_name(name)
    tag_cfg = dict(open_clip.get_pretrained_cfg(arch, tag) or {}) if tag else {}
    with torch.device("meta"):
        meta = _create(arch, tag_cfg, device="meta")
    check_model_bytes(name, meta, max_model_bytes)
    local: Path | None = None
    if weights is not None:
        local = Path(weights)
        if local.suffix.lower() != ".safetensors":
            raise WeightsError(f"OpenCLIP weights are read from .safetensors only (never unpickled); {local.name!r} "
                               "is not one. Convert it with safetensors.torch.save_file(model.state_dict(), FILE).")
    elif pretrained and (checkpoint_dir / local_weights_name(arch, tag)).is_file():
        local = checkpoint_dir / local_weights_name(arch, tag)
    if local is not None:
        state = read_state_dict(local)
        fitted_state(meta, dict(state), repr(local.name))  # refused before the real model is built
        source = str(local)
    elif pretrained:
        state, source = _hub_state(name, arch, tag, tag_cfg, checkpoint_dir, max_model_bytes)
    else:
        state, source = None, "random"
    model = _create(arch, tag_cfg)
    if state is not None:
        apply_state_dict(model, state, repr(Path(source).name) if local is not None else repr(name))
    if tag_cfg:
        from open_clip.transform import merge_preprocess_dict
        model.visual.preprocess_cfg = merge_preprocess_dict(model.visual.preprocess_cfg, tag_cfg)
    return handle_from_open_clip(model, arch, name=name, device=device, input_size=input_size, weights=source,
                                 labels=labels, templates=templates)


def _hub_state(name: str, arch: str, tag: str | None, tag_cfg: dict, checkpoint_dir: Path,
               max_model_bytes: int | None) -> tuple[dict[str, torch.Tensor], str]:
    """The tag's safetensors weights from the hub (its cache first), sized from the listing before download."""
    import open_clip

    wanted = checkpoint_dir / local_weights_name(arch, tag)
    missing = (f"Weights for {name!r} are not available on this server (no network access to the Hugging Face "
               "hub and no local copy).")
    if tag is None:
        tags = open_clip.list_pretrained_tags_by_model(arch)
        raise WeightsNotFoundError(
            f"{name!r} names no weights. Give a pretrained tag (open_clip:{arch}:{tags[0] if tags else 'TAG'}"
            f"{'; tags: ' + ', '.join(tags[:8]) if tags else ''}), pass --weights FILE.safetensors, or put the file "
            f"at {wanted}.", public=f"{name!r} names no weights; add a pretrained tag (open_clip:{arch}:TAG).")
    repo, filename = os.path.split(str(tag_cfg.get("hf_hub", "")))  # "org/repo/" or "org/repo/file"
    if not repo:
        raise WeightsNotFoundError(f"OpenCLIP's tag {tag!r} of {arch!r} has no Hugging Face hub copy (only a download "
                                   f"URL, which vit_inspect does not use). Put its weights at {wanted} as safetensors.",
                                   public=missing)
    safe = SAFE_WEIGHTS if not filename or filename == "open_clip_pytorch_model.bin" else (
        filename if filename.endswith(".safetensors") else os.path.splitext(filename)[0] + ".safetensors")
    bound = None if max_model_bytes is None else max_model_bytes + hub.WEIGHTS_SLACK_BYTES
    with hub.hub_access(name) as online:
        if online:
            listing = hub.list_repo(repo)
            if safe not in listing.sizes:
                raise WeightsError(f"{repo!r} on the Hugging Face hub has no {safe}; its other weights files would have "
                                   "to be unpickled, which vit_inspect never does.")
            path = listing.fetch(safe, bound if bound is not None else 1 << 62)
        else:
            from huggingface_hub import try_to_load_from_cache
            cached = try_to_load_from_cache(repo, safe)
            if not isinstance(cached, str):
                raise WeightsNotFoundError(
                    f"Could not get weights for {name!r}: the Hugging Face hub is offline (HF_HUB_OFFLINE) or does not "
                    f"answer, and they are not in its cache. Put the weights file at {wanted} (or pass --weights "
                    "FILE.safetensors).", public=missing)
            path = Path(cached)
            if bound is not None and path.stat().st_size > bound:
                raise WeightsError(f"The cached {safe} of {repo!r} is larger than this server allows one model.")
    state = read_state_dict(path)
    check_finite(state.items(), "the hub's weights")
    return state, f"Hugging Face hub ({repo})"


class SelfAttention(nn.Module):
    """`nn.MultiheadAttention` self-attention (batch first), written out as timm's `Attention`.

    softmax(s·q kᵀ) v per head with s = d^-1/2 (Vaswani et al. 2017, Eq. 1), q, k, v = x W_inᵀ + b_in split in
    three, then ``out_proj``: the same function with the same parameters (``in_proj_weight``, ``in_proj_bias``,
    ``out_proj``, so the state-dict keys do not change). Like timm's, it runs fused (`scaled_dot_product_attention`)
    unless ``fused_attn`` is off, and then passes the probabilities through ``attn_drop`` (an identity), where
    capture, the attention store (``q_norm``/``k_norm``) and the LRP rules find them."""

    def __init__(self, attention: nn.MultiheadAttention) -> None:
        super().__init__()
        if (not attention.batch_first or not attention._qkv_same_embed_dim or attention.bias_k is not None
                or attention.add_zero_attn):
            raise UnsupportedModelError("This OpenCLIP tower's attention is not plain batch-first self-attention.")
        self.num_heads = attention.num_heads
        self.head_dim = attention.head_dim
        self.scale = self.head_dim ** -0.5
        self.in_proj_weight = attention.in_proj_weight  # (3D, D), shared with the original module
        self.in_proj_bias = attention.in_proj_bias  # (3D,) or None
        self.out_proj = attention.out_proj
        self.q_norm, self.k_norm, self.attn_drop = nn.Identity(), nn.Identity(), nn.Identity()
        self.fused_attn = True

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None,
                need_weights: bool = False, attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        batch, tokens, dim = query.shape  # self-attention: key and value are the query (ResidualAttentionBlock)
        qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)  # (B, N, 3D)
        q, k, v = qkv.reshape(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (B, H, N, d)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        else:
            scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, H, N, N)
            if attn_mask is not None:
                scores = scores + attn_mask
            x = self.attn_drop(scores.softmax(dim=-1)) @ v
        return self.out_proj(x.transpose(1, 2).reshape(batch, tokens, dim)), None


class TextTower:
    """OpenCLIP's text tower beside the vision tower: texts -> unit embeddings, kept per text (bounded)."""

    def __init__(self, model: nn.Module, arch: str, device: torch.device) -> None:
        self.model, self.arch, self.device = model, arch, device
        self._tokenizer = None
        self._lock = threading.Lock()
        self._texts: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._classifiers: OrderedDict[tuple, torch.Tensor] = OrderedDict()

    def tokenizer(self):
        """OpenCLIP's tokenizer for this architecture. CLIP's ships inside the wheel; SigLIP's comes from the hub."""
        import open_clip

        if self._tokenizer is None:
            config = open_clip.get_model_config(self.arch) or {}
            source = config.get("text_cfg", {}).get("hf_tokenizer_name")
            if not source:
                self._tokenizer = open_clip.get_tokenizer(self.arch)
            else:
                try:
                    with hub.hub_access(f"tokenizer {source}"), _quiet():
                        self._tokenizer = open_clip.get_tokenizer(self.arch)
                except Exception as exc:
                    raise WeightsNotFoundError(
                        f"{self.arch!r}'s tokenizer comes from the Hugging Face hub ({source!r}), which is not reachable "
                        f"({type(exc).__name__}); give the prompt's text embedding instead (Prompt(text, embedding)).",
                        public="This model's tokenizer comes from the Hugging Face hub, which this server cannot "
                               "reach, so it cannot read prompts.") from None
        return self._tokenizer

    def _tokens(self, texts: Sequence[str]) -> torch.Tensor:
        tokenizer = self.tokenizer()
        encode, context = getattr(tokenizer, "encode", None), getattr(tokenizer, "context_length", None)
        if callable(encode) and context:
            for text in texts:
                count = len(encode(text)) + 2  # start and end of text
                if count > context:
                    raise InputError(f"The prompt {text[:40]!r}... is {count} tokens long; this text tower reads at "
                                     f"most {context}.")
        return tokenizer(list(texts)).to(self.device)

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """(n, E) float32 unit text embeddings of ``texts`` (checked prompts), each encoded once while kept."""
        with self._lock:
            todo = [t for t in dict.fromkeys(texts) if t not in self._texts]
            if todo:
                with torch.no_grad():
                    encoded = self.model.encode_text(self._tokens(todo), normalize=True).float()
                for text, row in zip(todo, encoded):
                    self._texts[text] = row
            for text in texts:
                self._texts.move_to_end(text)
            rows = torch.stack([self._texts[t] for t in texts])
            while len(self._texts) > TEXT_CACHE:
                self._texts.popitem(last=False)
            return rows

    def classifier(self, labels: tuple[str, ...], templates: tuple[str, ...]) -> torch.Tensor:
        """(K, E) zero-shot rows: per label the normalised mean of its unit embeddings over ``templates``
        (`open_clip.build_zero_shot_classifier`, CLIP Sec. 3.1.4), kept for the last CLASSIFIER_CACHE lists."""
        import open_clip

        key = (labels, templates)
        with self._lock:
            if key not in self._classifiers:
                tokenizer = self.tokenizer()
                self._tokens([max((t.format(label) for t in templates for label in labels), key=len)])
                weights = open_clip.build_zero_shot_classifier(self.model, tokenizer, labels, templates,
                                                               num_classes_per_batch=max(1, 64 // len(templates)),
                                                               device=self.device)  # (E, K)
                self._classifiers[key] = weights.T.float()
                while len(self._classifiers) > CLASSIFIER_CACHE:
                    self._classifiers.popitem(last=False)
            self._classifiers.move_to_end(key)
            return self._classifiers[key]


def default_zero_shot() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The 1000 ImageNet class names and OpenAI's seven selected templates (OpenCLIP's metadata)."""
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, SIMPLE_IMAGENET_TEMPLATES

    templates = tuple(t("{}") if callable(t) else t for t in SIMPLE_IMAGENET_TEMPLATES)
    return tuple(IMAGENET_CLASSNAMES), templates


def _head(text: TextTower, model: nn.Module, labels: tuple[str, ...], templates: tuple[str, ...],
          prompts: tuple[Prompt, ...], given: torch.Tensor | None = None) -> ZeroShotHead:
    def rows() -> torch.Tensor:
        parts = [text.classifier(labels, templates) if given is None else given.to(text.device, torch.float32)]
        typed = [p for p in prompts if p.embedding is None]
        encoded = dict(zip((p.text for p in typed), text.embed([p.text for p in typed]))) if typed else {}
        for prompt in prompts:
            row = encoded.get(prompt.text) if prompt.embedding is None else torch.from_numpy(prompt.embedding)
            if row.shape[-1] != parts[0].shape[-1]:
                raise InputError(f"The embedding of {prompt.text[:40]!r} has {row.shape[-1]} values; this model's "
                                 f"text embeddings have {parts[0].shape[-1]}.")
            parts.append(row.to(parts[0].device, torch.float32).view(1, -1))
        return torch.cat(parts)
    bias = float(model.logit_bias.detach()) if getattr(model, "logit_bias", None) is not None else 0.0
    return ZeroShotHead(rows, float(model.logit_scale.detach().exp()), bias)


def with_zero_shot(handle: ViTHandle, labels: Sequence[str | Prompt] | None = None,
                   templates: Sequence[str] | None = None, prompts: Sequence[str | Prompt] = ()) -> ViTHandle:
    """The same model with another zero-shot list (``labels``, each averaged over ``templates``, or all given as
    `Prompt`s with their embeddings; None keeps the handle's) and ``prompts`` as columns after the labels.
    Nothing is encoded until the first forward."""
    parts = handle.clip
    if parts is None:
        raise InputError(f"{handle.name!r} is not a CLIP-style model: it has no text tower, so it takes no prompts.")
    given = parts.label_embeddings
    if labels is None:
        labels, templates = parts.labels, parts.templates if templates is None else templates
    else:
        labels, given = label_embeddings(labels)
    labels, templates = check_labels(labels, DEFAULT_TEMPLATES if templates is None else templates)
    prompts = tuple(as_prompt(p) for p in prompts)
    head = _head(parts.text, handle.model, labels, templates, prompts, given)
    head = head.to(handle.device)
    image_embedding = parts.image_embedding
    return dataclasses.replace(
        handle, labels=labels, _forward=lambda pixels: head(image_embedding(pixels)),
        clip=dataclasses.replace(parts, head=head, labels=labels, templates=templates, prompts=prompts,
                                 label_embeddings=given))


def handle_from_open_clip(model: nn.Module, arch: str, name: str | None = None, device: str | torch.device | None = None,
                          input_size: tuple[int, int] | None = None, weights: str = "given module",
                          labels: Sequence[str | Prompt] | None = None,
                          templates: Sequence[str] | None = None) -> ViTHandle:
    """A handle for an OpenCLIP model built for architecture ``arch`` (its vision tower's attention modules are
    replaced by `SelfAttention`, an exact equivalent sharing their parameters)."""
    device = resolve_device(device)
    model = model.eval().to(device)
    visual = model.visual
    preprocess = _preprocess(getattr(visual, "preprocess_cfg", None) or {}, input_size)
    from open_clip.timm_model import TimmModel
    from open_clip.transformer import VisionTransformer
    if isinstance(visual, VisionTransformer):
        base = _vision_transformer_handle(visual, preprocess)
    elif isinstance(visual, TimmModel):
        base = _timm_trunk_handle(visual, name or arch, device, preprocess)
    else:
        raise UnsupportedModelError(f"OpenCLIP's {arch!r} has a {type(visual).__name__} image tower, not a Vision "
                                    "Transformer vit_inspect can inspect.")
    text = TextTower(model, arch, device)
    if labels is None:
        labels, templates = default_zero_shot()
    labels, given = label_embeddings(labels)
    labels, templates = check_labels(labels, DEFAULT_TEMPLATES if templates is None else templates)
    head = _head(text, model, labels, templates, (), given).to(device)
    image_embedding, pooled, legrad = base.pop("readouts")
    parts = ClipParts(text=text, head=head, image_embedding=image_embedding, pooled_embedding=pooled,
                      legrad_embedding=legrad, labels=labels, templates=templates, label_embeddings=given)
    return ViTHandle(name=name or f"{PREFIX}{arch}", family="open_clip", model=model, device=device, weights=weights,
                     labels=labels, preprocess=preprocess, _forward=lambda pixels: head(image_embedding(pixels)),
                     clip=parts, **base)


def _preprocess(cfg: dict, input_size: tuple[int, int] | None) -> Preprocess:
    """OpenCLIP's eval transform (`image_transform`) as a `Preprocess`: 'shortest' resizes the shorter side and
    crops the centre, 'squash' resizes to the size; 'longest' (resize and pad) is refused."""
    from open_clip.transform import PreprocessCfg, merge_preprocess_dict

    cfg = merge_preprocess_dict(PreprocessCfg(), cfg)  # OpenCLIP's defaults under what the model says
    size = cfg.get("size", 224)
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    mode = {"shortest": "crop", "squash": "squash"}.get(cfg.get("resize_mode", "shortest"))
    if mode is None:
        raise UnsupportedModelError(f"OpenCLIP's resize mode {cfg.get('resize_mode')!r} (resize and pad) is not one "
                                    "vit_inspect reproduces.")
    return Preprocess(input_size=tuple(input_size or (int(height), int(width))), mode=mode, crop_pct=1.0,
                      interpolation="bilinear" if cfg.get("interpolation") == "bilinear" else "bicubic",
                      mean=tuple(float(v) for v in cfg["mean"]), std=tuple(float(v) for v in cfg["std"]))


def _vision_transformer_handle(visual: nn.Module, preprocess: Preprocess) -> dict:
    """The handle fields of OpenCLIP's own VisionTransformer (class token, learned position embeddings)."""
    from timm.layers import resample_abs_pos_embed

    if visual.attn_pool is not None or not isinstance(visual.conv1, nn.Conv2d):
        raise UnsupportedModelError("OpenCLIP towers with an attentional pooler (CoCa) are not supported.")
    blocks = tuple(visual.transformer.resblocks)
    for block in blocks:
        if not isinstance(block.attn, (nn.MultiheadAttention, SelfAttention)):
            raise UnsupportedModelError(f"OpenCLIP block {type(block).__name__} has no plain multi-head attention.")
        if isinstance(block.attn, nn.MultiheadAttention):
            block.attn = SelfAttention(block.attn)
    native_grid = tuple(int(g) for g in visual.grid_size)
    patch_size = tuple(int(p) for p in visual.patch_size)

    def pos_embed(grid: tuple[int, int]) -> torch.Tensor:  # (gh*gw, D), resampled as timm does for a ViT
        table = visual.positional_embedding.unsqueeze(0)  # (1, 1 + gh*gw, D)
        if tuple(grid) == native_grid:
            return table[0, 1:]
        return resample_abs_pos_embed(table, new_size=list(grid), old_size=list(native_grid), num_prefix_tokens=1)[0, 1:]

    def tokens_in(pixels: torch.Tensor) -> torch.Tensor:  # `VisionTransformer._embeds`, any whole-patch input size
        x = visual.conv1(pixels)  # (B, D, gh, gw)
        grid = tuple(x.shape[-2:])
        x = x.flatten(2).transpose(1, 2)  # (B, gh*gw, D)
        cls = visual.class_embedding.to(x.dtype).view(1, 1, -1).expand(x.shape[0], -1, -1)
        pos = torch.cat([visual.positional_embedding[:1], pos_embed(grid)]).to(x.dtype)
        return visual.ln_pre(visual.patch_dropout(torch.cat([cls, x], dim=1) + pos))

    def pooled(tokens: torch.Tensor) -> torch.Tensor:  # the tower's readout: pool, ln_post, proj
        features = visual._pool(tokens)[0]
        return features @ visual.proj if visual.proj is not None else features

    def legrad(tokens: torch.Tensor) -> torch.Tensor:  # LeGrad's CLIP readout: mean of all tokens, ln_post, proj
        features = visual.ln_post(tokens.mean(dim=1))
        return features @ visual.proj if visual.proj is not None else features

    def image_embedding(pixels: torch.Tensor) -> torch.Tensor:
        return pooled(visual.transformer(tokens_in(pixels)))

    return dict(patch_size=patch_size, native_grid=native_grid, num_prefix_tokens=1, has_class_token=True,
                num_dist_tokens=0, num_reg_tokens=0, no_embed_class=False,
                global_pool="token" if visual.pool_type == "tok" else "avg", depth=len(blocks),
                num_heads=int(blocks[0].attn.num_heads), embed_dim=int(visual.conv1.out_channels),
                blocks=blocks, attention_modules=tuple(b.attn for b in blocks),
                norm1_modules=tuple(b.ln_1 for b in blocks), patch_projection=visual.conv1, _pos_embed=pos_embed,
                readouts=(image_embedding, pooled, legrad))


def _timm_trunk_handle(visual: nn.Module, name: str, device: torch.device, preprocess: Preprocess) -> dict:
    """The handle fields of a timm trunk (SigLIP), its input size made dynamic as timm's own option does."""
    from timm.layers import Format

    trunk = visual.trunk
    patch_embed = getattr(trunk, "patch_embed", None)
    if patch_embed is not None and hasattr(trunk, "dynamic_img_size"):
        trunk.dynamic_img_size = True
        patch_embed.strict_img_size, patch_embed.flatten, patch_embed.output_fmt = False, False, Format.NHWC
        if hasattr(patch_embed, "dynamic_img_size"):
            patch_embed.dynamic_img_size = True
    base = _timm_handle(trunk, name, device, "", preprocess.input_size)
    norm = getattr(trunk, "norm", nn.Identity())

    def pooled(tokens: torch.Tensor) -> torch.Tensor:  # timm's head after its final norm, then OpenCLIP's head
        return visual.head(trunk.forward_head(norm(tokens)))

    def image_embedding(pixels: torch.Tensor) -> torch.Tensor:
        return visual(pixels)

    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)
              if f.name not in ("name", "family", "model", "device", "weights", "labels", "preprocess", "_forward",
                                "clip")}
    return {**fields, "readouts": (image_embedding, pooled, pooled)}


SCORES = ("logit", "cosine")  # what a gradient method explains: the model's logit, or the cosine similarity


def prompt_view(handle: ViTHandle, target, contrast=None) -> tuple[ViTHandle, int | None, int | None,
                                                                   Prompt | None, Prompt | None]:
    """(handle, target column, contrast column, target prompt, contrast prompt) for targets that may be prompts.

    A prompt (text or `Prompt`) becomes a column of the zero-shot head after the labels (`with_zero_shot`): the
    target's first, then the contrast's. Class indices pass through unchanged, and so does a handle given none."""
    def is_prompt(value) -> bool:
        return isinstance(value, (str, Prompt))

    if not is_prompt(target) and not is_prompt(contrast):
        return handle, target, contrast, None, None
    prompt = as_prompt(target) if is_prompt(target) else None
    versus = as_prompt(contrast, "versus prompt") if is_prompt(contrast) else None
    if prompt is not None and versus is not None and prompt.text == versus.text and (
            prompt.embedding is None and versus.embedding is None):
        raise InputError("The versus prompt is the prompt itself; write another prompt to compare with.")
    view = with_zero_shot(handle, prompts=[p for p in (prompt, versus) if p is not None])
    first = len(view.labels)
    column = first if prompt is not None else target
    other = (first + int(prompt is not None)) if versus is not None else contrast
    return view, column, other, prompt, versus


def score_kind(handle: ViTHandle, score: str | None) -> str:
    """The score a gradient method explains: "cosine" by default for a CLIP-style model, "logit" otherwise."""
    kind = ("cosine" if handle.clip is not None else "logit") if score is None else score
    if kind not in SCORES:
        raise InputError(f"Unknown score {score!r}; use one of {', '.join(SCORES)}.")
    if kind == "cosine" and handle.clip is None:
        raise InputError(f"{handle.name!r} has no text tower: its score is a logit, not a cosine similarity.")
    return kind


def score_factor(handle: ViTHandle, kind: str) -> float:
    """Units of the explained score per unit of logit: 1 for the logit; 1/s for the cosine, since a zero-shot
    logit is s·cos + b (the constant b drops out of every gradient and of a difference of two columns)."""
    return 1.0 / handle.clip.head.scale if kind == "cosine" else 1.0
