"""First (uncached) rollout redraw from the attention store: another version's `attention_store.rollout`
against this checkout's, on the same stored queries and keys, each ÷ one plain forward of the model.

The other version's package is loaded from ``--before-tree`` under another name, e.g.

    git archive REV vit_inspect | tar -x -C /tmp/before_tree   # REV: the version to compare with

Both versions get the same (depth, heads, N, d) float16 Q/K arrays and must draw the same maps (to
float64 rounding; checked before timing). Candidates are interleaved (bench.common.measure), so the
ratios hold on a shared machine. Models have random weights (`timm.create_model(name, pretrained=False)`).

    python -m bench.bench_rollout_redraw --before-tree /tmp/before_tree [--models deit_ti_224 dinov2s_518]
                                         [--repeats 11] [--threads 1]
"""
from __future__ import annotations

import argparse
import atexit
import importlib.util
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from .bench_large import MODELS, _handle
from .common import REPO, markdown_table, measure, print_header, set_threads


# an import statement of the package itself: "from vit_inspect.x import y", "import vit_inspect.x as z"
_OWN_IMPORT = re.compile(r"^(\s*)(from|import)(\s+)vit_inspect(?=[\s.])", re.MULTILINE)


def load_package(tree: Path, alias: str = "vit_inspect_before"):
    """The ``vit_inspect`` package found in ``tree``, imported as ``alias`` beside this checkout's.

    Its modules import one another as ``vit_inspect.…``, which would be this checkout's modules: only the
    module asked for would be the other version's. So a copy of the package is loaded whose own import
    statements name ``alias`` instead (a temporary folder, removed at exit); nothing else in it changes."""
    copy = Path(tempfile.mkdtemp(prefix="vit_inspect_tree_")) / alias
    atexit.register(shutil.rmtree, copy.parent, True)
    shutil.copytree(tree / "vit_inspect", copy, ignore=shutil.ignore_patterns("__pycache__"))
    for path in copy.rglob("*.py"):
        path.write_text(_OWN_IMPORT.sub(rf"\1\2\3{alias}", path.read_text(encoding="utf-8")), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(alias, copy / "__init__.py", submodule_search_locations=[str(copy)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[alias] = package
    spec.loader.exec_module(package)
    return package


def parse_model_args(doc: str, models: list[str], repeats: int, before_tree: bool = True):
    """(arguments, the other version's package or None) of a bench over MODELS keys, with torch's threads set:
    ``--models``, ``--repeats``, ``--threads``, ``--image`` and, with ``before_tree``, ``--before-tree``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    if before_tree:
        parser.add_argument("--before-tree", type=Path, required=True,
                            help="a folder holding the other version's vit_inspect")
    parser.add_argument("--models", nargs="+", default=models, choices=sorted(MODELS))
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--image", type=Path, default=REPO / "assets" / "chelsea.png")
    args = parser.parse_args()
    set_threads(args.threads)
    return args, load_package(args.before_tree.resolve()) if before_tree else None


def options(handle, layout) -> dict[str, dict]:
    """The rollout options the app offers that cost the most, by name."""
    patch = (layout.grid_h // 2, layout.grid_w // 2)
    return {"defaults": {}, "max, discard 0.9": dict(head_fusion="max", discard_ratio=0.9),
            "discard 0.9 of the matrix": dict(discard_ratio=0.9, discard="matrix"),
            "second half, patch query": dict(start_layer=handle.depth // 2, query=patch),
            "mean of patch rows, discard 0.5": dict(query="mean", discard_ratio=0.5)}


def run(key: str, before, repeats: int, image: Path) -> list[list[object]]:
    from vit_inspect.core.images import load_image
    from vit_inspect.passes.attention_store import rollout
    from vit_inspect.passes.pipeline import analyze_image

    torch.manual_seed(0)
    handle = _handle(key, "cpu")
    picture = load_image(image)
    result = analyze_image(handle, picture, relevance=False, gradients=False)
    store, layout = result.attention_store, result.layout
    if store.mode == "maps":
        raise RuntimeError(f"{key}: the store fell back to maps; nothing to compare")
    before_store = before.attention_store.AttentionStore(store.mode, store.queries, store.keys, store.scale, None,
                                                         store.max_error)
    pixels = handle.preprocess.apply(picture)[0]

    def forward():
        with torch.no_grad():
            handle.model(pixels)

    candidates = {"forward": forward}
    for name, option in options(handle, layout).items():
        old, new = before.attention_store.rollout(before_store, layout, **option), rollout(store, layout, **option)
        np.testing.assert_allclose(new, old, rtol=1e-12, atol=0, err_msg=f"{key}, {name}: the maps differ")
        candidates[(name, "before")] = lambda o=option: before.attention_store.rollout(before_store, layout, **o)
        candidates[(name, "after")] = lambda o=option: rollout(store, layout, **o)
    timings = measure(candidates, repeats)  # every rollout call is a first call: nothing is cached here
    forward_s = timings["forward"].median
    rows = []
    for name in options(handle, layout):
        old, new = timings[(name, "before")], timings[(name, "after")]
        rows.append([f"{MODELS[key][3]} (N = {layout.num_tokens})", name, old.ms(), new.ms(),
                     f"{old.median / forward_s:.3f}", f"{new.median / forward_s:.3f}", f"{old.median / new.median:.2f}x"])
    rows.append([MODELS[key][3], "plain forward", timings["forward"].ms(), "", "", "", ""])
    return rows


def main() -> None:
    args, before = parse_model_args(__doc__, ["deit_ti_224"], 11)
    print_header(f"First rollout redraw from the attention store, before and after ({args.threads} thread(s), "
                 f"{args.repeats} interleaved repeats, medians; shared machine)")
    rows = [row for key in args.models for row in run(key, before, args.repeats, args.image)]
    print(markdown_table(("model", "rollout option", "before ms", "after ms", "before ÷ forward", "after ÷ forward",
                          "speed-up"), rows))


if __name__ == "__main__":
    main()
