"""What every benchmark shares: fixed threads, interleaved timing with warm-up, the plain baseline
model, machine facts, markdown tables and the CSV files under bench/results/.

Timings are wall-clock medians. Candidates are timed round-robin (A, B, C, A, B, C, ...) so that a
change of load on a shared machine hits every candidate alike and the ratios stay meaningful even
when the absolute times do not.
"""
from __future__ import annotations

import csv
import datetime
import os
import platform
import re
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from vit_inspect.core.handle import ViTHandle

THREADS = 2  # torch intra-op threads in every benchmark, set explicitly so that runs compare
REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"  # the data folder beside the checkout: ImageNet samples and weights
MODELS = ("deit_tiny_patch16_224", "vit_base_patch16_224")
# one CSV per table; BENCHMARKS.md quotes them (BENCH_RESULTS names another folder: a run whose tables are not kept)
RESULTS = Path(os.environ.get("BENCH_RESULTS") or Path(__file__).resolve().parent / "results")
CONTEXT = ("threads", "date", "command", "machine")  # columns every results row ends with


def real_weights(model: str) -> Path:
    """The real weights of timm ``model``: checkpoints/ of this checkout, else the data folder beside it."""
    local = REPO / "checkpoints" / f"{model}.safetensors"
    return local if local.is_file() else SHARED / "models" / f"{model}.safetensors"


def other_module(package, *paths: str):
    """A module of another version's package by the first of ``paths`` (dotted, below the package) it has: a
    version from before the layered subpackages kept, say, `pipeline` where this one has `passes.pipeline`."""
    import importlib

    for path in paths:
        try:
            return importlib.import_module(f"{package.__name__}.{path}")
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError(f"{package.__name__} has none of {', '.join(paths)}")


def set_threads(threads: int = THREADS) -> None:
    """Fix torch's intra-op thread count (and the inter-op one, which must be set before any work)."""
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # already set, or parallel work already ran in this process
        pass


@dataclass(frozen=True)
class Timing:
    """Wall-clock times of the timed repeats of one candidate (warm-up runs excluded)."""

    seconds: tuple[float, ...]  # one per repeat

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def ms(self) -> str:
        """"median ms (min–max)"."""
        low, high = min(self.seconds), max(self.seconds)
        return f"{1e3 * self.median:.1f} ({1e3 * low:.1f}–{1e3 * high:.1f})"

    def s(self) -> str:
        """"median s (min–max)"."""
        low, high = min(self.seconds), max(self.seconds)
        return f"{self.median:.3f} ({low:.3f}–{high:.3f})"


def measure(candidates: Mapping[str, Callable[[], object]], repeats: int, warmup: int = 1,
            idle_s: float = 0.0) -> dict[str, Timing]:
    """Time each candidate `repeats` times after `warmup` untimed calls, interleaved round-robin.

    ``idle_s`` > 0: every timed call starts after that long idle (untimed), as the app's pass starts after
    an upload rather than right after other torch work. torch's OpenMP workers (libgomp) spin for a while
    after each parallel region, 4-8 ms on this 2-core machine, so back to back (0, the default) the first
    milliseconds of single-threaded work in a candidate share the cores with a spinning worker."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        for run in candidates.values():
            run()
    seconds: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, run in candidates.items():
            if idle_s > 0:
                time.sleep(idle_s)
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    return {name: Timing(tuple(values)) for name, values in seconds.items()}


def plain_model(handle: ViTHandle) -> torch.nn.Module:
    """The untouched model as the baseline: no hooks, timm's default (fused) attention.

    Raises if a capture left a flag or hook behind, so the baseline is never silently slowed.
    """
    model = handle.model
    if handle.family == "timm" and not all(a.fused_attn for a in handle.attention_modules):
        raise RuntimeError("the baseline model does not use fused attention; a capture left its flags behind")
    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
        raise RuntimeError("the baseline model has forward hooks; a capture left them behind")
    return model


def plain_forward(model: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """One plain inference forward pass: (B, 3, H, W) -> (B, num_classes) logits."""
    with torch.no_grad():
        return model(pixels)


def plain_forward_backward(model: torch.nn.Module, pixels: torch.Tensor, target: int) -> None:
    """One plain forward + backward as in any training or saliency script: `model(x)[0, target].backward()`
    (parameter gradients included; they are dropped first so that every call does the same work)."""
    model.zero_grad(set_to_none=True)
    model(pixels)[0, target].backward()


def plain_forward_input_backward(model: torch.nn.Module, pixels: torch.Tensor, target: int) -> None:
    """One plain forward + a backward to the input only, `autograd.grad(model(x)[0, target], x)`: the least
    work any gradient method needs (no weight gradients are computed)."""
    x = pixels.detach().clone().requires_grad_(True)
    torch.autograd.grad(model(x)[0, target], x)


def figure_image(fig):
    """A matplotlib Figure rendered to (H, W, 3) uint8 (`canvas.figure_to_rgb`), its drawing released: the
    "before" of each picture the app now draws with PIL."""
    from vit_inspect.plots import canvas

    try:
        return canvas.figure_to_rgb(fig)
    finally:
        fig.clear()


def machine_rows() -> list[tuple[str, str]]:
    """(fact, value) rows: CPU, cores, threads, versions, load at the time of the call."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import numpy
    import timm

    try:
        from threadpoolctl import threadpool_info

        blas = ", ".join(f"{p['internal_api']} {p['version']} ({p['num_threads']} threads)" for p in threadpool_info()
                         if p.get("user_api") == "blas") or "n/a"
    except ImportError:
        blas = "n/a (threadpoolctl not installed)"
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return [
        ("CPU", cpu),
        ("logical cores", str(os.cpu_count())),
        ("torch threads", f"{torch.get_num_threads()} (set explicitly with torch.set_num_threads)"),
        ("torch", torch.__version__),
        ("timm", timm.__version__),
        ("numpy", numpy.__version__),
        ("BLAS libraries loaded (threadpoolctl)", blas),
        ("python", platform.python_version()),
        ("load average (1/5/15 min)", load),
    ]


def command() -> str:
    """The command line this process was started with, as one would retype it."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    program = f"-m {spec.name}" if spec is not None and spec.name else shlex.quote(sys.argv[0])
    return " ".join(["python", program, *map(shlex.quote, sys.argv[1:])])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; cells are printed with str()."""
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_line() -> str:
    """One line for a results row: CPU model, logical cores, the GPU when one was used, torch's version and
    the load average over the last minute (other work on the machine shows there)."""
    facts = dict(machine_rows())
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() and torch.cuda.is_initialized() else ""
    load = facts["load average (1/5/15 min)"].split(" / ")[0]
    return f"{facts['CPU']}, {facts['logical cores']} logical cores{gpu}, torch {facts['torch']}, load {load}"


def plain_cell(cell: object) -> str:
    """A markdown table cell as plain text: no bold, no code marks."""
    return re.sub(r"\*\*|`", "", str(cell))


def run_context() -> dict[str, str]:
    """This run's `CONTEXT`: torch threads, today's date, the command and the machine."""
    return {"threads": str(torch.get_num_threads()), "date": datetime.date.today().isoformat(),
            "command": command(), "machine": machine_line()}


def report(name: str, headers: Sequence[str], rows: Sequence[Sequence[object]], key: Sequence[str],
           context: Mapping[str, str] | None = None) -> str:
    """The markdown table of ``rows``; the same rows are written to ``bench/results/<name>.csv``.

    Every CSV row ends with the torch threads, the date, the command and the machine (`CONTEXT`; this run's,
    or ``context`` when the rows were measured elsewhere and kept as raw results). Rows of earlier runs whose
    ``key`` columns (plus the thread count) match no new row are kept, so the file holds the latest result
    for every model, option and thread count measured; git keeps the history."""
    columns = [*headers, *CONTEXT]
    context = [(context or run_context())[k] for k in CONTEXT]
    fresh = [[plain_cell(cell) for cell in row] + context for row in rows]
    path = RESULTS / f"{name}.csv"
    kept = []
    if path.is_file():
        with path.open(newline="") as file:
            old = list(csv.reader(file))
        if old and old[0] == columns:
            at = [columns.index(k) for k in (*key, "threads")]
            seen = {tuple(row[i] for i in at) for row in fresh}
            kept = [row for row in old[1:] if tuple(row[i] for i in at) not in seen]
    RESULTS.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(columns)
        writer.writerows(kept + fresh)
    return markdown_table(headers, rows)


def per_model_report(title: str, labels: Mapping[str, str], measure: Callable[[str], dict],
                     rows_of: Callable[[str, dict], list], headers: Sequence[str], json_path: Path | None) -> dict:
    """Print the header, measure each model (``measure(key)``, ``labels``: key -> its label), print one markdown table
    of ``rows_of(label, found)``, write the raw results with this run's context to ``json_path`` (if given)."""
    import json

    print_header(title)
    found, rows = {}, []
    for key, label in labels.items():
        found[label] = measure(key)
        rows += rows_of(label, found[label])
    print(markdown_table(headers, rows))
    if json_path is not None:
        json_path.write_text(json.dumps({"context": run_context(), "models": found}, indent=1))
    return found


def print_header(title: str) -> None:
    """The title, the exact command and the machine, as markdown."""
    print(f"## {title}\n")
    print(f"Command: `{command()}`\n")
    print(markdown_table(("machine", ""), machine_rows()))
    print()


def verdict(value: float, target: float, at_most: bool) -> str:
    """"yes"/"NO" for a ratio against its target (at most / at least)."""
    held = value <= target if at_most else value >= target
    return "yes" if held else "NO"
