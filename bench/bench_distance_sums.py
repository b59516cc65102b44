"""The mean attention distance's per-query sums (`passes.layer_stream.LayerStream._distance_sums_of`) three
ways, in one run: sum_j a_hij d_ij and sum_j a_hij over patch keys j, for every head h and patch query i.

- elementwise: ``(a * d).sum(-1)`` and ``a.sum(-1)`` (a temporary of the maps' size, then two reads);
- einsum: ``einsum("hij,ij->hi", a, d)`` and ``a.sum(-1)`` (torch copies the maps into its batch order);
- batched product: per query i, ``[d_i; 1] (2, P) @ a_:i:ᵀ (P, heads)``, one `torch.bmm` over every query
  reading the maps in place (BLAS takes them transposed): both sums from one read.

Shapes are a whole layer's patch-to-patch maps (as a pass with gradients or on a GPU reduces them) or one block
of query rows (as the CPU pass without gradients does, `passes.capture.ROW_BLOCK_BYTES`). Random float32
softmax rows; the three interleaved, medians. The pass takes the batched product from
`layer_stream.BATCHED_DISTANCE_ENTRIES` entries up, the bound these ratios set.

    python -m bench.bench_distance_sums [--repeats 30] [--threads 2]
"""
from __future__ import annotations

import argparse

import torch

from vit_inspect.passes.capture import rows_per_block

from .common import measure, print_header, report, set_threads

PREFIX = 5  # tokens before the patches (a class token and four registers: the largest prefix of these models)


def shapes() -> dict[str, tuple[int, int, int]]:
    """label -> (heads, query rows, patch keys P)."""
    return {
        "DeiT-Ti/16, 224, a layer": (3, 196, 196),
        "ViT-B/16, 224, a layer": (12, 196, 196),
        "DeiT-Ti/16, 448, a layer": (3, 784, 784),
        "ViT-L/16, 384, a layer": (16, 576, 576),
        "DINOv2-S/14, 518, a block of rows": (6, rows_per_block(6, 1369 + PREFIX), 1369),
        "DINOv2-L/14, 518, a block of rows": (16, rows_per_block(16, 1369 + PREFIX), 1369),
        "DINOv2-L/14, 518, a layer": (16, 1369, 1369),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    print_header("The mean attention distance's per-query sums: elementwise, einsum, one batched product")
    rows = []
    torch.manual_seed(0)
    for label, (heads, queries, keys) in shapes().items():
        maps = torch.softmax(4 * torch.randn(heads, queries, PREFIX + keys), dim=-1)[..., PREFIX:]  # a view
        distances = 100 * torch.rand(queries, keys)
        weights = torch.stack([distances, torch.ones_like(distances)], dim=1)  # (queries, 2, P)

        def elementwise():
            return (maps * distances).sum(-1), maps.sum(-1)

        def einsum():
            return torch.einsum("hij,ij->hi", maps, distances), maps.sum(-1)

        def batched():
            both = torch.bmm(weights, maps.permute(1, 2, 0))
            return both[:, 0].T, both[:, 1].T
        reference = [t.double() for t in elementwise()]
        for run in (einsum, batched):  # the same sums, float32 rounding apart
            for ours, theirs in zip(run(), reference):
                torch.testing.assert_close(ours.double(), theirs, rtol=1e-5, atol=1e-6)
        timings = measure({"elementwise": elementwise, "einsum": einsum, "batched": batched}, repeats=args.repeats)
        ms = {name: f"{1e3 * t.median:.3f}" for name, t in timings.items()}
        rows.append((label, f"{heads} × {queries} × {keys}", f"{heads * queries * keys / 2 ** 20:.2f}",
                     ms["elementwise"], ms["einsum"], ms["batched"],
                     f"{timings['batched'].median / timings['elementwise'].median:.2f}",
                     f"{timings['batched'].median / timings['einsum'].median:.2f}"))
    print(report("distance_sums", ("maps", "heads × queries × keys", "entries (Mi)", "elementwise ms (median)",
                                   "einsum ms", "batched ms", "batched ÷ elementwise", "batched ÷ einsum"), rows, key=("maps",)))


if __name__ == "__main__":
    main()
