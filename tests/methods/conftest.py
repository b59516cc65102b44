"""Fixtures of the method registry's tests: methods registered for one test only, and a registry whose
plugins are re-discovered from entry points the test gives; the table is restored after each, whatever happens."""
from __future__ import annotations

import pytest

from vit_inspect.methods import registry


@pytest.fixture
def registered():
    """`add(method)` registers a method for this test; it is taken out again afterwards."""
    names: list[str] = []

    def add(method):
        registry.register(method)
        names.append(method.name)
        return method

    yield add
    for name in names:
        registry.unregister(name)


class FakeEntryPoint:
    """What `importlib.metadata.entry_points` yields, with a `load` of the test's choice."""

    def __init__(self, name: str, value: str, load):
        self.name, self.value, self._load = name, value, load

    def load(self):
        return self._load()


@pytest.fixture
def plugins(monkeypatch):
    """`discover(*points)`: the registry as it would be if only these entry points were installed."""
    table, failures, loaded = dict(registry._TABLE), dict(registry._PLUGIN_FAILURES), registry._plugins_loaded

    def discover(*points: FakeEntryPoint) -> None:
        registry._TABLE.clear()
        registry._TABLE.update({n: m for n, m in table.items() if m.compute.__module__ == "vit_inspect.methods.builtin"})
        registry._PLUGIN_FAILURES.clear()
        monkeypatch.setattr(registry, "_plugins_loaded", False)
        monkeypatch.setattr(registry, "entry_points", lambda group: list(points) if group == "vit_inspect.methods" else [])
        registry.load_plugins()

    yield discover
    registry._TABLE.clear()
    registry._TABLE.update(table)
    registry._PLUGIN_FAILURES.clear()
    registry._PLUGIN_FAILURES.update(failures)
    registry._plugins_loaded = loaded


@pytest.fixture
def fake_entry_point():
    return FakeEntryPoint


@pytest.fixture(scope="module")
def deit_weights_args():
    """--model, --weights and --device for the real DeiT-Ti/16 (skipped only when the weights are absent)."""
    from support import DEIT_WEIGHTS

    if not DEIT_WEIGHTS.is_file():
        pytest.skip(f"real weights not found at {DEIT_WEIGHTS}")
    return ["--model", "deit_tiny_patch16_224", "--weights", str(DEIT_WEIGHTS), "--device", "cpu"]
