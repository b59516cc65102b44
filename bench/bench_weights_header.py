"""Reading a hostile `.safetensors` upload: the header bound against the unbounded read, in one run.

A weights file of many one-number tensors is small on disk but costs a worker seconds: safetensors
makes a tensor per entry and the finite check visits each. `read_state_dict` now sizes the file from
its header first (`check_safetensors_header`: at most `MAX_SAFETENSORS_HEADER` bytes and `MAX_TENSORS`
tensors). The reference is the read without it (`safetensors.torch.load_file` plus `check_finite`,
what `read_state_dict` did before). Files: 250,000 one-number tensors (17 MiB, inside the app's
30 MiB upload bound), 10,000 (at the tensor bound), and DeiT-Ti's real weights when present.

    python -m bench.bench_weights_header [--repeats 3]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vit_inspect.core.errors import WeightsError
from vit_inspect.core.weights import check_finite, read_state_dict

from .common import REPO, measure, print_header, report

DEIT = REPO.parent / "shared" / "models" / "deit_tiny_patch16_224.safetensors"


def unbounded(path: Path) -> int:
    """The read before the header bound: every tensor made and checked."""
    state = load_file(str(path), device="cpu")
    check_finite(state.items(), path.name)
    return len(state)


def bounded(path: Path) -> str:
    """`read_state_dict` as it is: tensors read, or the refusal's sentence."""
    try:
        return f"read, {len(read_state_dict(path)):,} tensors"
    except WeightsError as exc:
        return "refused: " + ("header too long" if "header" in str(exc) else "too many tensors" if "lists" in str(exc)
                              else "invalid")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print_header("Reading a .safetensors weights file: header bound vs unbounded read")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for count in (250_000, 10_000):
            path = Path(tmp) / f"{count}_tensors.safetensors"
            save_file({f"t{i}": torch.zeros(1) for i in range(count)}, str(path))
            files.append(path)
        if DEIT.is_file():
            files.append(DEIT)
        for path in files:
            timings = measure({"unbounded": lambda: unbounded(path), "bounded": lambda: bounded(path)},
                              repeats=args.repeats)
            before, after = timings["unbounded"].median, timings["bounded"].median
            rows.append((path.name, f"{path.stat().st_size / 2 ** 20:,.1f}", bounded(path),
                         f"{before * 1e3:,.1f}", f"{after * 1e3:,.1f}", f"{after / before:.5f}"))
    print(report("weights_header", ("file", "MiB", "read_state_dict", "unbounded read, ms", "bounded, ms",
                          "bounded ÷ unbounded"), rows, key=("file",)))


if __name__ == "__main__":
    main()
