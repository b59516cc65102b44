"""A bounded, thread-safe cache of loaded models, shared by every user of a server.

Loading a ViT takes seconds and holds its weights in memory, so a server keeps at most `max_size`
handles and evicts the least recently used one first. A model is loaded once even when many
requests ask for it at the same moment; different models load in parallel.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from vit_inspect.core.handle import ViTHandle, resolve_device
from vit_inspect.core.load import load_model

DEFAULT_CACHE_SIZE = 2


@dataclass(frozen=True)
class CacheKey:
    """What makes two loaded models the same: name, weights file and device."""

    name: str  # timm name or Hugging Face id, as given to `load_model`
    weights: str | None  # absolute path of the weights file; None: `load_model`'s own search
    device: str  # resolved torch device, e.g. "cpu" or "cuda:0"

    @classmethod
    def of(cls, name: str, weights: str | os.PathLike | None = None,
           device: str | torch.device | None = None) -> CacheKey:
        """The key for a `load_model(name, weights, device)` call; raises ValueError for an unknown device."""
        return cls(name=name.strip(), weights=None if weights is None else str(Path(weights).resolve()),
                   device=str(resolve_device(device)))


class ModelCache:
    """At most `max_size` loaded `ViTHandle`s, least recently used evicted first; thread-safe."""

    def __init__(self, max_size: int = DEFAULT_CACHE_SIZE, loader: Callable[..., ViTHandle] = load_model):
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self.max_size = max_size
        self._loader = loader  # called as loader(name, weights=..., device=..., **load_kwargs)
        self._entries: OrderedDict[CacheKey, ViTHandle] = OrderedDict()  # least recently used first
        self._loading: dict[CacheKey, threading.Lock] = {}  # one lock per key while it loads
        self._lock = threading.Lock()  # guards _entries and _loading, never held while loading

    def get(self, key: CacheKey, **load_kwargs) -> ViTHandle:
        """The handle for `key`, loading it (with `load_kwargs`) on a miss.

        Errors of the loader (`VitInspectError`s, `ValueError`) propagate and nothing is cached,
        so the next call tries again.
        """
        with self._lock:
            if key in self._entries:
                return self._use(key)
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:  # a second request for the same model waits here for the first one's load
            with self._lock:
                if key in self._entries:
                    return self._use(key)
            try:
                handle = self._loader(key.name, weights=key.weights, device=key.device, **load_kwargs)
            except BaseException:
                with self._lock:
                    self._loading.pop(key, None)
                raise
            with self._lock:
                self._entries[key] = handle
                while len(self._entries) > self.max_size:
                    self._entries.popitem(last=False)
                self._loading.pop(key, None)
        return handle

    def _use(self, key: CacheKey) -> ViTHandle:
        self._entries.move_to_end(key)
        return self._entries[key]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def handles(self) -> list[ViTHandle]:
        """Cached handles, least recently used first (does not mark them used)."""
        with self._lock:
            return list(self._entries.values())

    def keys(self) -> list[CacheKey]:
        """Cached keys, least recently used first."""
        with self._lock:
            return list(self._entries)
