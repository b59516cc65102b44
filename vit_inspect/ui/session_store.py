"""A store of per-session results bounded in bytes, least recently used dropped first.

A public server keeps every visitor's analysed image so that sliders redraw without the model. The
store holds those results; a session keeps only its own `Slot`, a small handle with no name or key that
could reach another slot. When adding a result would take the bytes held (results plus the `reserved`
bytes, e.g. the loaded models' weights) over the budget, the least recently used results are dropped;
their sessions learn it on their next action from `ResultDropped`, a sentence, never another session's
data. A single result larger than the whole budget is refused with a sentence.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from collections import OrderedDict
from typing import Any, Callable

import torch

from vit_inspect.core.errors import VitInspectError

DEFAULT_BUDGET = 4 * 2 ** 30  # bytes: results plus model weights on a server that sets no --memory-budget
DROPPED = "Your result was dropped to make room for other visitors; re-run the analysis."


class ResultDropped(VitInspectError):
    """This browser session's result was evicted to keep the server under its memory budget."""

    def __init__(self) -> None:
        super().__init__(DROPPED)


class ResultTooLarge(VitInspectError):
    """One result alone would not fit in the memory budget."""


def module_nbytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (what a loaded model holds)."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim`` or None (another C library, or no C library to load)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Hand the C heap's free pages back to the operating system (glibc ``malloc_trim(0)``); False where
    that is not available. Dropped results are freed to the heap, but glibc raises its mmap threshold
    after large frees, so the arrays of later passes come from the heap and its free pages stay in the
    process's RSS: without this a full store's RSS grows by tens of MB beyond its byte count."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class Slot:
    """One session's place in the store: the only way to its value. Small; safe to keep in gr.State."""

    __slots__ = ("_store", "_value", "nbytes", "__weakref__")

    def __init__(self, store: "SessionStore"):
        self._store = store
        self._value: Any = None
        self.nbytes = 0

    @property
    def dropped(self) -> bool:
        return self._value is None

    def get(self) -> Any:
        """The value, marking it most recently used; `ResultDropped` if the store let it go."""
        return self._store._get(self)

    def set(self, value: Any, nbytes: int) -> None:
        """Replace the value (e.g. with another target's results added), re-counting its bytes."""
        self._store._set(self, value, nbytes)

    def release(self) -> None:
        """Let this slot's value go now (it is of no further use), rather than when it is least recent."""
        self._store.drop(self)

    def __deepcopy__(self, memo):  # gr.State deep-copies its initial value only; a slot stays itself
        return self


class Detached:
    """A value held outside the store behind a slot's `get` (e.g. a pass drawn once and not kept there)."""

    __slots__ = ("_value",)

    def __init__(self, value: Any):
        self._value = value

    def get(self) -> Any:
        return self._value


class SessionStore:
    """Values with a byte count, held under ``budget`` bytes minus ``reserved()``; thread-safe, LRU."""

    def __init__(self, budget: int = DEFAULT_BUDGET, reserved: Callable[[], int] = lambda: 0):
        if budget <= 0:
            raise ValueError(f"budget must be positive, got {budget}")
        self.budget = int(budget)
        self.reserved = reserved  # bytes held outside the store that count against the same budget
        self._slots: OrderedDict[int, Slot] = OrderedDict()  # id(slot) -> slot, least recently used first
        self._lock = threading.Lock()
        self.evictions = 0

    def put(self, value: Any, nbytes: int) -> Slot:
        """A new slot holding ``value`` of ``nbytes`` bytes (older results may be dropped to fit it)."""
        slot = Slot(self)
        self._set(slot, value, nbytes)
        return slot

    @property
    def held(self) -> int:
        """Bytes of the values held now."""
        with self._lock:
            return sum(s.nbytes for s in self._slots.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)

    def _get(self, slot: Slot) -> Any:
        with self._lock:
            if slot._value is None or id(slot) not in self._slots:
                raise ResultDropped()
            self._slots.move_to_end(id(slot))
            return slot._value

    def _set(self, slot: Slot, value: Any, nbytes: int) -> None:
        room = self.budget - self.reserved()
        if nbytes > room:
            raise ResultTooLarge(
                f"This result needs {nbytes / 1e6:.0f} MB but the server keeps at most {max(room, 0) / 1e6:.0f} MB "
                "of results; try a smaller input size or a smaller model.")
        dropped = []  # released outside the lock, then their memory handed back
        with self._lock:
            self._slots.pop(id(slot), None)
            held = sum(s.nbytes for s in self._slots.values())
            while self._slots and held + nbytes > room:
                _, oldest = self._slots.popitem(last=False)
                held -= oldest.nbytes
                dropped.append(oldest._value)
                oldest._value, oldest.nbytes = None, 0
                self.evictions += 1
            slot._value, slot.nbytes = value, int(nbytes)
            self._slots[id(slot)] = slot
        if dropped:
            dropped.clear()
            release_freed_memory()

    def drop(self, slot: Slot) -> None:
        """Let one slot's value go (e.g. the session ended)."""
        with self._lock:
            self._slots.pop(id(slot), None)
            slot._value, slot.nbytes = None, 0
