"""The hand-written family: a ViT written in plain PyTorch, opened with a `ModuleSpec` (`core.module_spec`).

The spec names, per block, a module whose output is the attention probabilities (or the second item of
``(output, weights)``), so capture hooks it and switches nothing. Its queries and keys are found as timm's
(``q_norm``/``k_norm`` and ``scale``) or as Hugging Face's (``q_proj``/``k_proj``) where the module has them;
otherwise the pass keeps the maps themselves. vit_inspect knows neither its final norm nor its head, so there
is no logit lens, no LeGrad, no AttnLRP and no head ablation; re-initialisation is each module's
``reset_parameters()``, and a truncated normal σ .02 for the parameters of modules that have none.

Adding a family: one module like this one, answering every verb of `FamilyAdapter`, plus its tests.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from torch import nn

from vit_inspect.core.errors import UnsupportedModelError
from vit_inspect.core.families.base import FamilyAdapter, Hook, QueryKey, Readout, RefusesHeadAblation
from vit_inspect.core.families.hf import hf_query_keys
from vit_inspect.core.families.timm import timm_query_keys
from vit_inspect.core.handle import ViTHandle


class ModuleSpecAdapter(RefusesHeadAblation, FamilyAdapter):
    """A hand-written model's answers (see the module docstring)."""

    name = "module"

    @contextmanager
    def probabilities(self, handle: ViTHandle, hook: Callable[[int], Hook],
                      blocked: Callable[[nn.Module, int], Callable | None] | None = None) -> Iterator[None]:
        hooks = []
        try:
            for i, attn in enumerate(handle.attention_modules):
                hooks.append(attn.register_forward_hook(hook(i)))
            yield
        finally:
            for hook_ in hooks:
                hook_.remove()

    def query_key_modules(self, attn: nn.Module) -> QueryKey | None:
        return timm_query_keys(attn) or hf_query_keys(attn)

    def lens_norm(self, handle: ViTHandle) -> tuple[nn.Module, bool] | None:
        return None

    def lens_readouts(self, handle: ViTHandle) -> dict[str, Readout]:
        return {}

    def score_projection(self, handle: ViTHandle, projection: str) -> Readout:
        raise UnsupportedModelError(f"LeGrad follows timm and Hugging Face ViTs; {handle.name!r} is not one.")

    def lrp_unsupported(self, handle: ViTHandle) -> str | None:
        return (f"AttnLRP and LeGrad follow timm and Hugging Face ViTs; {handle.name!r} is a "
                f"{handle.family!r} model.")

    def lrp_modules(self, handle: ViTHandle) -> Iterator[nn.Module]:
        yield from handle.model.modules()

    def lrp_constants(self, handle: ViTHandle, attn: nn.Module) -> tuple[nn.Module, ...]:
        raise UnsupportedModelError(self.lrp_unsupported(handle))

    def initialise(self, model: nn.Module) -> None:
        self.reset_parameters(model)


ADAPTER = ModuleSpecAdapter()
