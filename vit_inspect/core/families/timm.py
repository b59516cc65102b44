"""The timm family: models built by `timm.create_model` (ViT, DeiT, DeiT III, DINOv2, ...).

timm's `Attention` computes softmax(s·q kᵀ) with fused `scaled_dot_product_attention` unless its
``fused_attn`` flag is off; then the probabilities pass through ``attn_drop`` (an identity in eval mode),
where capture and the LRP switch find them. Its queries and keys are the outputs of ``q_norm``/``k_norm``
(Identity without qk-norm), (B, heads, N, d), with scale ``attn.scale``. The logit lens and LeGrad read
``forward_head(norm(x))``; a head ablation replaces the input of ``attn.norm`` (when the model normalises
before the projection) or ``attn.proj``; the initialiser is ``model.init_weights()``.

Adding a family: one module like this one, answering every verb of `FamilyAdapter`, plus its tests.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from torch import nn

from vit_inspect.core.families.base import FamilyAdapter, Hook, QueryKey, Readout
from vit_inspect.core.handle import ViTHandle


def timm_query_keys(attn: nn.Module) -> QueryKey | None:
    """The outputs of timm's ``q_norm``/``k_norm`` (B, heads, N, d) and ``attn.scale``, or None without them."""
    if hasattr(attn, "q_norm") and hasattr(attn, "k_norm") and hasattr(attn, "scale"):
        return attn.q_norm, attn.k_norm, "bhnd", float(attn.scale)
    return None


@contextmanager
def unfused(modules: tuple[nn.Module, ...]) -> Iterator[None]:
    """Each module's ``fused_attn`` flag off inside the block (its probabilities then pass ``attn_drop``),
    restored on leaving, also after an exception."""
    saved: list[tuple[nn.Module, bool]] = []
    try:
        for attn in modules:
            saved.append((attn, attn.fused_attn))
            attn.fused_attn = False
        yield
    finally:
        for attn, fused in saved:
            attn.fused_attn = fused


class TimmAdapter(FamilyAdapter):
    """timm's answers (see the module docstring)."""

    name = "timm"

    @contextmanager
    def probabilities(self, handle: ViTHandle, hook: Callable[[int], Hook],
                      blocked: Callable[[nn.Module, int], Callable | None] | None = None) -> Iterator[None]:
        hooks = []
        replaced: list[nn.Module] = []
        with unfused(handle.attention_modules):
            try:
                for i, attn in enumerate(handle.attention_modules):
                    hooks.append(attn.attn_drop.register_forward_hook(hook(i)))
                    forward = blocked(attn, i) if blocked is not None else None
                    if forward is not None:
                        attn.forward = forward  # an instance attribute, deleted on leaving
                        replaced.append(attn)
                yield
            finally:
                for hook_ in hooks:
                    hook_.remove()
                for attn in replaced:
                    del attn.forward

    def query_key_modules(self, attn: nn.Module) -> QueryKey | None:
        return timm_query_keys(attn)

    def lens_norm(self, handle: ViTHandle) -> tuple[nn.Module, bool] | None:
        model = handle.model
        norm = getattr(model, "norm", nn.Identity())
        return norm, getattr(model, "global_pool", None) == "token" and getattr(model, "attn_pool", None) is None

    def lens_readouts(self, handle: ViTHandle) -> dict[str, Readout]:
        if not handle.has_head:
            return {}
        model = handle.model
        norm = getattr(model, "norm", nn.Identity())
        readouts: dict[str, Readout] = {"readout": lambda x: model.forward_head(norm(x))}
        if handle.num_dist_tokens and hasattr(model, "head_dist"):
            readouts["class"] = lambda x: model.head(norm(x)[:, 0])
            readouts["distillation"] = lambda x: model.head_dist(norm(x)[:, 1])
        return readouts

    def score_projection(self, handle: ViTHandle, projection: str) -> Readout:
        model = handle.model
        if projection == "model":
            return lambda tokens: model.forward_head(model.norm(tokens))
        return lambda tokens: model.head(model.fc_norm(model.norm(tokens.mean(1))))

    def lrp_unsupported(self, handle: ViTHandle) -> str | None:
        return None

    def lrp_modules(self, handle: ViTHandle) -> Iterator[nn.Module]:
        yield from handle.model.modules()

    def lrp_constants(self, handle: ViTHandle, attn: nn.Module) -> tuple[nn.Module, ...]:
        return (attn.attn_drop,)  # the probabilities

    def head_output_module(self, handle: ViTHandle, attn: nn.Module) -> nn.Module | None:
        norm = getattr(attn, "norm", None)
        return norm if isinstance(norm, nn.Module) and not isinstance(norm, nn.Identity) else getattr(attn, "proj", None)

    @contextmanager
    def uniform_attention(self, handle: ViTHandle, layer: int, probs_hook: Hook, values_hook: Hook) -> Iterator[bool]:
        # softmax probabilities replaced before `attn @ v`: needs the unfused path, as capture does
        attn = handle.attention_modules[layer]
        with unfused((attn,)):
            hook = attn.attn_drop.register_forward_hook(probs_hook, prepend=True)
            try:
                yield False
            finally:
                hook.remove()

    def initialise(self, model: nn.Module) -> None:
        if hasattr(model, "init_weights"):
            model.init_weights()  # the model's weight_init_mode
        else:
            self.reset_parameters(model)


ADAPTER = TimmAdapter()
