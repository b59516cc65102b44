"""The model's own final norm and head, applied to the residual stream after any block (logit lens).

The logit lens (nostalgebraist 2020; for ViTs, ViT-Prisma) reads the residual stream after block l
through the model's final LayerNorm and classification head, as if the network stopped there. For
timm models this is exactly ``forward_head(norm(x_l))``, so class-token, pooled, attention-pooled and
distilled heads all read the tokens they read at the end (a class-token head behind a token-wise norm gets
the prefix tokens alone: the same logits, without normalising every patch of every layer); after the last block it reproduces the
model's logits (checked on every pass: `lens_readouts` results that do not are refused).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .models import ViTHandle

Readout = Callable[[torch.Tensor], torch.Tensor]  # (B, N, D) residual stream -> (B, num_classes) logits
NO_HEAD = "This model has no classification head, so there is no logit lens (nothing to read the tokens into)."


def lens_readouts(handle: ViTHandle) -> dict[str, Readout]:
    """The lens readouts of this model by name: ``"readout"`` is the model's own head (its prediction
    after the last block); distilled DeiTs add ``"class"`` and ``"distillation"``, each token through its
    own head. Empty for a model without a head or whose head vit_inspect does not know."""
    if not handle.has_head or handle.family not in ("timm", "hf"):
        return {}
    model = handle.model
    if handle.family == "timm":
        norm = getattr(model, "norm", nn.Identity())
        readouts: dict[str, Readout] = {"readout": lambda x: model.forward_head(norm(x))}
        prefix = int(getattr(model, "num_prefix_tokens", 0))
        if (getattr(model, "global_pool", None) == "token" and getattr(model, "attn_pool", None) is None
                and isinstance(norm, (nn.LayerNorm, nn.Identity)) and prefix):
            # a class-token head reads token 0 (a distilled one 0 and 1) and the norm works token by token:
            # normalising the prefix tokens alone gives the same logits without normalising every patch
            readouts["readout"] = lambda x: model.forward_head(norm(x[:, :prefix]))
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
