"""One adapter per model family, and the one place a family's name is looked up (`adapter_of`).

The passes ask a model's adapter what its family answers (`FamilyAdapter`: the attention capture switch,
queries and keys, the logit lens, the LRP targets, the head ablation hooks, re-initialisation) and never
branch on ``handle.family`` themselves. Adding a family: one module here with one adapter answering every
verb, its line in `ADAPTERS`, and its tests.
"""
from __future__ import annotations

from vit_inspect.core.errors import UnsupportedModelError
from vit_inspect.core.families import hf, module_spec, open_clip, timm
from vit_inspect.core.families.base import FamilyAdapter
from vit_inspect.core.handle import ViTHandle

ADAPTERS: dict[str, FamilyAdapter] = {adapter.name: adapter for adapter in (
    timm.ADAPTER, hf.ADAPTER, open_clip.ADAPTER, module_spec.ADAPTER)}  # family name -> its adapter


def adapter_of(handle: ViTHandle) -> FamilyAdapter:
    """The adapter of ``handle``'s family; UnsupportedModelError for a family vit_inspect does not know."""
    adapter = ADAPTERS.get(handle.family)
    if adapter is None:
        raise UnsupportedModelError(
            f"{handle.name!r} is a {handle.family!r} model, a family vit_inspect does not know; it knows "
            f"{', '.join(sorted(ADAPTERS))}.")
    return adapter


__all__ = ["ADAPTERS", "FamilyAdapter", "adapter_of"]
