"""Text prompts as targets: what a prompt may be, and the zero-shot head that scores an image against prompts.

A CLIP-style model (Radford et al. 2021, "Learning Transferable Visual Models From Natural Language
Supervision", Sec. 2.3 and Fig. 3) embeds an image as f (the vision tower) and a text as t (the text tower);
its score for the pair is the cosine similarity cos(f, t) = f·t / (‖f‖ ‖t‖), and its logit is
s · cos(f, t) + b with the learned temperature s (`logit_scale.exp()`) and, for SigLIP (Zhai et al. 2023),
a learned bias b (CLIP: b = 0). Zero-shot classification takes one unit text embedding per label, the
normalised mean of the label's embeddings over prompt templates (CLIP Sec. 3.1.4), and ranks the labels by
their logits.

`ZeroShotHead` is that last step as a module: image embeddings (B, E) -> logits (B, C), one column per label
or prompt. Its normalisation is a module of its own (`UnitNormalize`), so that the LRP rules can hold ‖f‖
constant in the backward (`vit_inspect.passes.relevance`), as they hold a LayerNorm's σ.

Prompts come from users, so `check_prompt` bounds them and refuses what no tokenizer should see.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vit_inspect.core.errors import InputError

MAX_PROMPT_CHARS = 300  # characters in one prompt; CLIP reads 77 tokens (about 300 characters of English)
MAX_LABELS = 2000  # zero-shot labels in one list (ImageNet has 1000)
MAX_TEMPLATES = 100  # prompt templates per label (OpenAI's full ImageNet set has 80)
DEFAULT_TEMPLATES = ("a photo of a {}.",)  # a template for a user's labels given as bare names


@dataclass(frozen=True)
class Prompt:
    """A text target: its text, and optionally its text embedding given instead of the text tower's.

    A given embedding serves models whose tokenizer cannot be had (SigLIP's comes from the hub) and tests;
    the text then only names it in captions and records."""

    text: str  # the prompt as the user wrote it (checked by `check_prompt`)
    embedding: np.ndarray | None = field(default=None, compare=False, repr=False)  # (E,) text embedding, any norm


def check_prompt(text: object, what: str = "prompt") -> str:
    """The prompt, stripped, or InputError with a sentence: not text, empty, longer than MAX_PROMPT_CHARS,
    or holding control or format characters (a tokenizer would silently drop or mangle them)."""
    if not isinstance(text, str):
        raise InputError(f"The {what} must be text, not {type(text).__name__}.")
    stripped = text.strip()
    if not stripped:
        raise InputError(f"The {what} is empty; type a short description such as 'a photo of a cat'.")
    if len(stripped) > MAX_PROMPT_CHARS:
        raise InputError(f"The {what} has {len(stripped):,} characters; at most {MAX_PROMPT_CHARS} are read "
                         "(the text tower reads 77 tokens).")
    bad = sorted({c for c in stripped if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn")
                  and c not in " "})
    if bad:
        shown = ", ".join(f"U+{ord(c):04X}" for c in bad[:3])
        raise InputError(f"The {what} holds control or invisible characters ({shown}); use plain text.")
    return stripped


def as_prompt(value: str | Prompt, what: str = "prompt") -> Prompt:
    """A `Prompt` from a string or a Prompt, its text checked; a given embedding must be a finite vector."""
    if isinstance(value, Prompt):
        embedding = value.embedding
        if embedding is not None:
            embedding = np.asarray(embedding, dtype=np.float32).reshape(-1)
            if not embedding.size or not np.all(np.isfinite(embedding)) or not np.any(embedding):
                raise InputError(f"The {what}'s embedding must be a finite, non-zero vector.")
        return Prompt(check_prompt(value.text, what), embedding)
    return Prompt(check_prompt(value, what))


def label_embeddings(labels) -> tuple[tuple[str, ...], torch.Tensor | None]:
    """(names, (K, E) embeddings or None) of zero-shot labels given as text, or all as `Prompt`s with embeddings
    (a model whose tokenizer cannot be had); checked as `check_labels` and `as_prompt` check them."""
    labels = tuple(labels)
    given = [isinstance(label, Prompt) and label.embedding is not None for label in labels]
    if not any(given):
        return tuple(label.text if isinstance(label, Prompt) else label for label in labels), None
    if not all(given):
        raise InputError("Give every zero-shot label as text, or every one with its embedding; not a mix.")
    prompts = [as_prompt(label, "label") for label in labels]
    if len({p.embedding.shape for p in prompts}) != 1:
        raise InputError("The zero-shot labels' embeddings differ in length.")
    return tuple(p.text for p in prompts), torch.from_numpy(np.stack([p.embedding for p in prompts]))


def read_labels(value: str) -> tuple[str, ...]:
    """The zero-shot labels an operator gives: a text file with one label per line, else a comma-separated
    list; blank entries dropped (`check_labels` checks the rest)."""
    from pathlib import Path

    path = Path(value)
    text = path.read_text(encoding="utf-8") if path.is_file() else value.replace(",", "\n")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def check_labels(labels, templates) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(labels, templates) checked as prompts (each template holds one '{}'), within MAX_LABELS / MAX_TEMPLATES."""
    labels, templates = tuple(labels), tuple(templates)
    if not labels:
        raise InputError("The zero-shot list is empty; give at least one label.")
    if len(labels) > MAX_LABELS:
        raise InputError(f"The zero-shot list has {len(labels):,} labels; at most {MAX_LABELS:,} are scored.")
    if not templates or len(templates) > MAX_TEMPLATES:
        raise InputError(f"Give between 1 and {MAX_TEMPLATES} templates; got {len(templates)}.")
    templates = tuple(check_prompt(t, "template") for t in templates)
    if any(t.count("{}") != 1 for t in templates):
        raise InputError("Each template holds '{}' exactly once, where the label goes (e.g. 'a photo of a {}.').")
    labels = tuple(check_prompt(label, "label") for label in labels)
    for template in templates:
        check_prompt(template.format(max(labels, key=len)), "label in its template")
    return labels, templates


class UnitNormalize(nn.Module):
    """x / ‖x‖₂ over the last axis (an image embedding onto the unit sphere)."""

    def __init__(self, eps: float = 1e-12) -> None:
        super().__init__()
        self.eps = eps  # F.normalize's floor on the norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1, eps=self.eps)


class ZeroShotHead(nn.Module):
    """Image embeddings (B, E) -> logits (B, C): s · cos(f, t_c) + b for C unit text embeddings t_c.

    ``rows`` gives the (C, E) text embeddings when first needed (the default ImageNet list costs thousands of
    text-tower passes), then they are kept. ``scale`` is the model's temperature s = exp(logit_scale),
    ``bias`` its logit bias b (0 for CLIP). Dividing a column by s after subtracting b gives the cosine."""

    def __init__(self, rows: Callable[[], torch.Tensor], scale: float, bias: float) -> None:
        super().__init__()
        self.normalize = UnitNormalize()
        self.scale = float(scale)  # s, the logit per unit of cosine similarity
        self.bias = float(bias)  # b, the logit at cosine 0
        self._rows = rows
        self._kept: torch.Tensor | None = None

    def rows(self) -> torch.Tensor:
        """(C, E) unit text embeddings, one per column."""
        if self._kept is None:
            self._kept = F.normalize(self._rows().detach().float(), dim=-1)
        return self._kept

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        rows = self.rows().to(features.device, features.dtype)
        return self.scale * (self.normalize(features) @ rows.T) + self.bias  # (B, C)

    def cosine(self, logits: torch.Tensor) -> torch.Tensor:
        """The cosine similarities behind ``logits`` of this head: (logits - b) / s."""
        return (logits - self.bias) / self.scale


@dataclass(frozen=True, eq=False)
class ClipParts:
    """What a CLIP-style handle has beyond a classifier's: the text tower beside the vision tower, the
    zero-shot head, and the vision tower's readouts from any block's tokens."""

    text: object  # the text tower: `embed(texts) -> (n, E)` and `classifier(labels, templates) -> (K, E)`
    head: ZeroShotHead  # image embedding -> one logit per label, then per prompt
    image_embedding: Callable[[torch.Tensor], torch.Tensor]  # (B, 3, H, W) pixels -> (B, E) image embedding f
    pooled_embedding: Callable[[torch.Tensor], torch.Tensor]  # (B, N, D) block tokens -> (B, E), the model's readout
    legrad_embedding: Callable[[torch.Tensor], torch.Tensor]  # (B, N, D) block tokens -> (B, E), LeGrad's readout
    labels: tuple[str, ...]  # the zero-shot labels, one per head column before the prompts
    templates: tuple[str, ...]  # the templates each label is averaged over
    prompts: tuple[Prompt, ...] = ()  # the prompts whose columns follow the labels
    label_embeddings: torch.Tensor | None = None  # (K, E) given label embeddings (no text tower needed), or None
