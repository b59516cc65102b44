"""The model's own final norm and head, applied to the residual stream after any block (logit lens).

The logit lens (nostalgebraist 2020; for ViTs, ViT-Prisma) reads the residual stream after block l
through the model's final LayerNorm and classification head, as if the network stopped there. For
timm models this is exactly ``forward_head(norm(x_l))``, so class-token, pooled, attention-pooled and
distilled heads all read the tokens they read at the end (a class-token head behind a token-wise norm is
given the prefix tokens alone, `lens_tokens`: the same logits, without normalising every patch of every
layer); after the last block it reproduces the model's logits (checked on every pass: `lens_readouts`
results that do not are refused).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from vit_inspect.core.handle import ViTHandle

Readout = Callable[[torch.Tensor], torch.Tensor]  # (B, N, D) residual stream -> (B, num_classes) logits
NO_HEAD = "This model has no classification head, so there is no logit lens (nothing to read the tokens into)."


def lens_tokens(handle: ViTHandle) -> int:
    """How many leading tokens every `lens_readouts` readout reads: the prefix tokens (class, distillation,
    registers) for a class-token head behind a token-wise norm (LayerNorm or none), which reads token 0 (a
    distilled one 0 and 1), so that ``read(x[:, :k])`` equals ``read(x)`` without normalising every patch of
    every layer; 0 where a readout reads every token (pooled or attention-pooled heads, other norms)."""
    model = handle.model
    if not handle.has_head or not handle.num_prefix_tokens or handle.global_pool != "token":
        return 0
    if handle.family == "timm":
        norm = getattr(model, "norm", nn.Identity())
        pooled_by_token = getattr(model, "global_pool", None) == "token" and getattr(model, "attn_pool", None) is None
    elif handle.family == "hf":
        norm = getattr(model.base_model, "layernorm", None) or nn.Identity()
        pooled_by_token = True  # `lens_readouts` reads tokens 0 and 1 of a Hugging Face head itself
    else:
        return 0
    return handle.num_prefix_tokens if pooled_by_token and isinstance(norm, (nn.LayerNorm, nn.Identity)) else 0


def lens_readouts(handle: ViTHandle) -> dict[str, Readout]:
    """The lens readouts of this model by name: ``"readout"`` is the model's own head (its prediction
    after the last block); distilled DeiTs add ``"class"`` and ``"distillation"``, each token through its
    own head. Empty for a model without a head or whose head vit_inspect does not know."""
    if handle.clip is not None:  # the tower's own pooling, norm and projection, then the zero-shot head
        head, pooled = handle.clip.head, handle.clip.pooled_embedding
        return {"readout": lambda x: head(pooled(x))}
    if not handle.has_head or handle.family not in ("timm", "hf"):
        return {}
    model = handle.model
    if handle.family == "timm":
        norm = getattr(model, "norm", nn.Identity())
        readouts: dict[str, Readout] = {"readout": lambda x: model.forward_head(norm(x))}
        if handle.num_dist_tokens and hasattr(model, "head_dist"):
            readouts["class"] = lambda x: model.head(norm(x)[:, 0])
            readouts["distillation"] = lambda x: model.head_dist(norm(x)[:, 1])
        return readouts
    backbone = model.base_model
    norm = getattr(backbone, "layernorm", None) or nn.Identity()
    if handle.global_pool != "token":
        return {}
    if hasattr(model, "cls_classifier") and hasattr(model, "distillation_classifier"):
        return {"readout": lambda x: (model.cls_classifier(norm(x)[:, 0])
                                      + model.distillation_classifier(norm(x)[:, 1])) / 2,
                "class": lambda x: model.cls_classifier(norm(x)[:, 0]),
                "distillation": lambda x: model.distillation_classifier(norm(x)[:, 1])}
    classifier = getattr(model, "classifier", None)
    if isinstance(classifier, nn.Linear) and classifier.in_features == handle.embed_dim:
        return {"readout": lambda x: classifier(norm(x)[:, 0])}
    return {}
