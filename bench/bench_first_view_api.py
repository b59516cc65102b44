"""The app's first view on a machine without a browser: through the library calls its handler makes, and through
its API.

1. **library**: what `Inspector.analyze` does for a new image, without Gradio: the pass (`analyze_image` of the
   upload, `relevance=False`, the model's crop) with the app's spill folder (a server with its own GPU, or the
   CPU) and without one (a ZeroGPU Space), then the first view's three panels (`ui.panels.draw_panels(FIRST_VIEW)`,
   which read the result only). Per model (random weights), medians of ``--repeats`` after a warm-up, the pass
   and the drawing timed apart.
2. **api** (``--api``, when Gradio is importable): `python app.py --device DEVICE` serving DeiT-Ti/16 (its random
   weights written to a temporary file) driven by `gradio_client`. **page load → first view**: a new client
   (the page's config and API description) and the two events the page fires on load, `/startup` and
   `/analyze_first_image` (of the photo the page opens with), at once, until the first view's pictures are
   downloaded; **new image → first view**: `/analyze` of another example photo on the same client. No browser
   runs: the page's scripts and rendering are in neither time (`bench_first_view` times them in Chromium).

    python -m bench.bench_first_view_api [--models deit_ti_224 dinov2l_518] [--device cuda] [--repeats 5] [--api]
                                         [--json FILE]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .common import REPO, markdown_table, print_header, run_context

FIRST = REPO / "assets" / "chelsea.png"  # the photo the page opens with
PHOTOS = ("coffee.png", "astronaut.png", "rocket.jpg", "china.jpg", "flower.jpg")  # new images, in turn


@dataclass(frozen=True)
class FirstViewSession:
    """What `draw_panels` reads of the app's session for the first view: the result, its captions' words."""

    result: object
    model_label: str
    target: tuple = (None, None)

    def target_text(self, value) -> str:
        return "" if value is None else f"class {value}"

    def target_words(self) -> str:
        return self.target_text(self.result.target)


def library_first_view(handle, repeats: int, spill) -> dict:
    """Median seconds of the pass over a new upload and of drawing the first view's panels from it."""
    from vit_inspect.core.geometry import InputGeometry
    from vit_inspect.passes.pipeline import analyze_image
    from vit_inspect.ui.panels import FIRST_VIEW, draw_panels
    from vit_inspect.ui.view import READOUT, View

    cuda = handle.device.type == "cuda"
    last = handle.depth - 1
    controls = dict(layer=last, head=0, mean_heads=True, query=READOUT, row=0, col=0, head_fusion="mean",
                    discard_ratio=0.0, first_layer=0, last_layer=last, gradcam_layer=last)
    times: dict[str, list[float]] = {"pass": [], "draw": []}
    drawn = []
    for turn in range(repeats + 1):  # the first: a warm-up
        upload = str(REPO / "assets" / PHOTOS[turn % len(PHOTOS)])
        start = time.perf_counter()
        result = analyze_image(handle, upload, geometry=InputGeometry(), relevance=False, spill=spill)
        if cuda:
            torch.cuda.synchronize()
        middle = time.perf_counter()
        session = FirstViewSession(result, f"{handle.name} (random weights)", (result.target, None))
        drawn = draw_panels(FIRST_VIEW, session, View.from_controls(result, **controls))
        end = time.perf_counter()
        if turn:
            times["pass"].append(middle - start)
            times["draw"].append(end - middle)
    return {"pass_s": statistics.median(times["pass"]), "draw_s": statistics.median(times["draw"]),
            "panels": [None if p is None else list(p.shape) for p in drawn]}


def random_weights(name: str, folder: Path) -> Path:
    """A safetensors file of ``name``'s timm model with random weights, in ``folder``."""
    import timm
    from safetensors.torch import save_file

    path = folder / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in timm.create_model(name, pretrained=False).state_dict().items()}, path)
    return path


def api_first_view(device: str, repeats: int) -> dict:
    """Median seconds of page load → first view and new image → first view through the served app's API."""
    from gradio_client import Client, handle_file

    from .bench_first_view import serve

    times: dict[str, list[float]] = {"load": [], "image": []}
    with tempfile.TemporaryDirectory(prefix="vit_inspect_first_view_") as folder:
        start = time.perf_counter()
        weights = random_weights("deit_tiny_patch16_224", Path(folder))
        server, url = serve(REPO, device, weights, Path(folder) / "app.log")
        started = time.perf_counter() - start
        try:
            for turn in range(repeats + 1):  # the first: a warm-up (the model loaded, kernels ready)
                start = time.perf_counter()
                client = Client(url, verbose=False)
                status = client.submit(api_name="/startup")
                first = client.submit(handle_file(str(FIRST)), api_name="/analyze_first_image")
                status.result(timeout=120)
                first.result(timeout=120)
                loaded = time.perf_counter()
                client.predict(handle_file(str(REPO / "assets" / PHOTOS[turn % len(PHOTOS)])), api_name="/analyze")
                if turn:
                    times["load"].append(loaded - start)
                    times["image"].append(time.perf_counter() - loaded)
        finally:
            server.terminate()
            server.wait(30)
    return {"server_start_s": started, "load_s": statistics.median(times["load"]),
            "image_s": statistics.median(times["image"]), "load_all_s": times["load"], "image_all_s": times["image"]}


def main() -> None:
    from vit_inspect.passes.spill import DEFAULT_SPILL_BUDGET, SpillFolder

    from .bench_large import MODELS, _handle

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["deit_ti_224", "dinov2l_518"], choices=sorted(MODELS))
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--api", action="store_true", help="also through the served app's API (needs Gradio)")
    parser.add_argument("--json", type=Path, help="also write the raw results, with this run's context, here")
    args = parser.parse_args()
    torch.manual_seed(0)
    print_header("The app's first view without a browser")
    found: dict[str, object] = {"context": run_context(), "library": {}}
    rows = []

    def save() -> None:  # after every measurement: a run cut short keeps what it finished
        if args.json:
            args.json.write_text(json.dumps(found, indent=1))
    for key in args.models:
        handle = _handle(key, args.device)
        label = MODELS[key][3]
        for deployment, spill in (("spill folder", SpillFolder(DEFAULT_SPILL_BUDGET)), ("no spill (ZeroGPU)", None)):
            measured = library_first_view(handle, args.repeats, spill)
            found["library"][f"{label}, {deployment}"] = measured
            rows.append([f"{label}, {deployment}", "library calls", f"{measured['pass_s']:.3f} s pass + "
                         f"{measured['draw_s']:.3f} s drawing = {measured['pass_s'] + measured['draw_s']:.3f} s"])
            save()
        del handle
    if args.api:
        if importlib.util.find_spec("gradio") is None or importlib.util.find_spec("gradio_client") is None:
            found["api"] = {"error": "Gradio is not installed here"}
        else:
            try:
                api = found["api"] = api_first_view(args.device, args.repeats)
                rows.append([f"{MODELS['deit_ti_224'][3]} (app.py, spill folder)", "gradio_client",
                             f"page load → first view {api['load_s']:.3f} s, new image → first view "
                             f"{api['image_s']:.3f} s (server started in {api['server_start_s']:.1f} s)"])
            except Exception as exc:  # the library's figures are kept
                found["api"] = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
                print(found["api"]["error"])
        save()
    print(markdown_table(("model, deployment", "through", "new image → first view's three maps, median"), rows))


if __name__ == "__main__":
    main()
