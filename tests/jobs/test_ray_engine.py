"""The Ray Data engine on a local Ray of 2 CPUs: same answers as the in-process loop, a killed actor
retried, resume from shards, the CLI. One Ray for the module; DeiT-Ti on a few shared samples."""
from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from support import DEIT_WEIGHTS, IMAGENET

from vit_inspect.cli.main import main
from vit_inspect.core.images import find_images
from vit_inspect.jobs.distance import AttentionDistanceJob
from vit_inspect.jobs.engine import EngineOptions, Sums
from vit_inspect.jobs.run import run_job

ray = pytest.importorskip("ray", reason="Ray Data is an optional extra: pip install -r requirements-ray.txt")
pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def local_ray():
    if not DEIT_WEIGHTS.is_file():
        pytest.skip(f"real weights not found at {DEIT_WEIGHTS}")
    from vit_inspect.jobs.ray_engine import start_ray

    started = start_ray(num_cpus=2)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Ten shared ImageNet photos, one file that is not an image and one that is gone."""
    folder = tmp_path_factory.mktemp("odd")
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    samples = find_images([IMAGENET])[:10]
    return samples[:4] + [folder / "broken.jpg"] + samples[4:] + [folder / "gone.png"]


def _job(**options) -> AttentionDistanceJob:
    # resolved, as the CLI's job has it: a stored shard is reused only for the same job spec
    return AttentionDistanceJob("deit_tiny_patch16_224", weights=str(DEIT_WEIGHTS.resolve()), device="cpu", **options)


def test_ray_gives_the_same_numbers_and_skips_as_local(local_ray, files):
    local, _ = run_job(_job(), files, "local", EngineOptions(batch_size=4))
    progress = []
    # two actors on two CPUs, each reserving the default CPU: the engine leaves one CPU to the decode tasks
    on_ray, info = run_job(_job(), files[::-1], "ray", EngineOptions(batch_size=3, shard_size=5, concurrency=2),
                           progress=lambda d, t: progress.append((d, t)))
    np.testing.assert_allclose(on_ray.distances, local.distances, rtol=1e-5)
    assert on_ray.num_images == local.num_images == 10
    assert local.skipped[0][0] == "broken.jpg" and local.skipped[1][0] == "gone.png"
    assert sorted(on_ray.skipped) == sorted(local.skipped)  # same names, same sentences
    assert info.engine == "ray" and info.shards == 3 and 1 <= info.workers <= 2
    assert progress[-1] == (12, 12) and [d for d, _ in progress] == sorted(d for d, _ in progress)
    # the README's fact: distance grows with depth (layer 0 mean < layer 11 mean)
    assert on_ray.distances[0].mean() < on_ray.distances[-1].mean()


def _actor_pids() -> list[int]:
    """Pids of this test's Ray Data model actors: processes below this one titled after JobActor."""
    parent, title = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                title[int(entry.name)] = (entry / "cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue

    def below_me(pid: int) -> bool:
        while pid in parent and pid > 1:
            pid = parent[pid]
            if pid == os.getpid():
                return True
        return False

    return [pid for pid, cmd in title.items() if b"MapBatches(JobActor)" in cmd and below_me(pid)]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the actor process through /proc")
def test_killed_actor_is_restarted_and_the_result_is_complete(local_ray, files, tmp_path):
    images = find_images([IMAGENET])[10:34]  # 24 photos, 12 batches of 2
    expected, _ = run_job(_job(input_size=(112, 112)), images, "local", EngineOptions(batch_size=8))
    killed = []

    def kill_first_actor(done: int, total: int) -> None:
        if not killed:
            pids = _actor_pids()
            assert pids, "no model actor process found"
            os.kill(pids[0], signal.SIGKILL)
            killed.append((pids[0], done))

    result, info = run_job(_job(input_size=(112, 112)), images, "ray", EngineOptions(batch_size=2, shard_size=6),
                           progress=kill_first_actor)
    assert killed and killed[0][1] < len(images)  # killed mid-run
    assert info.workers == 2  # the first actor's process and the one Ray restarted in its place
    assert result.num_images == len(images) and not result.skipped
    np.testing.assert_allclose(result.distances, expected.distances, rtol=1e-5)


def test_cli_prints_the_same_json_and_ray_resumes_from_shards(local_ray, files, tmp_path, capsys):
    folder = tmp_path / "photos"
    folder.mkdir()
    for path in files[:8]:  # seven photos and the broken file
        (folder / path.name).write_bytes(path.read_bytes())
    out = tmp_path / "out"
    args = ["model", "--images", str(folder), "--weights", str(DEIT_WEIGHTS), "--device", "cpu",
            "--batch-size", "3", "--shard-size", "4"]
    assert main(args + ["--engine", "local"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert main(args + ["--engine", "ray", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    on_ray = json.loads(captured.out)
    assert "8/8 images" in captured.err and "skipped broken.jpg: " in captured.err
    assert on_ray == {**local, "dataset_mean_attention_distance": on_ray["dataset_mean_attention_distance"]}
    np.testing.assert_allclose(on_ray["dataset_mean_attention_distance"], local["dataset_mean_attention_distance"],
                               atol=1.01e-3)  # printed to 3 decimals
    assert on_ray["num_images"] == 7

    shards = sorted((out / "attention_distance").glob("shard-*.json"))
    assert len(shards) == 2
    files_in_folder = find_images([folder])
    first, info = run_job(_job(), files_in_folder, "ray", EngineOptions(batch_size=3, shard_size=4, out=str(out)))
    assert info.resumed == 2 and info.workers == 0  # nothing left to compute
    shards[1].unlink()
    again, info = run_job(_job(), files_in_folder, "ray", EngineOptions(batch_size=3, shard_size=4, out=str(out)))
    assert info.resumed == 1 and info.workers == 1
    np.testing.assert_allclose(again.distances, first.distances, rtol=1e-6)
    assert again.skipped == first.skipped and again.num_images == 7


@dataclass(frozen=True)
class BatchShapes:
    """A job that records only the model batches its worker is given: how many, the most images in one,
    the most bytes in one, and the most bytes in one of two images or more."""

    name: str = "batch_shapes"

    def open(self) -> "BatchShapes":
        return self

    def map_batch(self, images, names) -> Sums:
        nbytes = float(sum(image.nbytes for image in images))
        return Sums({"batches": np.array(1.0), "images": np.array(float(len(images))), "bytes": np.array(nbytes),
                     "shared": np.array(nbytes if len(images) > 1 else 0.0)}, len(images))

    def merge(self, a: Sums, b: Sums) -> Sums:
        get = lambda s, k: float(s.arrays.get(k, 0.0))  # noqa: E731
        return Sums({"batches": np.array(get(a, "batches") + get(b, "batches")),
                     **{k: np.array(max(get(a, k), get(b, k))) for k in ("images", "bytes", "shared")}},
                    a.count + b.count)

    def finalize(self, sums: Sums, skipped) -> dict:
        return {"count": sums.count, **{k: float(v) for k, v in sums.arrays.items()}, "skipped": len(skipped)}


def test_ray_model_batches_are_bounded_in_bytes_as_the_local_ones(local_ray, tmp_path):
    """Eleven 100x100 photos (30,000 bytes decoded) and one 200x200 (120,000): with 70,000 bytes a
    model batch holds two small photos, and the large one is a batch of its own, as in the local engine."""
    from PIL import Image

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors cannot import this test file
    paths = []
    for i in range(12):
        side = 200 if i == 5 else 100
        paths.append(tmp_path / f"{i:02d}.png")
        Image.new("RGB", (side, side), (i, 2 * i, 3)).save(paths[-1])
    bounded, info = run_job(BatchShapes(), paths, "ray", EngineOptions(batch_size=16, max_batch_bytes=70_000))
    # what an actor held: a block Ray Data closed once past 70,000 bytes, so at most that plus one photo
    # (counted in images only, the block holding the large photo held it and five small ones: 270,000)
    assert 120_000 <= info.largest_batch <= 70_000 + 120_000
    local, info = run_job(BatchShapes(), paths, "local", EngineOptions(batch_size=16, max_batch_bytes=70_000))
    assert info.largest_batch == 120_000
    for result in (bounded, local):
        assert result["count"] == 12 and result["skipped"] == 0
        assert (result["images"], result["shared"], result["bytes"]) == (2, 60_000, 120_000)
        assert result["batches"] >= 7  # 11 small photos two at a time, and the large one
    by_count, info = run_job(BatchShapes(), paths, "ray", EngineOptions(batch_size=3))  # the default bound: 256 MiB
    assert by_count["count"] == 12 and by_count["images"] == 3 and by_count["batches"] >= 4
    assert info.largest_batch == 180_000  # three photos in a block, the large one among them
    assert ray.data.DataContext.get_current().target_max_block_size != 70_000  # the caller's context is restored
