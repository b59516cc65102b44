"""The Hugging Face family: `transformers` image classifiers and backbones (ViT, DeiT, DINOv2, ...).

transformers gives the attention probabilities as the second item of the attention module's
``(output, weights)`` only with the eager attention implementation, which capture switches on (and back).
The queries and keys are the outputs of ``q_proj``/``k_proj`` (or the older ``query``/``key``),
(B, N, heads * d), with scale ``scaling``; the same Linears, held constant, hold the probabilities constant in
the LRP backward. The logit lens and LeGrad read the class token through ``base_model.layernorm`` and
``classifier`` (both heads of a distilled DeiT); a head ablation replaces the input of ``o_proj`` (or
``output.dense``), and uniform attention uses the mean of the value projection; the initialiser is
``model.init_weights()`` after the marks of loaded weights are cleared.

Adding a family: one module like this one, answering every verb of `FamilyAdapter`, plus its tests.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from torch import nn

from vit_inspect.core.errors import InterventionError, UnsupportedModelError
from vit_inspect.core.families.base import FamilyAdapter, Hook, QueryKey, Readout
from vit_inspect.core.handle import ViTHandle

QUERY_KEY_NAMES = (("q_proj", "k_proj"), ("query", "key"))  # newer, then older transformers attention


def hf_query_keys(attn: nn.Module) -> QueryKey | None:
    """The outputs of ``q_proj``/``k_proj`` (or ``query``/``key``) of ``attn`` or its ``attention``, (B, N,
    heads * d), with scale ``scaling`` (else d^-1/2); None without them or without the head count and size."""
    inner = getattr(attn, "attention", attn)
    for q_name, k_name in QUERY_KEY_NAMES:
        q, k = getattr(inner, q_name, None), getattr(inner, k_name, None)
        if isinstance(q, nn.Module) and isinstance(k, nn.Module):
            heads = getattr(inner, "num_attention_heads", None) or getattr(getattr(inner, "config", None),
                                                                           "num_attention_heads", None)
            head_dim = getattr(inner, "head_dim", None) or getattr(inner, "attention_head_size", None)
            if heads is None or head_dim is None:
                return None
            scale = getattr(inner, "scaling", None) or head_dim ** -0.5
            return q, k, f"bn(hd):{int(heads)}", float(scale)
    return None


def _query_key_projections(attention: nn.Module, name: str) -> tuple[nn.Module, nn.Module]:
    """The attention's query and key Linears: holding their outputs constant in the LRP backward holds the
    softmax input, hence A, constant (CP-LRP)."""
    for module in (attention, getattr(attention, "attention", None)):
        for query, key in QUERY_KEY_NAMES:
            if isinstance(getattr(module, query, None), nn.Linear) and isinstance(getattr(module, key, None), nn.Linear):
                return getattr(module, query), getattr(module, key)
    raise UnsupportedModelError(f"AttnLRP cannot find the query/key projections of {name!r}'s attention.")


def _value_module(handle: ViTHandle, layer: int) -> nn.Module:
    """The value projection (B, N, heads * head_dim) of layer `layer`."""
    attn = handle.attention_modules[layer]
    module = getattr(attn, "v_proj", None) or getattr(getattr(attn, "attention", None), "value", None)
    if not isinstance(module, nn.Module):
        raise InterventionError(f"Cannot find the value projection of layer {layer}'s attention in {handle.name!r}.")
    return module


def _clear_loaded_marks(model: nn.Module) -> None:
    """Forget Hugging Face's marks of loaded (hence "already initialised") modules and tensors."""
    for module in model.modules():
        module.__dict__.pop("_is_hf_initialized", None)
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            tensor.__dict__.pop("_is_hf_initialized", None)


class HfAdapter(FamilyAdapter):
    """Hugging Face's answers (see the module docstring)."""

    name = "hf"

    @contextmanager
    def probabilities(self, handle: ViTHandle, hook: Callable[[int], Hook],
                      blocked: Callable[[nn.Module, int], Callable | None] | None = None) -> Iterator[None]:
        hooks = []
        saved_impl: str | None = None
        try:
            saved_impl = handle.model.config._attn_implementation
            if saved_impl != "eager":
                handle.model.set_attn_implementation("eager")
            for i, attn in enumerate(handle.attention_modules):
                hooks.append(attn.register_forward_hook(hook(i)))
            yield
        finally:
            for hook_ in hooks:
                hook_.remove()
            if saved_impl is not None and saved_impl != handle.model.config._attn_implementation:
                handle.model.set_attn_implementation(saved_impl)

    def query_key_modules(self, attn: nn.Module) -> QueryKey | None:
        return hf_query_keys(attn)

    def lens_norm(self, handle: ViTHandle) -> tuple[nn.Module, bool] | None:
        norm = getattr(handle.model.base_model, "layernorm", None) or nn.Identity()
        return norm, True  # `lens_readouts` reads tokens 0 and 1 of a Hugging Face head itself

    def lens_readouts(self, handle: ViTHandle) -> dict[str, Readout]:
        if not handle.has_head:
            return {}
        model = handle.model
        norm = getattr(model.base_model, "layernorm", None) or nn.Identity()
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

    def score_projection(self, handle: ViTHandle, projection: str) -> Readout:
        model = handle.model
        norm = getattr(model.base_model, "layernorm", None)
        classifier = getattr(model, "classifier", None)
        if not isinstance(classifier, nn.Linear) or norm is None or handle.global_pool != "token":
            raise UnsupportedModelError(f"LeGrad needs a class-token classifier with one Linear head; {handle.name!r} "
                                        "has another readout.")
        if projection == "model":
            return lambda tokens: classifier(norm(tokens)[:, 0])
        return lambda tokens: classifier(norm(tokens.mean(1)))

    def lrp_unsupported(self, handle: ViTHandle) -> str | None:
        return None

    def lrp_modules(self, handle: ViTHandle) -> Iterator[nn.Module]:
        yield from handle.model.modules()

    def lrp_constants(self, handle: ViTHandle, attn: nn.Module) -> tuple[nn.Module, ...]:
        return _query_key_projections(attn, handle.name)

    def head_output_module(self, handle: ViTHandle, attn: nn.Module) -> nn.Module | None:
        return getattr(attn, "o_proj", None) or getattr(getattr(attn, "output", None), "dense", None)

    @contextmanager
    def uniform_attention(self, handle: ViTHandle, layer: int, probs_hook: Hook, values_hook: Hook) -> Iterator[bool]:
        # no module between softmax and `attn @ v`: the head outputs become mean(V) directly, and the
        # probabilities capture records are made uniform to match
        hooks = []
        try:
            hooks.append(_value_module(handle, layer).register_forward_hook(values_hook))
            hooks.append(handle.attention_modules[layer].register_forward_hook(probs_hook, prepend=True))
            yield True
        finally:
            for hook in hooks:
                hook.remove()

    def initialise(self, model: nn.Module) -> None:
        if hasattr(model, "init_weights"):
            _clear_loaded_marks(model)
            model.init_weights()
        else:
            self.reset_parameters(model)


ADAPTER = HfAdapter()
