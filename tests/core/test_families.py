"""One adapter per model family: every family answers every verb, an unknown family is refused with a
sentence, the switches are restored after an exception, and no pass branches on a family's name."""
from __future__ import annotations

import dataclasses
import inspect
import re
import shutil
from pathlib import Path

import pytest
import torch
from support import REPO, tiny_handle, tiny_hf

from vit_inspect.core.errors import UnsupportedModelError
from vit_inspect.core.families import ADAPTERS, FamilyAdapter, adapter_of
from vit_inspect.core.hf_models import handle_from_hf

PACKAGE = REPO / "vit_inspect"
FAMILIES = PACKAGE / "core" / "families"
LOADED = {"timm", "hf", "open_clip", "module"}  # what the loaders write into ViTHandle.family
VERBS = sorted(FamilyAdapter.__abstractmethods__)
BRANCH = re.compile(r"family\s*(==|!=|in\s*[(\[{]|not\s+in\b)")  # a test of a family's name


def family_branches(package: Path) -> list[str]:
    """'path:line: text' of every test of a family's name outside `core/families`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if (package / "core" / "families") in path.parents:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if BRANCH.search(line):
                found.append(f"{path.relative_to(package)}:{number}: {line.strip()}")
    return found


def test_every_family_a_loader_writes_has_an_adapter_answering_every_verb():
    assert set(ADAPTERS) == LOADED
    assert VERBS  # the base class declares the verbs
    for name, adapter in ADAPTERS.items():
        assert adapter.name == name
        for verb in VERBS:
            method = getattr(type(adapter), verb)
            assert callable(method) and not getattr(method, "__isabstractmethod__", False), (name, verb)
        module = inspect.getmodule(type(adapter))
        assert "Adding a family" in module.__doc__, module.__name__


def test_an_unknown_family_is_refused_with_a_sentence():
    handle = dataclasses.replace(tiny_handle("cls"), family="keras")
    with pytest.raises(UnsupportedModelError) as raised:
        adapter_of(handle)
    message = str(raised.value)
    assert "'keras'" in message and "timm" in message and message.endswith(".")
    assert raised.value.public == message


def test_each_handle_gets_its_own_familys_adapter():
    assert adapter_of(tiny_handle("cls")) is ADAPTERS["timm"]
    assert adapter_of(handle_from_hf(tiny_hf(), device="cpu")) is ADAPTERS["hf"]


def _record(into: list):
    def hook_for(layer: int):
        def hook(module, args, output):
            into.append(layer)
        return hook
    return hook_for


def test_the_timm_capture_switch_is_restored_after_an_exception():
    handle = tiny_handle("cls")
    attention = handle.attention_modules
    fused = [a.fused_attn for a in attention]
    seen: list[int] = []
    with pytest.raises(RuntimeError, match="inside"):
        with adapter_of(handle).probabilities(handle, _record(seen), blocked=lambda attn, i: attn.forward):
            assert not any(a.fused_attn for a in attention)
            assert all("forward" in vars(a) for a in attention)
            with torch.no_grad():
                handle.forward(torch.zeros(1, 3, *handle.input_size))
            raise RuntimeError("inside")
    assert seen == list(range(handle.depth))
    assert [a.fused_attn for a in attention] == fused
    assert not any("forward" in vars(a) for a in attention)
    assert not any(a.attn_drop._forward_hooks for a in attention)


def test_the_hugging_face_capture_switch_is_restored_after_an_exception():
    handle = handle_from_hf(tiny_hf(), device="cpu")
    handle.model.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match="inside"):
        with adapter_of(handle).probabilities(handle, _record([])):
            assert handle.model.config._attn_implementation == "eager"
            raise RuntimeError("inside")
    assert handle.model.config._attn_implementation == "sdpa"
    assert not any(a._forward_hooks for a in handle.attention_modules)


@pytest.mark.parametrize("make", [lambda: tiny_handle("cls"), lambda: handle_from_hf(tiny_hf(), device="cpu")],
                         ids=["timm", "hf"])
def test_the_uniform_ablation_switch_is_restored_after_an_exception(make):
    handle = make()
    modules = [m for a in handle.attention_modules for m in a.modules()]
    fused = [getattr(a, "fused_attn", None) for a in handle.attention_modules]
    with pytest.raises(RuntimeError, match="inside"):
        with adapter_of(handle).uniform_attention(handle, 0, lambda *args: None, lambda *args: None):
            raise RuntimeError("inside")
    assert not any(m._forward_hooks for m in modules)
    assert [getattr(a, "fused_attn", None) for a in handle.attention_modules] == fused


def test_no_pass_branches_on_a_familys_name():
    """Only the adapters know the families: a test of ``family`` anywhere else is a branch to move there."""
    assert family_branches(PACKAGE) == []


def test_a_branch_on_a_familys_name_is_found(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "vit_inspect", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "vit_inspect" / "passes" / "lens.py").open("a") as file:
        file.write('\n\nif handle.family == "timm":  # a branch that belongs in an adapter\n    pass\n')
    assert [line.split(":")[0] for line in family_branches(tmp_path / "vit_inspect")] == ["passes/lens.py"]
