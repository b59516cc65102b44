"""Head-fused attention spilled to files on local disk, under a byte budget.

The attention store keeps queries and keys and rebuilds a row as softmax(s·q·Kᵀ) on demand
(`attention_store`). Where heads x tokens are many for the width, rebuilding is dear: a first rollout
redraw of DINOv2-S/14 at 518 px (N = 1374, D = 384) rebuilds every layer, q·kᵀ and softmax over 1374²
entries per head, about 0.45 of a forward pass (`worth_spilling`; a model whose maps are small in bytes, such as
DeiT-Ti at 224 px, keeps them in memory instead, `attention_store.keeps_maps`, and never reaches a spill).

Rollout, in every option the app offers, reads each layer with its heads fused: their mean, maximum or
minimum (Abnar & Zuidema 2020; vit-explain). For such models the pass therefore writes, per layer, three
(N, N) planes of the probabilities the model produced (`PLANES`): the float32 sum over heads (the mean is
that sum / heads, divided in float64 when read), and the maximum and minimum over heads rounded once to
float16 (rounding is monotonic, so these equal the maximum and minimum of the float16-rounded maps). That is
8 N² bytes per layer, a quarter of the heads' own float16 maps for 16 heads (DINOv2-L/14 at 518: 362 MB
against 1.45 GB), and redraws read them from a private folder (the operating system keeps recent files in
its page cache) instead of fusing every head again. One head's rows are rebuilt from Q and K, which costs
heads times less than a fused layer.

A spill is an accelerator only: the queries and keys stay in the store, and a store whose spill was
dropped (the folder's byte budget, LRU; the result being dropped; a pickled copy) rebuilds rows from Q and K,
equal to the model's within the store's tolerance. Paths are never chosen by a client: the folder
is made by `tempfile.mkdtemp` (mode 0700), its files are numbered, and it is removed when the process
exits or the folder is closed.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import logging
import math
import os
import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from functools import cache
from pathlib import Path
from typing import Iterator

import numpy as np

log = logging.getLogger("vit_inspect.passes.spill")

# Spill when heads * N >= SPILL_MIN_SHARE * D^2. A first rollout redraw rebuilds heads x N^2 entries per
# layer (q.k^T and softmax) where a forward does about N x D^2 multiply-adds per layer (the projections and
# the MLP), so the redraw's share of a forward follows heads * N / D^2. Measured on the CPU with
# `bench.bench_large`, the slowest first redraw rebuilt from q and k costs: ViT-B/16 at 224 (share 0.004) 0.05 of a
# forward, ViT-B/16 at 384 (0.012) 0.14, DeiT-Ti at 224 (0.016) 0.22 with 1 thread and 0.31 with 2,
# DINOv2-L/14 at 518 (0.021) 0.23 with 1 thread, DINOv2-S/14 at 518 (0.056) 0.46. From 0.015 on it passes
# the 0.25 aimed at with 2 threads, so those models spill.
SPILL_MIN_SHARE = 0.015
DEFAULT_SPILL_BUDGET = 4 * 2 ** 30  # bytes of local disk the app's spills may take (DINOv2-L/14 at 518: 362 MB each)
# the planes of each layer, in file order: the float32 sum over heads, the float16 maximum and minimum over heads
PLANES = (("sum", np.dtype(np.float32)), ("max", np.dtype(np.float16)), ("min", np.dtype(np.float16)))
PLANE_BYTES = sum(dtype.itemsize for _, dtype in PLANES)  # per entry of an (N, N) plane, all planes together


def worth_spilling(num_tokens: int, embed_dim: int, num_heads: int) -> bool:
    """Whether a model's maps should be spilled: heads * N >= SPILL_MIN_SHARE * D^2 (see the constant)."""
    return num_heads * num_tokens >= SPILL_MIN_SHARE * embed_dim ** 2


class Spill:
    """One image's head-fused attention, ``shape`` (depth, N, N), as the `PLANES` of every layer in a file of a
    `SpillFolder`.

    `rows(i, index, plane)` gives rows of one plane of layer i, or None once the spill was dropped (by the
    folder's budget, or explicitly); a caller then rebuilds from the store's queries and keys. `complete` is
    False until `finish`: a pass that fails half-way leaves no half-written spill in use."""

    def __init__(self, folder: "SpillFolder", key: int, path: Path, shape: tuple[int, ...], reuse: bool = False):
        self.key, self.path, self.shape = key, path, shape
        self.nbytes = math.prod(shape) * PLANE_BYTES
        self._layer_bytes = self.nbytes // shape[0]
        # written with pwrite (half the time of filling a fresh mapping page by page), read through a mapping;
        # ``reuse``: the file exists (a released spill's, renamed to ``path`` by the folder) and is overwritten
        flags = os.O_RDWR | os.O_NOFOLLOW | (0 if reuse else os.O_CREAT | os.O_EXCL)
        self._fd: int | None = os.open(path, flags, 0o600)
        try:
            os.ftruncate(self._fd, self.nbytes)
        except OSError:
            self._close_fd()
            raise
        self._served = False  # finished and not dropped: `layer` maps the file
        self._written: set[int] = set()
        self.complete = False
        self._dropped = False  # set by the folder from any thread; only the writing thread closes the file
        self._folder = weakref.ref(folder)

    def write(self, layer: int, planes: dict[str, np.ndarray]) -> None:
        """Store layer ``layer``'s (N, N) planes, one per name of `PLANES` (converted to the plane's dtype
        here if they are not). A failed write (a full disk) drops the spill; the pass goes on."""
        if self._dropped:
            self._close_fd()
        if self._fd is None or self.complete or not 0 <= layer < self.shape[0]:
            return
        offset = layer * self._layer_bytes
        try:
            for name, dtype in PLANES:
                data = memoryview(np.ascontiguousarray(planes[name], dtype=dtype).reshape(self.shape[1:])).cast("B")
                done = 0
                while done < len(data):
                    done += os.pwrite(self._fd, data[done:], offset + done)
                offset += len(data)
        except OSError as exc:
            log.warning("Could not spill attention maps (%s); redraws rebuild them instead.", exc)
            self.discard()
            return
        self._written.add(layer)

    def _close_fd(self) -> None:
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)

    def discard(self) -> None:
        """Drop this spill now (its folder removes the file); called by the thread that writes it."""
        folder = self._folder()
        if folder is not None:
            folder.drop(self)
        self._forget()
        self._close_fd()

    def finish(self) -> bool:
        """Serve the spill if every layer was written (read-only from now on) and say so; otherwise drop it."""
        if self._dropped or self._fd is None or len(self._written) != self.shape[0]:
            self.discard()
            return False
        self._close_fd()
        self._served = self.complete = True
        return True

    def layer(self, layer: int, plane: str) -> np.ndarray | None:
        """(N, N) ``plane`` of one layer, or None when the spill is gone or unfinished."""
        return self.rows(layer, np.arange(self.shape[1]), plane)

    def rows(self, layer: int, index, plane: str) -> np.ndarray | None:
        """(len(index), N) query rows ``index`` of one layer's ``plane`` ("sum", "max" or "min", `PLANES`), read
        from the file into memory of their own (runs of consecutive rows in one read each), or None when the
        spill is gone or unfinished. Nothing stays mapped: the pages read stay in the page cache, not in this
        process's resident memory."""
        if not (self._served and self.complete) or not 0 <= layer < self.shape[0]:
            return None
        names = [name for name, _ in PLANES]
        if plane not in names:
            raise ValueError(f"unknown plane {plane!r}; choose one of {names}")
        folder = self._folder()
        if folder is not None:
            folder._touch(self.key)
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        tokens, width = self.shape[1:]
        dtype = dict(PLANES)[plane]
        row_bytes = width * dtype.itemsize
        base = layer * self._layer_bytes + sum(tokens * width * d.itemsize for _, d in PLANES[:names.index(plane)])
        out = np.empty((len(index), width), dtype=dtype)
        if len(index) == 0:
            return out
        if index.min() < 0 or index.max() >= tokens:
            raise IndexError(f"rows {index.min()}..{index.max()} outside 0..{tokens - 1}")
        cut = np.flatnonzero(np.diff(index) != 1) + 1  # runs of consecutive rows
        starts, ends = np.concatenate([[0], cut]), np.concatenate([cut, [len(index)]])
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:  # dropped meanwhile: the file went
            return None
        try:
            for start, end in zip(starts.tolist(), ends.tolist()):
                _read_exactly(fd, memoryview(out[start:end]).cast("B"), base + int(index[start]) * row_bytes)
        except OSError as exc:  # a truncated or vanished file: rebuild instead
            log.warning("Could not read spilled attention maps (%s); redraws rebuild them instead.", exc)
            return None
        finally:
            os.close(fd)
        return out

    @property
    def alive(self) -> bool:
        """Whether `layer` serves maps: finished and not dropped."""
        return self._served and self.complete

    def _forget(self) -> None:
        """Stop serving (the folder unlinks the file; an open mapping stays readable until released). The
        file descriptor stays with the writing thread: closing it here could let a write that is under way
        land in whatever file reuses its number."""
        self._dropped = True
        self._served = False
        self.complete = False

    def __del__(self) -> None:
        self._close_fd()

    def __reduce__(self):
        raise TypeError("a Spill is a local file and does not pickle; pickle the store, which drops it")


def _read_exactly(fd: int, into: memoryview, offset: int) -> None:
    """Fill ``into`` from ``fd`` at ``offset`` (os.preadv may return fewer bytes than asked)."""
    done = 0
    while done < len(into):
        got = os.preadv(fd, [into[done:]], offset + done)
        if got == 0:
            raise OSError(f"the spill file ends before byte {offset + len(into)}")
        done += got


class SpillFolder:
    """A private folder of `Spill` files whose sizes add up to at most ``budget`` bytes.

    `reserve` makes room by removing files kept for reuse, then by dropping the least recently read spills; a
    request larger than the whole budget gets None. A dropped spill's file is removed at once (a reader that
    still maps it keeps reading its own bytes). A spill whose `Spill` was garbage-collected (its result left
    the session store) can have no reader left, so its file is kept, renamed, for the next spill of the same
    size: overwriting pages the page cache already holds costs a tenth of writing a new file's (DINOv2-L/14
    at 518, 362 MB: 0.04-0.05 s against 0.1-0.6 s on the bench machine), and a new spill is served only once
    its pass wrote every layer (`Spill.finish`), so no byte of the earlier image is ever read. Kept files
    count toward the budget; all go with the folder (`close`, or when the process exits)."""

    def __init__(self, budget: int, root: str | Path | None = None):
        if budget < 0:
            raise ValueError(f"the spill budget must be at least 0 bytes, not {budget}")
        self.budget = int(budget)
        self.path = Path(tempfile.mkdtemp(prefix="vit_inspect_spill_", dir=root))  # mode 0700
        self._spills: OrderedDict[int, tuple[weakref.ref, int]] = OrderedDict()  # key -> (spill, bytes), LRU first
        self._free: OrderedDict[Path, int] = OrderedDict()  # files of released spills kept for reuse -> bytes, oldest first
        self._used = 0  # bytes of every file: the spills' and those kept for reuse
        self._lock = threading.Lock()
        # keys of spills garbage-collected while the lock was held (a collection can run inside a locked
        # section of this very thread, where waiting for the lock would never end): released on next locking
        self._released: collections.deque[int] = collections.deque()
        self._keys = itertools.count()
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.path), True)
        atexit.register(self._cleanup)

    @property
    def used(self) -> int:
        """Bytes of the folder's files: the spills alive now and the files kept for reuse."""
        with self._locked():
            return self._used

    @property
    def reusable(self) -> int:
        """Bytes of the files kept for reuse (released spills')."""
        with self._locked():
            return sum(self._free.values())

    def __len__(self) -> int:
        with self._locked():
            return len(self._spills)

    def reserve(self, shape: tuple[int, ...]) -> Spill | None:
        """A new spill of ``shape`` (depth, N, N) planes, after dropping least recently read spills as needed;
        None if it alone exceeds the budget or the file cannot be made (a full disk: the pass goes on without)."""
        nbytes = math.prod(shape) * PLANE_BYTES
        if nbytes > self.budget or not self.path.is_dir():
            return None
        with self._locked():
            key = next(self._keys)
            path = self.path / f"{key}.planes"
            reused = next((free for free, size in self._free.items() if size == nbytes), None)
            if reused is not None:
                del self._free[reused]
                self._used -= nbytes
                try:
                    os.rename(reused, path)
                except OSError:
                    reused.unlink(missing_ok=True)
                    reused = None
            while self._free and self._used + nbytes > self.budget:
                self._remove_free_locked(next(iter(self._free)))
            while self._spills and self._used + nbytes > self.budget:
                self._drop_locked(next(iter(self._spills)))
            try:
                spill = Spill(self, key, path, shape, reuse=reused is not None)
            except OSError as exc:  # no space left, a read-only or vanished folder
                log.warning("Could not spill attention maps (%s); redraws rebuild them instead.", exc)
                path.unlink(missing_ok=True)
                return None
            self._spills[key] = (weakref.ref(spill), nbytes)
            self._used += nbytes
        weakref.finalize(spill, self._release, key)
        return spill

    def drop(self, spill: Spill) -> None:
        """Drop ``spill`` now: its file goes, readers rebuild from queries and keys."""
        with self._locked():
            self._drop_locked(spill.key)

    def close(self) -> None:
        """Drop every spill and remove the folder."""
        with self._locked():
            for key in list(self._spills):
                self._drop_locked(key)
            for path in list(self._free):
                self._remove_free_locked(path)
        self._cleanup()

    def _touch(self, key: int) -> None:
        with self._locked():
            if key in self._spills:
                self._spills.move_to_end(key)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The folder's lock, with the releases deferred while it was held done first."""
        with self._lock:
            while self._released:
                self._release_locked(self._released.popleft())
            yield

    def _release(self, key: int) -> None:
        """The Spill was garbage-collected (`weakref.finalize`, in whatever thread collected it): released now
        if the lock is free, else deferred to the next time it is taken."""
        if not self._lock.acquire(blocking=False):
            self._released.append(key)
            return
        try:
            self._release_locked(key)
        finally:
            self._lock.release()

    def _release_locked(self, key: int) -> None:
        """No reader of the spill is left, so its finished or half-written file is kept for reuse (while the
        folder exists) instead of removed."""
        found = self._spills.pop(key, None)
        if found is None:
            return
        path, free = self.path / f"{key}.planes", self.path / f"free-{key}.planes"
        try:
            os.rename(path, free)
        except OSError:  # the folder was removed
            path.unlink(missing_ok=True)
            self._used -= found[1]
            return
        self._free[free] = found[1]

    def _remove_free_locked(self, path: Path) -> None:
        self._used -= self._free.pop(path)
        path.unlink(missing_ok=True)

    def _drop_locked(self, key: int) -> None:
        found = self._spills.pop(key, None)
        if found is None:
            return
        ref, nbytes = found
        self._used -= nbytes
        spill = ref()
        if spill is not None:
            spill._forget()
        (self.path / f"{key}.planes").unlink(missing_ok=True)


@cache
def shared_folder() -> SpillFolder:
    """The process's own spill folder, made on first use with DEFAULT_SPILL_BUDGET bytes: where a pass whose
    options leave the spill automatic (`options.PassOptions`, the notebook's and the CLI's) writes. A spill's
    file goes when its result is garbage-collected, the folder when the process exits (`SpillFolder`)."""
    return SpillFolder(DEFAULT_SPILL_BUDGET)
