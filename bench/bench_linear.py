"""A ViT's linear layers on the CPU: torch's own float32 path (`torch.addmm`, the BLAS PyTorch was built
with) against oneDNN's inner product (`core.linear.onednn_linears`, what the pass without gradients runs),
in one run.

Shapes are the linear layers of a forward: (tokens, in) @ (in, out) for qkv, proj, fc1 and fc2 of
DeiT-Ti/16 and ViT-B/16 at 224 (197 tokens an image; also batches of 32 and 8 images, as forwards without
gradients run them), ViT-L/16 at 384 (577) and DINOv2-L/14 + 4 registers at 518 (1,374). Random float32 values; both paths interleaved, medians; GFLOP/s counts 2·tokens·in·out. The last
column, per model, is its four layers' time through oneDNN ÷ through torch (weighted as a block runs them).
Every layer goes through oneDNN here; the pass sends only calls of at least `core.linear.ONEDNN_MIN_MACS`
multiply-adds, the bound these ratios set.

    python -m bench.bench_linear [--repeats 15] [--threads 2]
"""
from __future__ import annotations

import argparse

import torch
from torch import nn

from vit_inspect.core import linear
from vit_inspect.core.linear import onednn_linears

from .common import measure, print_header, report, set_threads

# label -> (tokens, embed dim, MLP dim)
MODELS = {
    "DeiT-Ti/16, 224": (197, 192, 768),
    "DeiT-Ti/16, 224, a batch of 32": (32 * 197, 192, 768),  # as the faithfulness metrics' batches run it
    "ViT-B/16, 224": (197, 768, 3072),
    "ViT-B/16, 224, a batch of 8": (8 * 197, 768, 3072),
    "ViT-L/16, 384": (577, 1024, 4096),
    "DINOv2-L/14 + 4 registers, 518": (1374, 1024, 4096),
}


def layers_of(dim: int, mlp: int) -> dict[str, tuple[int, int]]:
    """One block's linear layers: name -> (in, out)."""
    return {"qkv": (dim, 3 * dim), "proj": (dim, dim), "fc1": (dim, mlp), "fc2": (mlp, dim)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    if not linear.available():
        raise SystemExit("This PyTorch cannot route linear layers through oneDNN (not built with it, or turned off).")
    linear.ONEDNN_MIN_MACS = 0  # every layer through oneDNN here: these ratios are what set that bound
    print_header("Linear layers on the CPU: torch's float32 path against oneDNN")
    rows = []
    torch.manual_seed(0)
    for label, (tokens, dim, mlp) in MODELS.items():
        total = {"torch": 0.0, "onednn": 0.0}
        for name, (n_in, n_out) in layers_of(dim, mlp).items():
            layer = nn.Linear(n_in, n_out)
            x = torch.randn(1, tokens, n_in)

            def through_onednn(layer=layer, x=x):
                with onednn_linears(layer):
                    return layer(x)
            with torch.no_grad():
                timings = measure({"torch": lambda layer=layer, x=x: layer(x), "onednn": through_onednn},
                                  repeats=args.repeats)
            flop = 2 * tokens * n_in * n_out
            for path in total:
                total[path] += timings[path].median
            rows.append((label, name, f"{tokens} × {n_in} → {n_out}", timings["torch"].ms(), timings["onednn"].ms(),
                         f"{flop / timings['torch'].median / 1e9:.0f}", f"{flop / timings['onednn'].median / 1e9:.0f}",
                         f"{timings['onednn'].median / timings['torch'].median:.2f}", ""))
        rows[-1] = (*rows[-1][:-1], f"{total['onednn'] / total['torch']:.2f}")
    print(report("linear", ("model", "layer", "shape", "torch ms", "oneDNN ms", "torch GFLOP/s", "oneDNN GFLOP/s",
                            "oneDNN ÷ torch", "block: oneDNN ÷ torch"), rows, key=("model", "layer")))


if __name__ == "__main__":
    main()
