"""What every model family answers: the verbs the passes ask of a model's family, in one small base class.

A family is where a model's modules come from (timm, Hugging Face, OpenCLIP, or a hand-written model opened
with a `ModuleSpec`): each names its attention, its queries and keys, its final norm and head differently.
The passes never ask which family a model is; they ask its adapter (`adapter_of(handle)`) one of these verbs:

- `probabilities`: a context manager inside which every layer's attention probabilities reach a hook
  (the capture switch: fused attention off, or the eager implementation on), restored on leaving;
- `query_key_modules`: the modules whose outputs are an attention module's queries and keys;
- `lens_norm` and `lens_readouts`: the final norm and head the logit lens reads the residual stream through;
- `score_projection`: LeGrad's class scores from a layer's tokens;
- `lrp_unsupported`, `lrp_modules` and `lrp_constants`: where the AttnLRP rules go;
- `head_output_module` and `uniform_attention`: where a head ablation replaces a head's output;
- `initialise`: the model's own weight initialiser (for the randomisation sanity checks).

Adding a family: one module under `core/families` with one adapter that answers every verb, its line in
`ADAPTERS`, and its tests.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import Callable, Iterator

import torch
from torch import nn

from vit_inspect.core.errors import InterventionError
from vit_inspect.core.handle import ViTHandle

Hook = Callable[[nn.Module, tuple, object], object]  # a forward hook: (module, args, output) -> output or None
# (query module, key module, output layout, scale s of softmax(s q kᵀ)); the layout is "bhnd" for
# (B, heads, N, d) outputs, or "bn(hd):<heads>" for (B, N, heads * d) outputs
QueryKey = tuple[nn.Module, nn.Module, str, float]
Readout = Callable[[torch.Tensor], torch.Tensor]  # (B, N, D) residual stream -> (B, num_classes) logits
TRUNC_STD = 0.02  # truncated-normal σ for parameters without a module initialiser (timm's choice)


class FamilyAdapter(ABC):
    """One model family's answers to the passes (see the module docstring); one instance per family."""

    name: str  # the family's name, as the loader writes it into `ViTHandle.family`

    @abstractmethod
    def probabilities(self, handle: ViTHandle, hook: Callable[[int], Hook],
                      blocked: Callable[[nn.Module, int], Callable | None] | None = None
                      ) -> AbstractContextManager[None]:
        """Inside the block, every layer's (B, heads, N, N) attention probabilities reach ``hook(layer)``, a
        forward hook, as its output (or the second item of an ``(output, weights)`` tuple). ``blocked(attn,
        layer)``, where given, is a forward computing the attention a block of query rows at a time, or None
        where it cannot; a family that can use it puts it in place. Every hook, switch and forward is removed
        or restored on leaving, also after an exception."""

    @abstractmethod
    def query_key_modules(self, attn: nn.Module) -> QueryKey | None:
        """The modules whose outputs are ``attn``'s queries and keys, with their layout and scale, or None if
        unknown."""

    @abstractmethod
    def lens_norm(self, handle: ViTHandle) -> tuple[nn.Module, bool] | None:
        """(final norm, whether the head reads the prefix tokens alone) of a class-token head, or None where the
        family has no lens that reads fewer tokens."""

    @abstractmethod
    def lens_readouts(self, handle: ViTHandle) -> dict[str, Readout]:
        """The logit-lens readouts by name (`passes.lens.lens_readouts`); empty where there is none."""

    @abstractmethod
    def score_projection(self, handle: ViTHandle, projection: str) -> Readout:
        """LeGrad's (B, N, D) tokens -> (B, num_classes) scores (`passes.relevance.score_projection`); raises
        UnsupportedModelError where the family has none."""

    @abstractmethod
    def lrp_unsupported(self, handle: ViTHandle) -> str | None:
        """Why no AttnLRP rule or LeGrad hook may be placed on this model at all, or None."""

    @abstractmethod
    def lrp_modules(self, handle: ViTHandle) -> Iterator[nn.Module]:
        """The modules the LRP rules may wrap (the part of the model that is explained)."""

    @abstractmethod
    def lrp_constants(self, handle: ViTHandle, attn: nn.Module) -> tuple[nn.Module, ...]:
        """The modules of ``attn`` whose outputs are held constant in the LRP backward so that the attention
        probabilities are (CP-LRP); raises UnsupportedModelError where they cannot be found."""

    @abstractmethod
    def head_output_module(self, handle: ViTHandle, attn: nn.Module) -> nn.Module | None:
        """The module whose input is ``attn``'s concatenated head outputs (B, N, heads * head_dim), or None if it
        cannot be found; raises InterventionError for a family without head ablation."""

    @abstractmethod
    def uniform_attention(self, handle: ViTHandle, layer: int, probs_hook: Hook,
                          values_hook: Hook) -> AbstractContextManager[bool]:
        """Inside the block, ``probs_hook`` may replace layer ``layer``'s probabilities (as a forward hook run
        before any other). Yields True when they do not reach the output, so the head outputs are to be
        replaced by the mean of the values, which ``values_hook`` then receives; False when they do."""

    @abstractmethod
    def initialise(self, model: nn.Module) -> None:
        """Run the model's own initialiser on ``model`` in place (under the caller's random state)."""

    @staticmethod
    def reset_parameters(model: nn.Module) -> None:
        """Every module's PyTorch ``reset_parameters()``, and a truncated normal σ `TRUNC_STD` for the
        parameters of modules that have none (a position embedding, a class token)."""
        from timm.layers import trunc_normal_

        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
            else:
                for parameter in module.parameters(recurse=False):
                    trunc_normal_(parameter, std=TRUNC_STD)


def no_head_ablation(handle: ViTHandle) -> InterventionError:
    """The refusal of a head ablation, for a family whose head outputs vit_inspect does not know."""
    return InterventionError(f"Head ablation supports timm and Hugging Face ViTs; {handle.name!r} is a "
                             f"{handle.family!r} model.")


class RefusesHeadAblation:
    """The ablation verbs of a family whose head outputs vit_inspect does not know (hand-written models, OpenCLIP):
    each refuses with `no_head_ablation`. Listed before `FamilyAdapter` (or its subclass) in a class's bases."""

    def head_output_module(self, handle: ViTHandle, attn: nn.Module) -> nn.Module | None:
        raise no_head_ablation(handle)

    def uniform_attention(self, handle: ViTHandle, layer: int, probs_hook: Hook,
                          values_hook: Hook) -> AbstractContextManager[bool]:
        raise no_head_ablation(handle)
