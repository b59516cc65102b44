"""The shared model cache: bounded, least recently used out first, one load per key even under concurrency."""
from __future__ import annotations

import threading

import pytest

from vit_inspect.core.errors import ModelNotFoundError
from vit_inspect.ui.model_cache import CacheKey, ModelCache


class FakeLoader:
    """Stands in for load_model: records its calls and returns a fresh object per call."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, name, weights=None, device=None, **kwargs):
        self.calls.append((name, weights, device, kwargs))
        return object()


def key(name: str, weights: str | None = None) -> CacheKey:
    return CacheKey(name=name, weights=weights, device="cpu")


def test_same_key_returns_the_same_handle_and_loads_once():
    loader = FakeLoader()
    cache = ModelCache(max_size=2, loader=loader)
    first = cache.get(key("a"))
    assert cache.get(key("a")) is first
    assert loader.calls == [("a", None, "cpu", {})]


def test_bound_evicts_the_least_recently_used():
    loader = FakeLoader()
    cache = ModelCache(max_size=2, loader=loader)
    a, b = cache.get(key("a")), cache.get(key("b"))
    cache.get(key("c"))  # over the bound: "a" is the oldest
    assert cache.keys() == [key("b"), key("c")]
    assert key("a") not in cache and len(cache) == 2
    assert cache.get(key("b")) is b  # still cached, and now the most recently used
    cache.get(key("d"))  # evicts "c", not "b"
    assert cache.keys() == [key("b"), key("d")]
    assert cache.get(key("a")) is not a  # evicted models are loaded again
    assert [call[0] for call in loader.calls] == ["a", "b", "c", "d", "a"]


def test_different_weights_are_different_entries():
    loader = FakeLoader()
    cache = ModelCache(max_size=3, loader=loader)
    plain = cache.get(key("deit", None))
    mine = cache.get(key("deit", "/w/mine.safetensors"))
    theirs = cache.get(key("deit", "/w/theirs.safetensors"))
    assert len({id(plain), id(mine), id(theirs)}) == 3
    assert [call[1] for call in loader.calls] == [None, "/w/mine.safetensors", "/w/theirs.safetensors"]


def test_load_kwargs_reach_the_loader():
    loader = FakeLoader()
    ModelCache(loader=loader).get(key("a"), allow_local_dirs=False)
    assert loader.calls == [("a", None, "cpu", {"allow_local_dirs": False})]


def test_cache_key_resolves_paths_and_devices(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = CacheKey.of(" deit_tiny_patch16_224 ", "w.safetensors", "cpu")
    assert relative == CacheKey("deit_tiny_patch16_224", str(tmp_path.resolve() / "w.safetensors"), "cpu")
    assert CacheKey.of("deit_tiny_patch16_224", tmp_path / "w.safetensors", "cpu") == relative
    assert hash(CacheKey.of("a", None, "cpu")) == hash(CacheKey("a", None, "cpu"))
    with pytest.raises(ValueError, match="Unknown device"):
        CacheKey.of("a", device="not-a-device")


def test_a_failed_load_is_not_cached_and_is_retried():
    attempts = []

    def flaky(name, weights=None, device=None):
        attempts.append(name)
        if len(attempts) == 1:
            raise ModelNotFoundError("no such model")
        return object()

    cache = ModelCache(loader=flaky)
    with pytest.raises(ModelNotFoundError):
        cache.get(key("a"))
    assert len(cache) == 0
    assert cache.get(key("a")) is cache.get(key("a"))
    assert attempts == ["a", "a"]


def test_concurrent_requests_for_one_model_load_it_once():
    started, release = threading.Event(), threading.Event()
    loads = []

    def slow(name, weights=None, device=None):
        loads.append(name)
        started.set()
        assert release.wait(10), "the test never released the loader"
        return object()

    cache = ModelCache(loader=slow)
    handles: list[object] = []
    threads = [threading.Thread(target=lambda: handles.append(cache.get(key("a")))) for _ in range(8)]
    for thread in threads:
        thread.start()
    assert started.wait(10)
    release.set()
    for thread in threads:
        thread.join(10)
    assert loads == ["a"]
    assert len(handles) == 8 and all(h is handles[0] for h in handles)


def test_another_model_loads_while_one_is_loading():
    release = threading.Event()
    started = threading.Event()

    def loader(name, weights=None, device=None):
        if name == "slow":
            started.set()
            assert release.wait(10)
        return name

    cache = ModelCache(loader=loader)
    thread = threading.Thread(target=cache.get, args=(key("slow"),))
    thread.start()
    assert started.wait(10)
    assert cache.get(key("fast")) == "fast"  # not blocked behind the slow load
    release.set()
    thread.join(10)
    assert cache.keys() == [key("fast"), key("slow")]


def test_size_must_be_positive():
    with pytest.raises(ValueError):
        ModelCache(max_size=0)
