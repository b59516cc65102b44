"""The byte-bounded session store: LRU eviction, a sentence for an evicted session, models counted, and
many sessions of a large-token model staying under the budget measured as RSS."""
from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest
from PIL import Image
from support import tiny_handle

from vit_inspect.core.errors import VitInspectError
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.ui.session_store import (
    DROPPED,
    ResultDropped,
    ResultTooLarge,
    SessionStore,
    module_nbytes,
)

MB = 2 ** 20


def test_least_recently_used_is_dropped_first():
    store = SessionStore(budget=100)
    a, b, c = store.put("a", 40), store.put("b", 40), store.put("c", 10)
    assert a.get() == "a"  # a is now the most recent: b is the oldest
    d = store.put("d", 40)  # 40 + 40 + 10 + 40 > 100: b goes
    assert b.dropped and not a.dropped and c.get() == "c" and d.get() == "d"
    assert store.held == 90 and store.evictions == 1
    with pytest.raises(ResultDropped, match="dropped to make room.*re-run"):
        b.get()
    assert isinstance(ResultDropped(), VitInspectError) and str(ResultDropped()) == DROPPED


def test_an_eviction_hands_freed_memory_back(monkeypatch):
    from vit_inspect.ui import session_store

    assert session_store.release_freed_memory() is (session_store._malloc_trim() is not None)  # glibc: True
    calls = []
    monkeypatch.setattr(session_store, "release_freed_memory", lambda: calls.append(1) or True)
    store = SessionStore(budget=100)
    store.put("a", 60)
    assert calls == []  # nothing dropped, nothing to hand back
    store.put("b", 60)
    assert calls == [1] and store.evictions == 1


def test_growing_a_slot_recounts_it_and_evicts_others():
    store = SessionStore(budget=100)
    a, b = store.put("a", 30), store.put("b", 30)
    a.set("a, two targets", 75)  # 75 + 30 > 100: b goes, a stays
    assert b.dropped and a.get() == "a, two targets" and store.held == 75


def test_one_result_larger_than_the_budget_is_a_sentence():
    store = SessionStore(budget=100, reserved=lambda: 30)
    kept = store.put("small", 50)
    with pytest.raises(ResultTooLarge, match="needs 0 MB but the server keeps at most 0 MB"):
        store.put("huge", 71)  # 71 > 100 - 30
    assert kept.get() == "small"


def test_model_memory_counts_against_the_same_budget():
    models = [0]
    store = SessionStore(budget=100, reserved=lambda: models[0])
    a, b = store.put("a", 40), store.put("b", 40)
    models[0] = 50  # a model was loaded: 50 + 40 + 40 > 100
    c = store.put("c", 10)
    assert a.dropped and b.dropped is False and c.get() == "c"
    assert store.held + models[0] <= 100


def test_module_nbytes_counts_parameters_and_buffers():
    handle = tiny_handle("cls")
    expected = sum(p.numel() * 4 for p in handle.model.parameters()) + sum(
        b.numel() * b.element_size() for b in handle.model.buffers())
    assert module_nbytes(handle.model) == expected > 0


def test_slots_never_reach_another_sessions_value_under_threads():
    store = SessionStore(budget=10_000)
    seen_wrong = []

    def session(i):
        slot = store.put(f"value {i}", 50)
        for _ in range(200):
            try:
                if slot.get() != f"value {i}":
                    seen_wrong.append(i)
            except ResultDropped:
                slot = store.put(f"value {i}", 50)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(400)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not seen_wrong and store.held <= 10_000


def _rss() -> int:
    """Resident set size of this process now, bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc to read RSS")
def test_many_large_token_sessions_stay_under_the_budget_in_rss():
    """60 sessions of a tiny model at 1025 tokens (512 px, 16 px patches): together they would hold 60 MB,
    the store keeps what fits in 8 MiB and the process's RSS grows by less than the budget plus slack."""
    handle = tiny_handle("patch16")
    budget = 8 * MB
    store = SessionStore(budget=budget)
    rng = np.random.default_rng(0)
    slots, created = [], 0
    analyze_image(handle, Image.fromarray(rng.integers(0, 256, (512, 512, 3), dtype=np.uint8)), input_size=(512, 512))
    gc.collect()
    before = _rss()
    for i in range(60):
        picture = Image.fromarray(rng.integers(0, 256, (512, 512, 3), dtype=np.uint8))
        result = analyze_image(handle, picture, input_size=(512, 512))  # N = 1 + 32 * 32, rgb 0.8 MB
        created += result.nbytes()
        slots.append(store.put(result, result.nbytes()))
        del result
    gc.collect()
    grown = _rss() - before
    assert created > 4 * budget  # what keeping every session would hold
    assert store.held <= budget
    assert sum(not s.dropped for s in slots) < len(slots)
    assert grown < budget + 16 * MB, f"RSS grew by {grown / MB:.1f} MiB for a {budget / MB:.0f} MiB budget"
