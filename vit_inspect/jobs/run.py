"""`run_job`: a folder job on the engine named, resumed from its shards; the local engine."""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from vit_inspect.core.errors import VitInspectError
from vit_inspect.jobs.engine import (ENGINES, EngineOptions, FolderJob, JobWorker, Progress, RunInfo, Shard,
                                     ShardResult, ShardStore, Sums, decode, item_name, make_shards)


def run_job(job: FolderJob, items: Iterable[Any], engine: str = "local", options: EngineOptions = EngineOptions(),
            progress: Progress | None = None, worker: JobWorker | None = None) -> tuple[Any, RunInfo]:
    """Run `job` over `items` (paths; PIL images too in-process) on the engine named, and return
    (`job.finalize(...)`, `RunInfo`). `worker`: an already opened worker for the local engine
    (saves a model load when the caller holds the model); other engines open their own."""
    if engine not in ENGINES:
        raise VitInspectError(f"Unknown engine {engine!r}; use one of: {', '.join(ENGINES)}.")
    items = list(items)
    shards = make_shards(job, items, options.shard_size)
    store = ShardStore(options.out, job.name)
    results: dict[int, ShardResult] = {}
    for shard in shards:
        stored = store.load(shard)
        if stored is not None:
            results[shard.index] = stored
    resumed = len(results)
    pending = [s for s in shards if s.index not in results]
    done = sum(r.seen for r in results.values())
    if progress is not None and done:
        progress(done, len(items))
    if engine == "ray":
        from vit_inspect.jobs.ray_engine import run_shards_on_ray
        computed, workers, largest = run_shards_on_ray(job, pending, options, store, progress, done, len(items))
    else:
        computed, workers, largest = run_shards_locally(job, pending, options, store, progress, done, len(items),
                                                        worker)
    results.update(computed)
    sums, skipped = Sums(), []
    for index in sorted(results):
        sums = job.merge(sums, results[index].sums)
        skipped.extend(results[index].skipped)
    return job.finalize(sums, tuple(skipped)), RunInfo(engine, len(shards), resumed, workers, largest)


def run_shards_locally(job: FolderJob, shards: Sequence[Shard], options: EngineOptions, store: ShardStore,
                       progress: Progress | None, done: int, total: int,
                       worker: JobWorker | None = None) -> tuple[dict[int, ShardResult], int, int]:
    """The in-process engine: one worker, batches of `batch_size` decoded images, streaming. A batch is
    also run early when the next image would take its decoded pixels past `max_batch_bytes`: sixteen
    40-MP photos would hold 1.9 GB at once; so a batch holds at most that many bytes (or one image larger
    than them), and memory peaks at it plus the one image being decoded. Returns (results, workers = 1,
    the largest batch's decoded bytes)."""
    if not shards:
        return {}, 0, 0
    worker = worker if worker is not None else job.open()
    results, largest = {}, 0
    for shard in shards:
        sums, skipped, batch, names, held = Sums(), [], [], [], 0
        for item in shard.items:
            try:
                image = decode(item, options.limits)
            except VitInspectError as exc:
                skipped.append((item_name(item), str(exc)))
            else:
                if batch and held + image.nbytes > options.max_batch_bytes:
                    sums = job.merge(sums, worker.map_batch(batch, names))
                    batch, names, held = [], [], 0
                batch.append(image)
                names.append(item_name(item))
                held += image.nbytes
                largest = max(largest, held)
                del image
            if len(batch) == options.batch_size:
                sums = job.merge(sums, worker.map_batch(batch, names))
                batch, names, held = [], [], 0
            done += 1
            if progress is not None:
                progress(done, total)
        if batch:
            sums = job.merge(sums, worker.map_batch(batch, names))
        results[shard.index] = ShardResult(sums, tuple(skipped), len(shard.items))
        store.save(shard, results[shard.index])
    return results, 1, largest
