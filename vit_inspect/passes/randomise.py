"""Model randomisation as a context manager beside `ablate_heads`: weights re-drawn, restored in `finally`.

Adebayo et al. 2018 ("Sanity Checks for Saliency Maps", Sec. 3.1) re-initialise a trained model's layers and
ask whether an explanation map changes: *cascading* from the top layer down, or *independently*, one layer
at a time. Here a "layer" is one transformer block (``0 .. depth - 1``) or the patch embedding
(`EMBEDDING`: the module holding the patch projection, with the position embeddings and prefix tokens:
timm's ``patch_embed`` and the model's ``pos_embed``, ``cls_token``, ``dist_token``, ``reg_token``; Hugging
Face's ``embeddings``). The final norm and the classification head are never touched: the class explained
still means the same thing.

The new values are those **the model's own initialiser** draws under a fixed seed (`fresh_weights`): the
whole model is copied to the CPU and initialised there, with torch's CPU generator seeded and restored
afterwards (the caller's random state is left as it was), so a block gets the same values whatever the
device, the order of randomisation, or whether the others are randomised too:

- timm: ``model.init_weights()`` (the model's ``weight_init_mode``: truncated normal σ .02 for Linear
  layers, LayerNorm at 1 / 0, the position embedding truncated normal σ .02, the class and register tokens
  normal σ 1e-6, the distillation token truncated normal σ .02);
- Hugging Face: ``model.init_weights()`` after clearing the flags that mark loaded weights as initialised
  (normal σ = ``initializer_range`` for Linear and Conv, LayerNorm at 1 / 0, the embeddings' own rule);
- a hand-written model (`ModuleSpec`): each module's PyTorch ``reset_parameters()``, and a truncated normal
  σ .02 (timm's choice) for parameters of modules that have none (a position embedding, a class token);
- OpenCLIP: as a hand-written model.

Each family's initialiser is its adapter's (`core.families`, `FamilyAdapter.initialise`).

`randomised` copies the chosen layers' new values into the model in place and copies the saved values
back on leaving, even after an exception: the weights are restored bit for bit and the parameter objects
are never replaced. Nest it (e.g. in an `ExitStack`) for the cascading test.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch
from torch import nn

from vit_inspect.core.errors import InterventionError
from vit_inspect.core.families import adapter_of
from vit_inspect.core.handle import ViTHandle

EMBEDDING = "embedding"  # the layer name of the patch embedding (blocks are 0 .. depth - 1)
Layer = int | str


def cascade_order(depth: int) -> tuple[Layer, ...]:
    """The order Adebayo et al.'s cascading test randomises layers in: the last block first, down to block 0,
    then the patch embedding."""
    return (*range(depth - 1, -1, -1), EMBEDDING)


def _module_paths(model: nn.Module) -> dict[int, str]:
    return {id(module): name for name, module in model.named_modules()}


def layer_parameters(handle: ViTHandle) -> dict[Layer, tuple[str, ...]]:
    """Layer -> the names (as in ``model.named_parameters()``) of its parameters, for every block and
    the patch embedding (see the module docstring)."""
    model = handle.model
    paths = _module_paths(model)
    names = [name for name, _ in model.named_parameters()]
    block_paths = [paths[id(block)] for block in handle.blocks]

    def under(prefix: str) -> tuple[str, ...]:
        return tuple(n for n in names if n.startswith(prefix + "."))

    layers: dict[Layer, tuple[str, ...]] = {i: under(path) for i, path in enumerate(block_paths)}
    # the embedding: the highest ancestor of the patch projection that holds no block, plus the direct
    # parameters of the ancestors above it (timm keeps pos_embed and the prefix tokens on the model itself)
    parts = paths[id(handle.patch_projection)].split(".")
    ancestors = [".".join(parts[:i]) for i in range(len(parts), 0, -1)] + [""]  # deepest first; "" is the model
    above = next(i for i, a in enumerate(ancestors)
                 if any(b == a or b.startswith(a + ".") or a == "" for b in block_paths))
    embedding_path = ancestors[above - 1]
    direct = tuple(n for n in names if n.rpartition(".")[0] in ancestors[above:])
    layers[EMBEDDING] = under(embedding_path) + direct
    return layers


def _without_hooks(model: nn.Module) -> dict[int, object]:
    """A `copy.deepcopy` memo under which the copy of `model` gets empty hook registries: the hooks others put
    on the model (a server's counters, a profiler's) belong to it, may hold what cannot be copied (a lock), and
    must not run on the copy. The model itself is not touched."""
    return {id(registry): type(registry)() for module in model.modules() for name, registry in vars(module).items()
            if name.endswith(("_hooks", "_hooks_with_kwargs", "_hooks_always_called")) and isinstance(registry, dict)}


@dataclass(frozen=True, eq=False)
class FreshWeights:
    """Every block's and the patch embedding's parameters as the model's initialiser draws them."""

    seed: int  # the seed of torch's CPU generator during the initialisation
    layers: dict[Layer, tuple[str, ...]] = field(repr=False)  # layer -> parameter names (`layer_parameters`)
    values: dict[str, torch.Tensor] = field(repr=False)  # parameter name -> new value, on the CPU


def fresh_weights(handle: ViTHandle, seed: int = 0) -> FreshWeights:
    """The values `randomised` gives each layer: the model's own initialiser run on a CPU copy of the model
    (without the hooks on it) with torch's CPU generator seeded by `seed` (the caller's generator state is
    restored). Costs one copy of the model's weights while it runs; only the blocks' and embedding's new
    values are kept."""
    layers = layer_parameters(handle)
    with torch.no_grad():
        model = copy.deepcopy(handle.model, _without_hooks(handle.model)).to("cpu")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            adapter_of(handle).initialise(model)
    parameters = dict(model.named_parameters())
    values = {name: parameters[name].detach() for names in layers.values() for name in names}
    return FreshWeights(seed=seed, layers=layers, values=values)


def check_layers(layers: Iterable[Layer], depth: int) -> list[Layer]:
    """The layers as a list, each a block index in range (negative counts from the end) or `EMBEDDING`."""
    checked: list[Layer] = []
    for layer in layers:
        if layer == EMBEDDING:
            checked.append(EMBEDDING)
            continue
        if isinstance(layer, bool) or not isinstance(layer, int) or not -depth <= layer < depth:
            raise InterventionError(f"Layer {layer!r} does not exist: the model has blocks 0..{depth - 1} "
                                    f"and the patch embedding ({EMBEDDING!r}).")
        checked.append(layer % depth)
    return checked


@contextmanager
def randomised(handle: ViTHandle, layers: Iterable[Layer], fresh: FreshWeights | None = None,
               seed: int = 0) -> Iterator[list[Layer]]:
    """Inside the block, the parameters of `layers` (block indices and/or `EMBEDDING`) hold the values of
    `fresh` (default: ``fresh_weights(handle, seed)``); on leaving, even after an exception, the saved
    values are copied back bit for bit. Yields the layers randomised.

    >>> with randomised(handle, [11, 10]):   # the last two blocks of DeiT-Ti
    ...     result = analyze_image(handle, image, target=target)
    """
    chosen = check_layers(layers, handle.depth)
    fresh = fresh if fresh is not None else fresh_weights(handle, seed)
    parameters = dict(handle.model.named_parameters())
    names = [name for layer in chosen for name in fresh.layers[layer]]
    missing = [name for name in names if name not in parameters or name not in fresh.values]
    if missing:
        raise InterventionError(f"These weights are not the model's: {', '.join(missing[:3])}; draw the fresh "
                                "weights from this model (fresh_weights).")
    saved: dict[str, torch.Tensor] = {}
    try:
        with torch.no_grad():
            for name in names:
                if name not in saved:
                    saved[name] = parameters[name].detach().clone()
                parameters[name].copy_(fresh.values[name])
        yield chosen
    finally:
        with torch.no_grad():
            for name, value in saved.items():
                parameters[name].copy_(value)


__all__ = ["EMBEDDING", "FreshWeights", "cascade_order", "check_layers", "fresh_weights", "layer_parameters",
           "randomised"]
