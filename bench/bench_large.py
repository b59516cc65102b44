"""Large ViTs at high resolution: what one analysed image keeps, the pass's peak memory and time, and the
slowest first redraw, per model and design, measured in one run.

For each model and input, and each design, in a fresh subprocess (so that peak memory is its own):

- kept bytes: what one analysed image holds (`ImageAnalysis.nbytes()`; today's: its arrays);
- peak RSS of the process (ru_maxrss: model + one analysis), or peak GPU memory on CUDA;
- analysis ÷ plain forward + backward (weight gradients too, what training does) and ÷ plain forward +
  input-only backward (the floor: no weight gradients), for models with a head; on CUDA each call is also
  timed with CUDA events (`event_s`: from the call's start on the GPU's stream to its last kernel), the
  floor so timed being the issue's floor; analysis ÷ plain forward
  for models without one (no backward is run then); for those on the CPU, this checkout's designs also time
  the plain forward with its linear layers through oneDNN (`core.linear`), as the pass runs them;
- slowest redraw ÷ plain forward: raw attention from the class token, the mean of patch rows and a
  patch, every head of a layer, the prefix-token shares, rollout with default and non-default options
  (every head fusion, both discard rules, a layer range), gradient rollout (vit-explain), and for this
  checkout's designs also one head from the mean of patch rows and the heads view (every head of the last
  layer, each head's prefix share, the DINO masks holding 60 % of the attention), each timed on its first
  (uncached) call.

"today" is the first release's pass plus a stack of vit-explain's gradient-weighted attention (depth, N, N)
float16, kept here (`analyze_today`) as the design to beat; "main" is another checkout's own `analyze_image` (every method of that
version, maps kept as stacks), imported from ``--main-tree`` (e.g. `git archive main vit_inspect | tar
-x -C /tmp/main_tree`), "main_app" that version's pass as the app runs it; "compact" is this checkout's, "app" this
checkout's pass as the app runs it (`relevance=False`:
no AttnLRP or LeGrad, which the app adds on request; on the CPU with the app's default spill folder, so a model
with heads * N >= 0.015 D^2 (`spill.worth_spilling`) also writes its maps to disk, shown beside the kept bytes;
on CUDA without one, as on a ZeroGPU Space, whose workers keep no spill). "app_spill" is the app's pass with its
spill folder on any device: what a server with its own CUDA GPU runs (the app keeps a spill folder there).

Models have random weights (`timm.create_model(name, pretrained=False)`). Timed candidates are
interleaved (see bench.common.measure), so ratios hold on a shared machine.

    python -m bench.bench_large [--models deit_ti_224 vitb_224 ...] [--repeats 3] [--threads 2]
                                [--device cuda] [--half] [--main-tree /tmp/main_tree --designs today main compact]
                                [--no-redraws] [--json FILE]
    python -m bench.bench_large --from-json FILE ...   # the table and CSV of raw results made elsewhere
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .common import CONTEXT, REPO, measure, print_header, report, run_context, set_threads

# key -> (timm name, create_model kwargs, input (H, W), label)
MODELS = {
    "deit_ti_224": ("deit_tiny_patch16_224", {}, (224, 224), "DeiT-Ti/16, 224"),
    "vitb_224": ("vit_base_patch16_224", {}, (224, 224), "ViT-B/16, 224"),
    "vitb_384": ("vit_base_patch16_384", {}, (384, 384), "ViT-B/16, 384"),
    "vitl_384": ("vit_large_patch16_384", {}, (384, 384), "ViT-L/16, 384"),
    "dinov2s_518": ("vit_small_patch14_reg4_dinov2", {}, (518, 518), "DINOv2-S/14 + 4 registers, 518 (no head)"),
    "dinov2l_518": ("vit_large_patch14_reg4_dinov2", {}, (518, 518), "DINOv2-L/14 + 4 registers, 518 (no head)"),
}
DEFAULT_MODELS = ("deit_ti_224", "vitb_224", "vitb_384", "dinov2s_518", "dinov2l_518")
DESIGNS = ("today", "main", "main_app", "compact", "app", "app_spill")
MB = 1e6


# ------------------------------------------------------------------------------ today's design, kept for comparison

def analyze_today(handle, picture: Image.Image, autocast: bool = False) -> dict:
    """The first release's `analyze_image`: every map recorded and stacked, kept in float16; mean
    distance, Chefer relevance and Grad-CAM from the full stacks. Returns its arrays."""
    from vit_inspect.analysis import (chefer_relevance, gradcam_from_tokens, gradient_fused_attention,
                                      mean_attention_distance)
    from vit_inspect.passes.capture import capture_attention
    from vit_inspect.passes.pipeline import autocast_dtype, readout_query

    pixels, rgb = handle.preprocess.apply(picture)
    layout = handle.layout(rgb.shape[:2])
    use_grad = handle.has_head
    pixels = pixels.to(handle.device).requires_grad_(use_grad)
    layers = range(handle.depth) if use_grad else ()
    with (torch.set_grad_enabled(use_grad), capture_attention(handle, activation_layers=layers) as rec,
          torch.autocast(handle.device.type, dtype=autocast_dtype(handle.device), enabled=autocast)):
        logits = handle.forward(pixels)
    attention = rec.attention[0].float().cpu().numpy()
    probs = logits.detach()[0].float().softmax(-1).cpu().numpy() if handle.has_head else np.zeros(0, np.float32)
    out = {"rgb": rgb, "probs": probs, "attention": attention.astype(np.float16),
           "mean_distance": mean_attention_distance(attention, layout)}
    if use_grad:
        chosen = int(np.argmax(probs))
        rec.backward(logits[0, chosen].float())
        grad = rec.attention_grad()[0].float().cpu().numpy()
        out["chefer"] = chefer_relevance(attention, grad, layout, query=readout_query(handle)).astype(np.float32)
        out["grad_attention"] = gradient_fused_attention(attention, grad).astype(np.float16)  # (depth, N, N)
        out["gradcam"] = np.stack([gradcam_from_tokens(rec.activation(i)[0].float().cpu().numpy(),
                                                       rec.activation_grad(i)[0].float().cpu().numpy(), layout)
                                   for i in layers]).astype(np.float32)
    return out


# ------------------------------------------------------------------------------------------------ the worker

def _handle(key: str, device: str):
    import timm

    from vit_inspect.core.timm_models import handle_from_timm

    name, kwargs, size, _ = MODELS[key]
    model = timm.create_model(name, pretrained=False, **kwargs)
    return handle_from_timm(model, name=name, device=device, input_size=size)


def _redraws(handle, design: str, result, layout) -> dict:
    """name -> a callable drawing one map from the cached result (first call timed: nothing cached)."""
    from vit_inspect.analysis import attention_map, gradient_rollout, prefix_shares, rollout
    from vit_inspect.passes.pipeline import readout_query

    last = handle.depth - 1
    patch = (layout.grid_h // 2, layout.grid_w // 2)
    query = readout_query(handle)
    if design == "today":
        dense = result["attention"]  # (depth, heads, N, N) float16

        def att(q):
            return lambda: attention_map(dense[last:last + 1].astype(np.float32), layout, 0, None, q)

        def roll(**options):
            return lambda: rollout(dense, layout, **({"query": query} | options))

        def heads():
            return lambda: [attention_map(dense[last:last + 1].astype(np.float32), layout, 0, h, patch)
                            for h in range(handle.num_heads)]

        def shares():
            return lambda: prefix_shares(dense[last].astype(np.float32).mean(axis=0), layout, query)

        def grad_roll():
            return lambda: gradient_rollout(result["grad_attention"], layout, 0.9, query=query)
    else:
        def att(q):
            return lambda: result.attention_map(last, None, q)

        def roll(**options):
            return lambda: result.rollout(**options)

        def heads():
            return lambda: result.head_maps(last, patch)

        def shares():
            return lambda: result.prefix_share(last)

        def grad_roll():
            return lambda: result.gradient_rollout(0.9)
    draws = {"attention, readout query": att(query), "attention, mean of patch rows": att("mean"),
             "attention, clicked patch": att(patch), "all heads, clicked patch": heads(),
             "prefix shares": shares(), "rollout, defaults": roll(),
             "rollout, max, discard 0.9": roll(head_fusion="max", discard_ratio=0.9),
             "rollout, discard 0.9 of the matrix": roll(discard_ratio=0.9, discard="matrix"),
             "rollout, second half, patch query": roll(start_layer=handle.depth // 2, query=patch)}
    if design != "today":  # the rest of what the app's views draw from a result
        def head_mean_query():
            return lambda: result.attention_map(last, 0, "mean")

        def heads_with_shares():  # the heads view: every head's map and its prefix share, DINO masks at 60 %
            def draw():
                from vit_inspect.analysis import mass_mask
                maps = result.head_maps(last)
                return maps, [result.prefix_share(last, h) for h in range(handle.num_heads)], mass_mask(maps, 0.6)
            return draw

        draws |= {"attention, one head, mean of patch rows": head_mean_query(),
                  "all heads of the last layer, shares and DINO masks": heads_with_shares(),
                  "rollout, min, residual off": roll(head_fusion="min", residual=False),
                  "rollout, max, discard 0.9 of the matrix": roll(head_fusion="max", discard_ratio=0.9,
                                                                  discard="matrix"),
                  "rollout, layers 6 to 11, discard 0.5": roll(start_layer=6, end_layer=12, discard_ratio=0.5)}
    return draws | ({"gradient rollout, discard 0.9": grad_roll()} if handle.has_head else {})


def cuda_event_timer(candidates: dict, warmup: int) -> tuple[dict, dict[str, list[float]]]:
    """``candidates`` wrapped so that each call is also timed with CUDA events (seconds from its start on the
    current stream to its last kernel's end), and the per-name lists those times go to, warm-up calls dropped."""
    seconds: dict[str, list[float]] = {name: [] for name in candidates}
    calls = dict.fromkeys(candidates, 0)

    def timed(name, run):
        def call():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = run()
            end.record()
            torch.cuda.synchronize()  # the wall-clock timing waits for the GPU too
            calls[name] += 1
            if calls[name] > warmup:
                seconds[name].append(start.elapsed_time(end) / 1e3)
            return out
        return call
    return {name: timed(name, run) for name, run in candidates.items()}, seconds


def worker(key: str, design: str, repeats: int, device: str, half: bool, image: Path, threads: int,
           redraws: bool = True) -> dict:
    from vit_inspect.core.images import load_image
    from vit_inspect.passes.pipeline import analyze_image
    from vit_inspect.passes.spill import DEFAULT_SPILL_BUDGET, SpillFolder

    set_threads(threads)
    torch.manual_seed(0)
    handle = _handle(key, device)
    picture = load_image(image)
    pixels = handle.preprocess.apply(picture)[0].to(handle.device)
    model = handle.model
    cuda = handle.device.type == "cuda"
    dtype = torch.float16 if cuda else torch.bfloat16

    # each candidate only queues its work on a GPU; `cuda_event_timer` waits for it (and times it with events)
    def plain_forward():
        with torch.no_grad(), torch.autocast(handle.device.type, dtype=dtype, enabled=half):
            return model(pixels)

    top = int(plain_forward()[0].argmax()) if handle.has_head else None

    def forward_backward():  # plain training step's gradients: weights and input
        x = pixels.clone().requires_grad_(True)
        with torch.autocast(handle.device.type, dtype=dtype, enabled=half):
            logit = model(x)[0, top].float()
        logit.backward()
        model.zero_grad(set_to_none=True)

    def floor():  # forward + input-only backward: the least any gradient method must do
        x = pixels.clone().requires_grad_(True)
        with torch.autocast(handle.device.type, dtype=dtype, enabled=half):
            logit = model(x)[0, top].float()
        torch.autograd.grad(logit, x)

    held = {}
    # the app's default: a spill folder on the CPU and on a CUDA server ("app_spill"), none on ZeroGPU ("app" on CUDA)
    spill = (SpillFolder(DEFAULT_SPILL_BUDGET) if design == "app_spill" or (design in ("app", "main_app") and not cuda)
             else None)

    def analysis():
        held.pop("result", None)
        if design == "today":
            held["result"] = analyze_today(handle, picture, autocast=half)
        elif design in ("app", "main_app", "app_spill"):  # the app's pass: no AttnLRP/LeGrad (added on request, `add_relevance`), the
            # app's spill folder (many-token models write their maps to disk; not in the kept bytes, as in the app)
            held["result"] = analyze_image(handle, picture, autocast=half, relevance=False, spill=spill)
        else:
            held["result"] = analyze_image(handle, picture, autocast=half)

    rss_model = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    candidates = ({"forward": plain_forward} | ({"forward_backward": forward_backward, "floor": floor} if handle.has_head
                                                else {}) | {"analysis": analysis})
    try:  # this checkout's pass runs a model without a head with its linear layers through oneDNN on the CPU
        from vit_inspect.core.linear import available, onednn_linears
    except ImportError:  # another checkout, before that
        available = None
    if not cuda and not half and not handle.has_head and available is not None and available():
        def forward_onednn():
            with onednn_linears(model):
                return plain_forward()
        candidates = {"forward": plain_forward, "forward_onednn": forward_onednn, "analysis": analysis}
    warmup = 1 if repeats > 1 else 0
    events: dict[str, list[float]] = {}
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        candidates, events = cuda_event_timer(candidates, warmup)
    timings = measure(candidates, repeats=repeats, warmup=warmup)
    result = held["result"]
    kept = (sum(a.nbytes for a in result.values() if a is not None) if design == "today" else result.nbytes())
    layout = handle.layout(handle.input_size)
    redraw_s = {}
    for name, draw in (_redraws(handle, design, result, layout) if redraws else {}).items():
        start = time.perf_counter()
        draw()
        redraw_s[name] = time.perf_counter() - start
    forward = timings["forward"].median
    denominator = timings["floor"].median if handle.has_head else forward
    out = {
        "model": MODELS[key][3], "design": design, "tokens": layout.num_tokens,
        "kept_MB": kept / MB, "rss_model_MB": rss_model / MB,
        "peak_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB,
        "forward_s": forward, "floor_s": timings["floor"].median if handle.has_head else None,
        "forward_onednn_s": timings["forward_onednn"].median if "forward_onednn" in timings else None,
        "analysis_s": timings["analysis"].median, "analysis_ratio": timings["analysis"].median / denominator,
        "analysis_fwdbwd_ratio": (timings["analysis"].median / timings["forward_backward"].median
                                  if handle.has_head else None),
        "slowest_redraw": max(redraw_s, key=redraw_s.get) if redraw_s else None,
        "slowest_redraw_s": max(redraw_s.values()) if redraw_s else None,
        "redraw_ratio": max(redraw_s.values()) / forward if redraw_s else None, "redraws_s": redraw_s,
        "event_s": {name: float(np.median(values)) for name, values in events.items() if values},
        "store_mode": getattr(getattr(result, "attention_store", None), "mode", None),
        "spilled_MB": (result.attention_store.spill.nbytes / MB
                       if design != "today" and getattr(result.attention_store, "spill", None) is not None else 0.0),
        "package": str(Path(sys.modules["vit_inspect"].__file__).parent),
    }
    if cuda:
        out["peak_gpu_MB"] = torch.cuda.max_memory_allocated() / MB
        for name in ("floor", "analysis") if handle.has_head else ("forward", "analysis"):  # each one's own peak
            torch.cuda.reset_peak_memory_stats()
            candidates[name]()
            out[f"peak_gpu_{name}_MB"] = torch.cuda.max_memory_allocated() / MB
    return out


# ------------------------------------------------------------------------------------------------ the driver

HEADERS = ("model, input", "design", "tokens N", "kept per image", "peak RSS (or GPU) of the process",
           "RSS after loading the model", "analysis ÷ plain", "slowest redraw ÷ plain forward", "plain forward")


def table_row(r: dict) -> list:
    """One row of the table from a worker's raw result."""
    peak = f"{r['peak_gpu_MB']:.0f} MB GPU" if "peak_gpu_MB" in r else f"{r['peak_rss_MB'] / 1e3:.2f} GB"
    if "peak_gpu_analysis_MB" in r:  # the pass's own peak beside its baseline's (the floor, or a forward)
        base = r.get("peak_gpu_floor_MB", r.get("peak_gpu_forward_MB"))
        peak = f"{r['peak_gpu_analysis_MB']:.0f} MB GPU (baseline {base:.0f} MB)"
    versus = (f"{r['analysis_fwdbwd_ratio']:.2f} ÷ fwd+bwd, {r['analysis_ratio']:.2f} ÷ fwd+input bwd"
              if r["floor_s"] is not None else f"{r['analysis_ratio']:.2f} ÷ fwd (no head)")
    spilled = f" (+ {r['spilled_MB']:.0f} MB of maps on disk)" if r.get("spilled_MB") else ""
    return [r["model"], r["design"] + (f" ({r['store_mode']})" if r["store_mode"] else ""), r["tokens"],
            f"{r['kept_MB']:.1f} MB{spilled}", peak, f"{r['rss_model_MB'] / 1e3:.2f} GB",
            f"{versus} ({r['analysis_s']:.2f} s)",
            (f"{r['redraw_ratio']:.3f} ({r['slowest_redraw']}; {r['slowest_redraw_s']:.2f} s)"
             if r["redraw_ratio"] is not None else "not timed"),
            f"{r['forward_s']:.3f} s" + (f" ({r['forward_onednn_s']:.3f} s with oneDNN linear layers)"
                                         if r.get("forward_onednn_s") else "")]


def results_name(device: str, half: bool) -> str:
    return f"large_{device.split(':')[0]}{'_half' if half else ''}"


def from_json(paths: list[Path]) -> None:
    """Render the table of raw results written by ``--json`` (on a GPU node, say) and write its CSV, with the
    run's own threads, date, command and machine, as the JSON records them."""
    for path in paths:
        raw = json.loads(path.read_text())
        missing = [k for k in CONTEXT if k not in raw.get("context", {})]
        if missing:
            raise SystemExit(f"{path} does not record its {', '.join(missing)}")
        cuda = any("peak_gpu_MB" in r for r in raw["runs"])
        name = results_name("cuda" if cuda else "cpu", " --half" in raw["context"]["command"])
        print(report(name, HEADERS, [table_row(r) for r in raw["runs"]], key=("model, input", "design"),
                     context=raw["context"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=sorted(MODELS))
    parser.add_argument("--designs", nargs="+", default=["today", "compact"], choices=DESIGNS)
    parser.add_argument("--main-tree", type=Path, help="a folder holding another version's vit_inspect package "
                        "(design 'main')")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (large models: 1 is enough)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--half", action="store_true", help="autocast half precision (float16 on CUDA, bfloat16 on CPU)")
    parser.add_argument("--image", type=Path, default=REPO / "assets" / "chelsea.png")
    parser.add_argument("--no-redraws", action="store_true", help="time no redraws (a half pass keeps the same "
                        "float16 store as a float32 one on a GPU, so its redraws cost the same)")
    parser.add_argument("--json", type=Path, help="also write the raw results, with this run's context, here")
    parser.add_argument("--from-json", type=Path, nargs="+", metavar="FILE",
                        help="measure nothing: render the table and CSV of raw results written by --json")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "DESIGN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args.repeats, args.device, args.half, args.image, args.threads,
                                not args.no_redraws)))
        return
    if args.from_json:
        from_json(args.from_json)
        return
    set_threads(args.threads)
    if args.device.startswith("cuda"):
        torch.cuda.init()  # the results' machine line names the GPU the workers ran on
    print_header(f"Large ViTs: the pass's memory and time per model and design ({args.device}"
                 f"{', autocast half' if args.half else ''})")
    rows, raw = [], []
    for key in args.models:
        for design in args.designs:  # one subprocess at a time: peak memory is each one's own
            flags = ["--worker", key, design, "--repeats", str(args.repeats), "--threads", str(args.threads),
                     "--device", args.device, "--image", str(args.image)] + (["--half"] if args.half else []) + (
                ["--no-redraws"] if args.no_redraws else [])
            if design in ("main", "main_app"):  # that version's vit_inspect first on the path, this bench module
                if args.main_tree is None:
                    parser.error("design 'main' needs --main-tree")
                command = [sys.executable, "-c", "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
                           "runpy.run_module('bench.bench_large', run_name='__main__')", str(args.main_tree.resolve()),
                           *flags]
            else:
                command = [sys.executable, "-m", "bench.bench_large", *flags]
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{key} {design}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            raw.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"raw: {json.dumps(raw[-1])}", file=sys.stderr, flush=True)  # kept in a log if the run is cut
            rows.append(table_row(raw[-1]))
            print(f"done: {key} {design}", file=sys.stderr, flush=True)
    context = run_context()
    print(report(results_name(args.device, args.half), HEADERS, rows, key=("model, input", "design"), context=context))
    if args.json:
        args.json.write_text(json.dumps({"context": context, "runs": raw}, indent=1))


if __name__ == "__main__":
    main()
