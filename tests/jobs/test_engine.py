"""The engine interface with the in-process engine: sums, shards, resume, progress, skipped files."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from support import tiny_handle

from vit_inspect.analysis import mean_attention_distance
from vit_inspect.core.errors import VitInspectError
from vit_inspect.jobs.distance import AttentionDistanceJob, AttentionDistanceWorker
from vit_inspect.jobs.engine import EngineOptions, Sums
from vit_inspect.jobs.run import run_job
from vit_inspect.passes.pipeline import analyze_image


def _folder(tmp_path, count: int, bad: tuple[int, ...] = ()) -> list:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        path = tmp_path / f"img{i:02d}.png"
        if i in bad:
            path.write_bytes(b"not an image")
        else:
            Image.fromarray(rng.integers(0, 256, (40 + i, 48, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


class CountingWorker:
    """Wraps a worker; counts batches and can stop the run (like Ctrl-C) after some batches."""

    def __init__(self, worker, stop_after: int | None = None) -> None:
        self.worker, self.stop_after, self.batches, self.images = worker, stop_after, 0, 0

    def map_batch(self, images, names):
        if self.stop_after is not None and self.batches == self.stop_after:
            raise KeyboardInterrupt
        assert len(names) == len(images) and all(name.startswith("img") for name in names)
        self.batches += 1
        self.images += len(images)
        return self.worker.map_batch(images, names)


def test_sums_add_and_json_round_trip_exactly():
    a = Sums({"x": np.array([[1.0, 2.0]]), "y": np.array(0.1)}, 2)
    b = Sums({"x": np.array([[0.5, 0.25]])}, 3)
    total = a + b
    assert total.count == 5
    np.testing.assert_array_equal(total.arrays["x"], [[1.5, 2.25]])
    assert total.arrays["y"] == 0.1  # missing on one side counts as zero
    assert (Sums() + a).count == 2
    back = Sums.from_json(json.loads(json.dumps(Sums({"z": np.array([1 / 3, np.pi])}, 1).to_json())))
    assert back.arrays["z"].tolist() == [1 / 3, np.pi]  # bit-exact


def test_local_engine_matches_per_image_analysis_and_lists_skipped(tmp_path):
    handle = tiny_handle("cls")
    paths = _folder(tmp_path, 7, bad=(2, 5))
    job = AttentionDistanceJob("tiny-cls")
    result, info = run_job(job, paths, "local", EngineOptions(batch_size=2, shard_size=3),
                           worker=AttentionDistanceWorker(handle))
    good = [p for i, p in enumerate(paths) if i not in (2, 5)]
    expected = np.mean([analyze_image(handle, p, gradients=False).mean_distance for p in good], axis=0)
    np.testing.assert_allclose(result.distances, expected, rtol=1e-5)
    assert result.num_images == 5 and info.shards == 3 and info.resumed == 0
    assert [name for name, _ in result.skipped] == ["img02.png", "img05.png"]
    assert all("not an image format" in reason for _, reason in result.skipped)


def test_order_batching_and_shards_do_not_change_the_result(tmp_path):
    handle = tiny_handle("gap")
    paths = _folder(tmp_path, 9)
    worker = AttentionDistanceWorker(handle)
    job = AttentionDistanceJob("tiny-gap")
    runs = [run_job(job, order, "local", EngineOptions(batch_size=b, shard_size=s), worker=worker)[0]
            for order, b, s in ((paths, 1, 100), (paths[::-1], 4, 2), (paths[3:] + paths[:3], 9, 5))]
    for other in runs[1:]:
        np.testing.assert_allclose(other.distances, runs[0].distances, rtol=1e-5)
    # by hand: the mean over images of the per-image distances, one image at a time
    singles = [mean_attention_distance(analyze_image(handle, p, gradients=False).attention_stack().astype(np.float32),
                                       handle.layout()) for p in paths]
    np.testing.assert_allclose(runs[0].distances, np.mean(singles, axis=0), rtol=1e-3)


def test_interrupted_run_resumes_skipping_finished_shards(tmp_path):
    handle = tiny_handle("cls")
    (tmp_path / "in").mkdir()
    paths = _folder(tmp_path / "in", 10, bad=(4,))
    job = AttentionDistanceJob("tiny-cls")
    options = EngineOptions(batch_size=2, shard_size=4, out=str(tmp_path / "out"))
    full, _ = run_job(job, paths, "local", EngineOptions(batch_size=2, shard_size=4),
                      worker=AttentionDistanceWorker(handle))

    interrupted = CountingWorker(AttentionDistanceWorker(handle), stop_after=3)  # shard 0 = 2 batches, then 1 of shard 1
    with pytest.raises(KeyboardInterrupt):
        run_job(job, paths, "local", options, worker=interrupted)
    assert sorted(p.name for p in (tmp_path / "out" / "attention_distance").iterdir()) == ["shard-00000.json"]

    progress = []
    resumed = CountingWorker(AttentionDistanceWorker(handle))
    result, info = run_job(job, paths, "local", options, progress=lambda d, t: progress.append((d, t)),
                           worker=resumed)
    assert info.resumed == 1 and resumed.images == 5  # shards 1 and 2: 6 files, one unreadable
    assert progress[0] == (4, 10) and progress[-1] == (10, 10)
    np.testing.assert_allclose(result.distances, full.distances, rtol=1e-12)
    assert result.skipped == full.skipped and result.num_images == 9

    again = CountingWorker(AttentionDistanceWorker(handle))
    result, info = run_job(job, paths, "local", options, worker=again)
    assert again.batches == 0 and info.resumed == 3
    np.testing.assert_allclose(result.distances, full.distances, rtol=1e-12)


def test_stored_shards_of_other_files_or_options_are_not_reused(tmp_path):
    handle = tiny_handle("cls")
    paths = _folder(tmp_path, 4)
    out = str(tmp_path / "out")
    run_job(AttentionDistanceJob("tiny-cls"), paths, "local", EngineOptions(shard_size=2, out=out),
            worker=AttentionDistanceWorker(handle))
    counting = CountingWorker(AttentionDistanceWorker(handle))
    _, info = run_job(AttentionDistanceJob("tiny-cls"), paths[:1] + paths[2:], "local",
                      EngineOptions(shard_size=2, out=out), worker=counting)
    assert info.resumed == 0 and counting.images == 3  # same shard numbers, other files: recomputed
    counting = CountingWorker(AttentionDistanceWorker(handle, renormalize=False))
    _, info = run_job(AttentionDistanceJob("tiny-cls", renormalize=False), paths, "local",
                      EngineOptions(shard_size=2, out=out), worker=counting)
    assert info.resumed == 0 and counting.images == 4
    shard = tmp_path / "out" / "attention_distance" / "shard-00000.json"
    shard.write_text("{damaged")
    _, info = run_job(AttentionDistanceJob("tiny-cls", renormalize=False), paths, "local",
                      EngineOptions(shard_size=2, out=out), worker=AttentionDistanceWorker(handle, renormalize=False))
    assert info.resumed == 1  # the damaged shard is recomputed, the other read back


def test_a_batch_is_run_before_its_decoded_pixels_pass_the_byte_bound():
    """batch_size 16, max_batch_bytes 70,000: 100x100 RGB images are 30,000 bytes each, so two fit and a
    third would make 90,000; a 200x200 image (120,000 bytes) is a batch of its own; an unreadable item
    is skipped without counting."""
    model = AttentionDistanceWorker(tiny_handle("cls"))

    class Recording:
        def __init__(self):
            self.batches = []

        def map_batch(self, images, names):
            self.batches.append(([image.shape[:2] for image in images], list(names)))
            return model.map_batch(images, names)

    small = [Image.new("RGB", (100, 100), (i, 0, 0)) for i in range(5)]
    large = Image.new("RGB", (200, 200))
    for image, name in zip(small + [large], "abcdeL"):
        image.name = f"{name}.png"
    items = small[:2] + [large] + small[2:] + ["missing.png"]
    worker = Recording()
    result, info = run_job(AttentionDistanceJob("tiny-cls"), items, "local",
                           EngineOptions(batch_size=16, max_batch_bytes=70_000), worker=worker)
    assert result.num_images == 6 and [name for name, _ in result.skipped] == ["missing.png"]
    assert info.largest_batch == 120_000  # the large image alone; two small ones are 60,000
    assert [names for _, names in worker.batches] == [["a.png", "b.png"], ["L.png"], ["c.png", "d.png"], ["e.png"]]
    assert worker.batches[1][0] == [(200, 200)]
    worker = Recording()
    _, info = run_job(AttentionDistanceJob("tiny-cls"), small, "local", EngineOptions(batch_size=2), worker=worker)
    assert [len(names) for _, names in worker.batches] == [2, 2, 1]  # the default bound leaves small batches alone
    assert info.largest_batch == 60_000
    with pytest.raises(VitInspectError, match="at least 1"):
        EngineOptions(max_batch_bytes=0)


def test_no_readable_image_and_bad_options_are_one_sentence(tmp_path):
    paths = _folder(tmp_path, 2, bad=(0, 1))
    with pytest.raises(VitInspectError, match="None of the images could be read. First problem: img00.png"):
        run_job(AttentionDistanceJob("tiny-cls"), paths, "local", worker=AttentionDistanceWorker(tiny_handle("cls")))
    with pytest.raises(VitInspectError, match="Unknown engine 'spark'"):
        run_job(AttentionDistanceJob("tiny-cls"), paths, "spark")
    with pytest.raises(VitInspectError, match="at least 1"):
        EngineOptions(batch_size=0)


def test_missing_ray_is_one_line_naming_the_install_command(monkeypatch):
    import builtins

    from vit_inspect.jobs import ray_engine

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(VitInspectError) as info:
        ray_engine.import_ray()
    message = str(info.value)
    assert "\n" not in message and message.endswith("install it with: pip install -r requirements-ray.txt")


def test_ray_placement_follows_the_cluster():
    """One GPU actor per GPU on a GPU cluster, one CPU actor otherwise; decode tasks in a pool of
    their own size (a pool the size of the actor pool would be fused into the actors)."""
    from vit_inspect.jobs.ray_engine import _actor_resources, _decode_tasks

    class Cluster:
        def __init__(self, **resources) -> None:
            self.resources = resources

        def cluster_resources(self) -> dict:
            return self.resources

    gpus = Cluster(CPU=64, GPU=8)
    assert _actor_resources(gpus, EngineOptions()) == (1.0, 8)
    assert _actor_resources(gpus, EngineOptions(num_gpus=0.5)) == (0.5, 16)
    assert _actor_resources(gpus, EngineOptions(concurrency=3)) == (1.0, 3)
    assert _actor_resources(Cluster(CPU=2), EngineOptions()) == (0.0, 1)
    assert _decode_tasks(Cluster(CPU=64), 8) == 64 and _decode_tasks(Cluster(CPU=2), 2) == 3


def test_a_model_file_reference_is_made_absolute_for_workers(tmp_path, monkeypatch):
    from vit_inspect.jobs.workers import absolute_model_file

    monkeypatch.chdir(tmp_path)
    assert absolute_model_file("nets/vit.py:make") == f"{tmp_path / 'nets' / 'vit.py'}:make"
    assert absolute_model_file("vit.py") == f"{tmp_path / 'vit.py'}:build"
    assert absolute_model_file(None) is None
    job = AttentionDistanceJob.for_handle(tiny_handle("cls"), model_file="vit.py")
    assert job.model_file == f"{tmp_path / 'vit.py'}:build" and job.weights is None  # random weights: no file
