"""The Ray Data engine for folder-level jobs (`jobs.run.run_job(..., engine="ray")`).

The pipeline is one Ray Dataset:
    file paths --(tasks: read + decode, `ImageLimits` checked)--> RGB arrays
               --(actors: `map_batches` with a class, one `job.open()` = one model load per actor)-->
    one row of running sums per (batch, shard).
A batch is one decoded block: at most `batch_size` files, closed by Ray Data once it passes
`max_batch_bytes`; the actor splits it into model calls of at most that many bytes (or one image),
as the local engine batches.
The driver merges rows per shard; a shard whose files are all accounted for is written to `out` (resume)
and counted in the progress. Model replicas are restarted by Ray when their process dies and their
unfinished batches retried (Ray Data's actor defaults: `max_restarts=-1`, `max_task_retries=-1`; an
actor whose constructor fails is not restarted); every shard's file count is checked, so a lost or
duplicated batch is an error, never a silently wrong mean.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
from typing import Any, Sequence

import numpy as np

from vit_inspect.core.errors import VitInspectError
from vit_inspect.jobs.engine import (EngineOptions, FolderJob, Progress, Shard, ShardResult, ShardStore, Sums,
                                     byte_bounded_runs, decode, item_name)

RAY_INSTALL = "pip install -r requirements-ray.txt"


def import_ray():
    """The `ray` module with Ray Data, or a one-line error naming the install command."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise VitInspectError(f"--engine ray needs Ray Data, which is not installed; install it with: {RAY_INSTALL}") \
            from None
    return ray


def runtime_env() -> dict:
    """Ship this package's code to every worker, so cluster nodes need only the dependencies."""
    return {"py_modules": [sys.modules["vit_inspect"]]}  # the package this module belongs to, already imported


def start_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Join the cluster at `address`, or start a local Ray on this machine; False when Ray was already up."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, runtime_env=runtime_env(), logging_level=logging.WARNING)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=runtime_env(),
                 logging_level=logging.WARNING)
    ray.data.DataContext.get_current().enable_progress_bars = False  # progress is ours, per file
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    return True


def decode_row(row: dict[str, Any], limits) -> dict[str, Any]:
    """Ray task: read and decode one file; an unreadable one becomes an empty image and its reason."""
    try:
        image, error = decode(row["path"], limits), ""
    except VitInspectError as exc:
        image, error = np.zeros((0, 0, 3), np.uint8), str(exc)
    return {**row, "image": image, "error": error}


class JobActor:
    """Ray actor: opens the job once (one model load), maps each batch to sums per shard."""

    def __init__(self, job: FolderJob, max_batch_bytes: int) -> None:
        self.job = job
        self.worker = job.open()
        self.pid = os.getpid()
        self.max_batch_bytes = max_batch_bytes

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shards, seen, partials = [], [], []
        for shard in np.unique(batch["shard"]):
            rows = np.flatnonzero(batch["shard"] == shard)
            readable = [i for i in rows if not batch["error"][i]]
            sums = Sums()
            for run in byte_bounded_runs([batch["image"][i].nbytes for i in readable], self.max_batch_bytes):
                chosen = [readable[k] for k in run]  # the model's batch: at most max_batch_bytes, or one image
                sums = self.job.merge(sums, self.worker.map_batch([batch["image"][i] for i in chosen],
                                                                  [item_name(batch["path"][i]) for i in chosen]))
            skipped = [[int(batch["index"][i]), item_name(batch["path"][i]), str(batch["error"][i])]
                       for i in rows if batch["error"][i]]
            shards.append(int(shard))
            seen.append(len(rows))
            partials.append(json.dumps({"sums": sums.to_json(), "skipped": skipped}))
        held = sum(image.nbytes for image in batch["image"])  # what this call holds: the decoded block
        return {"shard": np.array(shards, np.int64), "seen": np.array(seen, np.int64),
                "partial": np.array(partials, dtype=object), "pid": np.full(len(shards), self.pid, np.int64),
                "held": np.full(len(shards), held, np.int64)}


def run_shards_on_ray(job: FolderJob, shards: Sequence[Shard], options: EngineOptions, store: ShardStore,
                      progress: Progress | None, done: int, total: int) -> tuple[dict[int, ShardResult], int, int]:
    """Run the pending shards on Ray; returns ({shard index: result}, worker processes that returned sums,
    the most decoded bytes one actor call held)."""
    if not shards:
        return {}, 0, 0
    for shard in shards:
        if not all(isinstance(item, (str, os.PathLike)) for item in shard.items):
            raise VitInspectError("The Ray engine reads files: pass paths, not images in memory.")
    ray = import_ray()
    started = start_ray(options.ray_address, options.num_cpus)
    try:
        return _run(ray, job, shards, options, store, progress, done, total)
    except ray.exceptions.RayError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise VitInspectError(f"The Ray run failed: {first_line}") from None
    finally:
        if started:
            ray.shutdown()


def _actor_resources(ray, options: EngineOptions) -> tuple[float, int]:
    """(GPUs per actor, number of actors): one actor per GPU on a GPU cluster, else one CPU actor."""
    cluster_gpus = ray.cluster_resources().get("GPU", 0)
    num_gpus = options.num_gpus if options.num_gpus is not None else (1.0 if cluster_gpus >= 1 else 0.0)
    if options.concurrency is not None:
        return num_gpus, options.concurrency
    return num_gpus, max(1, int(cluster_gpus // num_gpus)) if num_gpus else 1


def _cpus_per_actor(ray, options: EngineOptions, actors: int) -> float:
    """CPUs Ray reserves for each model actor: `cpus_per_actor`, lowered where the actors would reserve the
    cluster's last CPU, so that one read + decode task (1 CPU) can always run; else the actors would wait for
    images that no task is ever scheduled to decode (``--concurrency 2`` on a local Ray of 2 CPUs). The
    reservation is Ray's bookkeeping: the operating system shares the cores among the processes either way."""
    room = max(ray.cluster_resources().get("CPU", 1) - 1, 0) / actors
    return min(options.cpus_per_actor, room)


def _decode_tasks(ray, actors: int) -> int:
    """Concurrent read + decode tasks: one per cluster CPU. A task pool whose size differs from the
    actor pool's is never fused into the actors by Ray Data, so decoding stays spread over tasks."""
    tasks = max(1, int(ray.cluster_resources().get("CPU", 1)))
    return tasks + 1 if tasks == actors else tasks


def _run(ray, job: FolderJob, shards: Sequence[Shard], options: EngineOptions, store: ShardStore,
         progress: Progress | None, done: int, total: int) -> tuple[dict[int, ShardResult], int, int]:
    rows = [{"path": str(item), "shard": shard.index, "index": i}
            for shard in shards for i, item in enumerate(shard.items)]
    num_gpus, concurrency = _actor_resources(ray, options)
    decode_tasks = _decode_tasks(ray, concurrency)
    # A model batch is one decoded block: each read task decodes one block of at most batch_size files, and
    # Ray Data closes its output block once the block passes its target size, here max_batch_bytes.
    blocks = min(len(rows), max(decode_tasks, math.ceil(len(rows) / options.batch_size)))
    context = ray.data.DataContext.get_current()
    saved = context.target_max_block_size
    context.target_max_block_size = options.max_batch_bytes  # the dataset keeps its own copy of the context
    try:
        dataset = (ray.data.from_items(rows, override_num_blocks=blocks)
                   .map(decode_row, fn_kwargs={"limits": options.limits},
                        compute=ray.data.TaskPoolStrategy(size=decode_tasks))
                   .map_batches(JobActor, fn_constructor_args=(job, options.max_batch_bytes), batch_size=None,
                                batch_format="numpy", compute=ray.data.ActorPoolStrategy(size=concurrency),
                                num_cpus=_cpus_per_actor(ray, options, concurrency), num_gpus=num_gpus))
    finally:
        context.target_max_block_size = saved
    by_index = {shard.index: shard for shard in shards}
    sums = {index: Sums() for index in by_index}
    skipped: dict[int, list] = {index: [] for index in by_index}
    seen = dict.fromkeys(by_index, 0)
    results, pids, largest = {}, set(), 0
    for row in dataset.iter_rows():
        index = int(row["shard"])
        partial = json.loads(row["partial"])
        sums[index] = job.merge(sums[index], Sums.from_json(partial["sums"]))
        skipped[index].extend(partial["skipped"])
        seen[index] += int(row["seen"])
        pids.add(int(row["pid"]))
        largest = max(largest, int(row["held"]))
        if seen[index] > len(by_index[index].items):
            raise VitInspectError(f"Shard {index} got results for more files than it has; a batch was counted twice.")
        if seen[index] == len(by_index[index].items):
            listed = tuple((name, reason) for _, name, reason in sorted(skipped[index]))
            results[index] = ShardResult(sums[index], listed, seen[index])
            store.save(by_index[index], results[index])
        done += int(row["seen"])
        if progress is not None:
            progress(done, total)
    missing = sorted(set(by_index) - set(results))
    if missing:
        raise VitInspectError(f"The Ray run ended with shards {missing} incomplete; rerun with the same --out to finish.")
    return results, len(pids), largest
