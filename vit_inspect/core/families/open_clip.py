"""The OpenCLIP family: the vision tower of a CLIP or SigLIP model, with a zero-shot head over text embeddings.

Its attention is timm's (a timm trunk) or OpenCLIP's `nn.MultiheadAttention` written out as timm's
(`core.open_clip_models.SelfAttention`: ``fused_attn``, ``attn_drop``, ``q_norm``/``k_norm``, ``scale``), so
capture, the queries and keys and the LRP's constant probabilities are timm's. Its readouts are the tower's
own (`ViTHandle.clip`): the logit lens reads the tower's pooling, norm and projection, then the zero-shot
head; LeGrad reads tokens as LeGrad's own package does. The LRP rules wrap the vision tower and the zero-shot
head only (the text tower encodes prompts beside the pass). There is no head ablation yet; re-initialisation
is each module's ``reset_parameters()``.

Adding a family: one module like this one, answering every verb of `FamilyAdapter`, plus its tests.
"""
from __future__ import annotations

from typing import Iterator

from torch import nn

from vit_inspect.core.families.base import Readout, RefusesHeadAblation
from vit_inspect.core.families.timm import TimmAdapter
from vit_inspect.core.handle import ViTHandle

class OpenClipAdapter(RefusesHeadAblation, TimmAdapter):
    """OpenCLIP's answers (see the module docstring): timm's attention, the tower's own readouts."""

    name = "open_clip"

    def lens_norm(self, handle: ViTHandle) -> tuple[nn.Module, bool] | None:
        return None

    def lens_readouts(self, handle: ViTHandle) -> dict[str, Readout]:
        # the tower's own pooling, norm and projection, then the zero-shot head
        head, pooled = handle.clip.head, handle.clip.pooled_embedding
        return {"readout": lambda x: head(pooled(x))}

    def score_projection(self, handle: ViTHandle, projection: str) -> Readout:
        # LeGrad's own CLIP readout (its package): tokens -> image embedding -> head, whatever ``projection``
        head, embed = handle.clip.head, handle.clip.legrad_embedding
        return lambda tokens: head(embed(tokens))

    def lrp_modules(self, handle: ViTHandle) -> Iterator[nn.Module]:
        yield from handle.model.visual.modules()
        yield from handle.clip.head.modules()

    def initialise(self, model: nn.Module) -> None:
        self.reset_parameters(model)


ADAPTER = OpenClipAdapter()
