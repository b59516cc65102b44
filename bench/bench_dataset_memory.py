"""Peak memory of a dataset job over large photos: batches bounded in decoded bytes against batches
bounded in count only, measured in one run.

The app's dataset job takes up to 16 photos of up to 40 MP (its pixel limit). The in-process engine
decodes a batch before running it; counted in images only, sixteen 40-MP photos held 1.9 GB of
pixels at once. `EngineOptions.max_batch_bytes` (256 MiB) runs a batch before the next image would
take it past that. Each setting runs in a fresh interpreter; the tables report the peak RSS during
the job (`VmHWM`, reset through `/proc/self/clear_refs` once the model is loaded) above the RSS before it. DeiT-Ti, random weights, CPU;
the photos are flat-coloured PNGs (small files, full-size pixels once decoded).

A second table: one 40-MP float TIFF (300 kB, deflate) through `load_image`, whose 8-bit scaling runs
in bands of rows, against the same file scaled as one whole-image float64 array (the previous code,
kept here as the reference), each in a fresh process.

    python -m bench.bench_dataset_memory [--count 16] [--megapixels 40]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from vit_inspect.core.images import BAND_PIXELS

from .common import REPO, markdown_table, print_header, report

# Run first in each child, after its imports: `job()` runs the measured work; the child prints the RSS
# before it and the peak during it (VmHWM, reset through /proc/self/clear_refs), in KiB, with its outcome.
MEASURE = """
import json
def rss_kib(field):
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith(field + ":")))
def measured(job):
    open("/proc/self/clear_refs", "w").write("5")  # Linux: reset the peak to the current RSS
    before = rss_kib("VmRSS")
    outcome = job()
    print(json.dumps({"outcome": outcome, "before_kib": before, "peak_kib": rss_kib("VmHWM")}))
"""

DATASET_JOB = MEASURE + """
import glob, sys
from vit_inspect.jobs.engine import EngineOptions
from vit_inspect.jobs.run import run_job
from vit_inspect.jobs.distance import AttentionDistanceJob, AttentionDistanceWorker
from vit_inspect.core.load import load_model
worker = AttentionDistanceWorker(load_model("deit_tiny_patch16_224", pretrained=False, device="cpu"))
files = sorted(glob.glob(sys.argv[1] + "/*.png"))
options = EngineOptions(batch_size=int(sys.argv[2]), max_batch_bytes=int(sys.argv[3]))
measured(lambda: run_job(AttentionDistanceJob("deit_tiny_patch16_224"), files, "local", options,
                         worker=worker)[0].num_images)
"""

TIFF_SCALING = MEASURE + """
import sys
import numpy as np
from PIL import Image
from vit_inspect.core.images import load_image
def whole():  # the whole-image float64 scaling vit_inspect used before
    with Image.open(sys.argv[1]) as image:
        array = np.asarray(image, dtype=np.float64)
    low, high = float(array.min()), float(array.max())
    return Image.fromarray(((array - low) / (high - low) * 255.0 + 0.5).astype(np.uint8)).convert("RGB").size
measured(lambda: load_image(sys.argv[1]).size if sys.argv[2] == "bands" else whole())
"""


def in_fresh_process(script: str, *args: object) -> dict:
    """{"outcome", "before_kib", "peak_kib"} of `script` run in a fresh interpreter (2 torch threads)."""
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          check=True, env={"OMP_NUM_THREADS": "2", "PATH": ""})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--megapixels", type=float, default=40.0)
    args = parser.parse_args(argv)
    from vit_inspect.jobs.engine import EngineOptions
    bound = EngineOptions().max_batch_bytes
    width = int((args.megapixels * 1e6 * 4 / 3) ** 0.5)
    height = int(args.megapixels * 1e6 / width)
    with tempfile.TemporaryDirectory() as folder:
        photo = Image.new("RGB", (width, height), (120, 90, 60))
        for index in range(args.count):
            photo.save(Path(folder) / f"photo{index:02d}.png", compress_level=1)
        runs = {"batches of 16, counted in images only": in_fresh_process(DATASET_JOB, folder, 16, 2 ** 50),
                f"batches of 16, at most {bound / 2 ** 20:.0f} MiB decoded": in_fresh_process(DATASET_JOB, folder, 16, bound),
                "one image at a time (the floor)": in_fresh_process(DATASET_JOB, folder, 1, bound)}
        floats = np.zeros((height, width), np.float32)
        floats[:, : width // 2] = 1.5
        tiff = str(Path(folder) / "float.tif")
        Image.fromarray(floats).save(tiff, compression="tiff_adobe_deflate")
        del floats
        scaled = {"whole image, float64 (before)": in_fresh_process(TIFF_SCALING, tiff, "whole"),
                  f"bands of {BAND_PIXELS:,} pixels (load_image)": in_fresh_process(TIFF_SCALING, tiff, "bands")}
    print_header(f"Dataset job memory: {args.count} photos of {width}×{height} ({width * height / 1e6:.1f} MP)")
    counted = next(iter(runs.values()))
    growth = {name: (run["peak_kib"] - run["before_kib"]) / 1024 for name, run in runs.items()}
    rows = [(name, run["outcome"], f"{growth[name]:,.0f}", f"{growth[name] / growth[next(iter(runs))]:.2f}")
            for name, run in runs.items()]
    print(report("dataset_memory", ("batches", "images", "peak RSS above the start, MiB", "÷ counted only"), rows,
                 key=("batches",)))
    print(f"\nDecoded pixels of one photo: {width * height * 3 / 2 ** 20:,.0f} MiB; "
          f"all {counted['outcome']}: {counted['outcome'] * width * height * 3 / 2 ** 20:,.0f} MiB.\n")
    growth = {name: (run["peak_kib"] - run["before_kib"]) / 1024 for name, run in scaled.items()}
    first = next(iter(growth.values()))
    print(markdown_table(("a float TIFF scaled to 8 bits", "peak RSS above the start, MiB", "÷ whole image"),
                         [(name, f"{value:,.0f}", f"{value / first:.2f}") for name, value in growth.items()]))


if __name__ == "__main__":
    main()
