"""Where the app's pass spends its time above its baseline, by operator, measured in one process.

The baseline is the floor of a model with a head (a plain forward + an input-only backward, bench_analysis row
1a) or the plain forward of a model without one (DINOv2, bench_large). Each is run under `torch.profiler`
(CPU activity, and CUDA's on a GPU) ``--repeats`` times, alternating with the app's pass (`analyze_image`,
``relevance=False``, the app's spill folder on the CPU), and each operator's self time per call of the
whole is compared: the rows with the largest difference say which work the pass adds (materialised attention,
reductions, copies) and which it saves (the fused attention kernel, the input's convolution backward). On a GPU
each operator's kernel time (the kernels and copies it launched) is given beside its CPU time (launches, and
host-side work), and operators are ranked by the GPU's. Self times add up to the time spent in operators; what
the wall time holds beyond them is Python and waiting (device synchronisation on a GPU, other threads). Wall
times are medians of ``--repeats`` calls timed without the profiler, interleaved.

    python -m bench.bench_pass_ops [--models deit_ti_224 dinov2l_518] [--repeats 3] [--top 12] [--threads 2]
                                   [--device cuda]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from .bench_large import MODELS, _handle
from .common import REPO, THREADS, print_header, report, set_threads


def op_times(run, repeats: int, cuda: bool) -> dict[str, tuple[float, float]]:
    """Operator -> (self CPU time, self GPU time) in ms per call of ``run`` (the GPU's 0 on the CPU)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            run()
    # operators only: a kernel's or a copy's own event repeats the GPU time its operator already counts
    return {event.key: (event.self_cpu_time_total / 1e3 / repeats,
                        getattr(event, "self_device_time_total", 0.0) / 1e3 / repeats if cuda else 0.0)
            for event in prof.key_averages() if event.device_type == torch.autograd.DeviceType.CPU}


def bench_model(key: str, repeats: int, top: int, device: str) -> list[list[object]]:
    from vit_inspect.core.images import load_image
    from vit_inspect.passes.pipeline import analyze_image
    from vit_inspect.passes.spill import DEFAULT_SPILL_BUDGET, SpillFolder

    handle = _handle(key, device)
    cuda = handle.device.type == "cuda"
    picture = load_image(REPO / "assets" / "chelsea.png")
    pixels = handle.preprocess.apply(picture)[0].to(handle.device)
    spill = None if cuda else SpillFolder(DEFAULT_SPILL_BUDGET)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    if handle.has_head:
        with torch.no_grad():
            top_class = int(handle.model(pixels)[0].argmax())

        def baseline() -> None:  # the floor: forward + input-only backward
            x = pixels.clone().requires_grad_(True)
            torch.autograd.grad(handle.model(x)[0, top_class], x)
            sync()
        base_name = "floor (forward + input-only backward)"
    else:
        def baseline() -> None:
            with torch.no_grad():
                handle.model(pixels)
            sync()
        base_name = "plain forward"

    def app_pass() -> None:
        analyze_image(handle, picture, relevance=False, spill=spill)
        sync()

    baseline(), app_pass()  # warm-up
    walls: dict[str, list[float]] = {"base": [], "pass": []}
    for _ in range(repeats):
        for name, run in (("base", baseline), ("pass", app_pass)):
            start = time.perf_counter()
            run()
            walls[name].append(time.perf_counter() - start)
    base, ours = op_times(baseline, repeats, cuda), op_times(app_pass, repeats, cuda)
    wall_base, wall_pass = (statistics.median(walls[k]) * 1e3 for k in ("base", "pass"))
    label = MODELS[key][3]
    side = 1 if cuda else 0  # rank by the GPU's time on a GPU, by the CPU's elsewhere

    def cost(times: dict, op: str) -> float:
        return times.get(op, (0.0, 0.0))[side]

    def total(times: dict, index: int) -> float:
        return sum(t[index] for t in times.values())

    print(f"### {label} ({handle.device.type})\n")
    print(f"{base_name}: {wall_base:.1f} ms; the app's pass: {wall_pass:.1f} ms (÷ {wall_pass / wall_base:.2f}). "
          f"Per call, medians of {repeats}.\n")
    ranked = sorted(set(base) | set(ours), key=lambda op: cost(ours, op) - cost(base, op))
    shown = ranked[::-1][:top] + [op for op in ranked[:max(1, top // 3)] if cost(ours, op) < cost(base, op)]
    rows = [[label, "(wall)", f"{wall_base:.1f}", f"{wall_pass:.1f}", f"{wall_pass - wall_base:+.1f}", "–", "–"],
            [label, "(all operators)", f"{total(base, 0):.1f}", f"{total(ours, 0):.1f}",
             f"{total(ours, 0) - total(base, 0):+.1f}",
             *((f"{total(base, 1):.1f}", f"{total(ours, 1):.1f}") if cuda else ("–", "–"))]]
    for op in dict.fromkeys(shown):
        (cpu_base, gpu_base), (cpu_pass, gpu_pass) = base.get(op, (0.0, 0.0)), ours.get(op, (0.0, 0.0))
        rows.append([label, op, f"{cpu_base:.2f}", f"{cpu_pass:.2f}", f"{cpu_pass - cpu_base:+.2f}",
                     *((f"{gpu_base:.2f}", f"{gpu_pass:.2f}") if cuda else ("–", "–"))])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["deit_ti_224", "dinov2l_518"], choices=list(MODELS))
    parser.add_argument("--repeats", type=int, default=3, help="profiled and timed calls of each (after 1 warm-up)")
    parser.add_argument("--top", type=int, default=12, help="operators shown, the largest differences first")
    parser.add_argument("--threads", type=int, default=THREADS, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    set_threads(args.threads)
    torch.manual_seed(0)
    print_header("Where the pass's time above its baseline goes, by operator")
    rows = []
    for key in args.models:
        rows += bench_model(key, args.repeats, args.top, args.device)
    name = "pass_ops" if args.device == "cpu" else "pass_ops_cuda"
    print(report(name, ("model", "operator", "baseline CPU ms", "pass CPU ms", "pass - baseline CPU ms",
                        "baseline GPU ms", "pass GPU ms"), rows,
                 key=("model",)))  # a new run replaces every row of its model


if __name__ == "__main__":
    main()
