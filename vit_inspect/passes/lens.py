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

from torch import nn

from vit_inspect.core.families import adapter_of
from vit_inspect.core.families.base import Readout
from vit_inspect.core.handle import ViTHandle

NO_HEAD = "This model has no classification head, so there is no logit lens (nothing to read the tokens into)."


def lens_tokens(handle: ViTHandle) -> int:
    """How many leading tokens every `lens_readouts` readout reads: the prefix tokens (class, distillation,
    registers) for a class-token head behind a token-wise norm (LayerNorm or none), which reads token 0 (a
    distilled one 0 and 1), so that ``read(x[:, :k])`` equals ``read(x)`` without normalising every patch of
    every layer; 0 where a readout reads every token (pooled or attention-pooled heads, other norms)."""
    if not handle.has_head or not handle.num_prefix_tokens or handle.global_pool != "token":
        return 0
    found = adapter_of(handle).lens_norm(handle)  # (final norm, whether the head reads the prefix tokens alone)
    if found is None:
        return 0
    norm, pooled_by_token = found
    return handle.num_prefix_tokens if pooled_by_token and isinstance(norm, (nn.LayerNorm, nn.Identity)) else 0


def lens_readouts(handle: ViTHandle) -> dict[str, Readout]:
    """The lens readouts of this model by name: ``"readout"`` is the model's own head (its prediction
    after the last block); distilled DeiTs add ``"class"`` and ``"distillation"``, each token through its
    own head. Empty for a model without a head or whose head vit_inspect does not know."""
    return adapter_of(handle).lens_readouts(handle)
