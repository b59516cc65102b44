"""One engine interface for folder-level jobs: an in-process loop (the default) or Ray Data.

A job is a small picklable spec (`FolderJob`). An engine calls `job.open()` once per worker (which
loads the model once), feeds the worker batches of decoded images, and gets back `Sums`: running
sums and an image count, never per-image maps. `job.merge` adds two `Sums`, `job.finalize` turns the
sums of all images into the job's result. Engines read, decode and batch the files, move sums and
write shards; they never know what a job computes, and commands only choose one by name
(`run_job(..., engine="local" | "ray")`).

Files are split into shards in order (`EngineOptions.shard_size`). With `EngineOptions.out` each
finished shard's sums are written to `out/<job.name>/shard-NNNNN.json`, so a rerun after an
interruption skips the shards already done. Sums are float64, so the order in which batches,
shards and workers are merged changes a result only at float64 rounding.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np
from PIL import Image

from vit_inspect.core.errors import VitInspectError
from vit_inspect.core.images import ImageLimits, load_image

ENGINES = ("local", "ray")
Skipped = tuple[tuple[str, str], ...]  # (file name, reason) of each file that could not be read
Progress = Callable[[int, int], None]  # (files done, files in total)


@dataclass(frozen=True)
class Sums:
    """Running sums of a job over some images: small, mergeable, JSON-safe."""

    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)  # float64 sums, shapes defined by the job
    count: int = 0  # images that contributed

    def __add__(self, other: Sums) -> Sums:
        """Element-wise sum; a name missing on one side counts as zero."""
        names = set(self.arrays) | set(other.arrays)
        arrays = {name: np.add(self.arrays.get(name, 0.0), other.arrays.get(name, 0.0), dtype=np.float64)
                  for name in names}
        return Sums(arrays, self.count + other.count)

    def to_json(self) -> dict:
        """Exact JSON form (a float's repr round-trips float64)."""
        return {"count": self.count,
                "arrays": {name: {"shape": list(np.shape(a)), "data": np.asarray(a, np.float64).ravel().tolist()}
                           for name, a in sorted(self.arrays.items())}}

    @staticmethod
    def from_json(record: dict) -> Sums:
        arrays = {name: np.asarray(a["data"], dtype=np.float64).reshape(a["shape"])
                  for name, a in record["arrays"].items()}
        return Sums(arrays, int(record["count"]))


class JobWorker(Protocol):
    """What `FolderJob.open` returns: holds the model, maps one batch of images to sums."""

    def map_batch(self, images: Sequence[np.ndarray], names: Sequence[str]) -> Sums:
        """Sums over a batch of decoded images, each (H, W, 3) uint8 at its file's own size; `names`
        are their file names (for jobs that look up a label per file)."""


class FolderJob(Protocol):
    """A folder-level job. Must pickle (Ray ships it to every actor) and be cheap to pickle:
    it names its model; `open` loads it (once per worker)."""

    name: str  # folder name of its shards under `out`

    def open(self) -> JobWorker: ...

    def merge(self, a: Sums, b: Sums) -> Sums: ...

    def finalize(self, sums: Sums, skipped: Skipped) -> Any: ...


@dataclass(frozen=True)
class EngineOptions:
    """How a folder-level job is run; nothing here changes its result."""

    batch_size: int = 16  # images per model call
    max_batch_bytes: int = 256 * 2 ** 20  # decoded pixels a batch may hold; a batch is run before it would pass them
    shard_size: int = 256  # files per resumable shard
    out: str | None = None  # folder for per-shard results (resume); None: nothing written
    limits: ImageLimits = ImageLimits()  # what a file may be before it is decoded
    ray_address: str | None = None  # existing Ray cluster ("auto", "ray://host:10001"); None: a local Ray
    concurrency: int | None = None  # model actors under Ray (default: one per GPU, else 1)
    num_gpus: float | None = None  # GPUs per actor under Ray (default: 1 when the cluster has GPUs, else 0)
    cpus_per_actor: float = 1.0  # CPUs Ray reserves for each model actor (reading and decoding tasks use the rest)
    num_cpus: int | None = None  # CPUs of a local Ray started here (default: all)

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.shard_size < 1:
            raise VitInspectError("--batch-size and --shard-size must be at least 1.")
        if self.max_batch_bytes < 1:
            raise VitInspectError("The bytes a batch may hold must be at least 1.")
        if self.concurrency is not None and self.concurrency < 1:
            raise VitInspectError("--concurrency must be at least 1.")


@dataclass(frozen=True)
class Shard:
    """A run of consecutive files, the unit of resume."""

    index: int
    items: tuple  # paths (or PIL images, in-process only)
    key: str  # fingerprint of the job spec and the file names: a stored shard is reused only if it matches


@dataclass(frozen=True)
class ShardResult:
    """What one shard contributes: its sums and the files it skipped, in file order."""

    sums: Sums
    skipped: Skipped
    seen: int  # files handled, read or skipped


def item_name(item: Any) -> str:
    """The file name shown for an item (never its folder)."""
    return Path(str(getattr(item, "name", item))).name


def decode(item: Any, limits: ImageLimits) -> np.ndarray:
    """(H, W, 3) uint8 RGB of a file (or PIL image); raises `ImageError` for anything unreadable."""
    return np.asarray(load_image(item, limits), dtype=np.uint8)


def byte_bounded_runs(sizes: Sequence[int], max_bytes: int) -> list[range]:
    """Consecutive runs of items (by index) whose sizes sum to at most `max_bytes`: a run is closed before
    the next item would take it past them, and an item larger than `max_bytes` is a run of its own."""
    runs, start, held = [], 0, 0
    for index, size in enumerate(sizes):
        if index > start and held + size > max_bytes:
            runs.append(range(start, index))
            start, held = index, 0
        held += size
    if start < len(sizes):
        runs.append(range(start, len(sizes)))
    return runs


def make_shards(job: FolderJob, items: Sequence[Any], shard_size: int) -> list[Shard]:
    """Consecutive runs of `shard_size` items, each keyed by the job spec and its items' paths (a file
    changed in place under the same path is not noticed: use a new `--out` for new data)."""
    shards = []
    for index, start in enumerate(range(0, len(items), shard_size)):
        chunk = tuple(items[start:start + shard_size])
        digest = hashlib.sha256(repr(job).encode())
        for item in chunk:
            digest.update(b"\0" + str(item if not isinstance(item, Image.Image) else id(item)).encode())
        shards.append(Shard(index, chunk, digest.hexdigest()[:32]))
    return shards


class ShardStore:
    """Finished shards as JSON files under `out/<job name>/`; no pickle, written atomically."""

    def __init__(self, out: str | os.PathLike | None, job_name: str) -> None:
        self.folder = None if out is None else Path(out) / job_name

    def _path(self, shard: Shard) -> Path:
        return self.folder / f"shard-{shard.index:05d}.json"

    def load(self, shard: Shard) -> ShardResult | None:
        """The stored result of this shard, or None when absent, damaged or from other files/options."""
        if self.folder is None:
            return None
        try:
            record = json.loads(self._path(shard).read_text())
            if record.get("key") != shard.key:
                return None
            return ShardResult(Sums.from_json(record["sums"]), tuple((str(n), str(r)) for n, r in record["skipped"]),
                               int(record["seen"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, shard: Shard, result: ShardResult) -> None:
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {"key": shard.key, "seen": result.seen, "sums": result.sums.to_json(),
                  "skipped": [list(s) for s in result.skipped]}
        tmp = self._path(shard).with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self._path(shard))


@dataclass(frozen=True)
class RunInfo:
    """How a run went (not part of any result)."""

    engine: str
    shards: int  # shards in the run
    resumed: int  # shards read back from `out` instead of computed
    workers: int  # worker processes that returned sums (more than the actors when one was restarted)
    largest_batch: int = 0  # bytes of decoded pixels in the largest batch one worker held at once


