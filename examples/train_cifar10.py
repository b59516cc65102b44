"""Train the toy ViT (examples/toy_vit.py) on CIFAR-10 on the CPU and save its weights as safetensors.

With internet and torchvision installed it trains on torchvision's CIFAR-10 training set (50,000 images)
and evaluates on the test set. Offline it falls back to a zip of the CIFAR-10 *test* split (10,000 32x32
JPEGs and a ``labels.csv`` with ``filename,class_index``; ``--zip`` or ``$CIFAR10_ZIP``): it trains on 8,000
of those images (800 per class) and evaluates on the other 2,000 (200 per class), which is far less data
than a real training run. Two epochs take about 3 minutes on 2 CPU cores.

    OMP_NUM_THREADS=1 python examples/train_cifar10.py --epochs 2 --zip cifar10_test_jpeg.zip
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from toy_vit import CIFAR10_MEAN, CIFAR10_STD, build  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ZIP = os.environ.get("CIFAR10_ZIP")  # the offline data: a zip of the CIFAR-10 test split
DEFAULT_OUT = REPO / "checkpoints" / "toy_vit_cifar10.safetensors"
TRAIN_PER_CLASS = 800  # of the 1,000 test images per class in the zip; the other 200 are held out


def read_zip_split(path: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"train", "heldout"} -> (images (n, 32, 32, 3) uint8, labels (n,) int64) from the CIFAR-10 test zip.

    Deterministic and stratified: in each class, files sorted by name, the first 800 train, the last 200
    are held out (8,000 / 2,000 in all).
    """
    with zipfile.ZipFile(path) as archive:
        labels_name = next(n for n in archive.namelist() if n.endswith("labels.csv"))
        root = labels_name[: -len("labels.csv")]
        rows = list(csv.DictReader(io.StringIO(archive.read(labels_name).decode())))
        by_class: dict[int, list[str]] = {}
        for row in rows:
            by_class.setdefault(int(row["class_index"]), []).append(row["filename"])
        split: dict[str, tuple[list, list]] = {"train": ([], []), "heldout": ([], [])}
        for label, names in sorted(by_class.items()):
            for rank, name in enumerate(sorted(names)):
                images, targets = split["train" if rank < TRAIN_PER_CLASS else "heldout"]
                with Image.open(io.BytesIO(archive.read(root + name))) as picture:
                    images.append(np.asarray(picture.convert("RGB"), dtype=np.uint8))
                targets.append(label)
    return {k: (np.stack(images), np.asarray(targets, dtype=np.int64)) for k, (images, targets) in split.items()}


def read_torchvision(root: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """torchvision's CIFAR-10 train (50,000) and test (10,000) sets; downloads them (needs internet)."""
    from torchvision.datasets import CIFAR10

    return {key: (ds.data, np.asarray(ds.targets, dtype=np.int64))
            for key, ds in (("train", CIFAR10(root, train=True, download=True)),
                            ("heldout", CIFAR10(root, train=False, download=True)))}


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """(n, 32, 32, 3) uint8 -> (n, 3, 32, 32) float32 normalised with the CIFAR-10 mean and std."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255.0)
    return (x - torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)) / torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)


def augment(batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crop with 4 pixels of zero padding and random horizontal flip (the usual CIFAR recipe)."""
    n, _, height, width = batch.shape
    padded = nn.functional.pad(batch, (4, 4, 4, 4))
    dy, dx = torch.randint(0, 9, (2, n), generator=generator)
    out = torch.stack([padded[i, :, dy[i]:dy[i] + height, dx[i]:dx[i] + width] for i in range(n)])
    flip = torch.rand(n, generator=generator) < 0.5
    out[flip] = out[flip].flip(-1)
    return out


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 250) -> float:
    model.eval()
    correct = sum(int((model(images[i:i + batch_size]).argmax(-1) == labels[i:i + batch_size]).sum())
                  for i in range(0, len(images), batch_size))
    return correct / len(images)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("auto", "torchvision", "zip"), default="auto",
                        help="auto: torchvision's training set when it can be downloaded, else the offline zip")
    parser.add_argument("--zip", default=DEFAULT_ZIP,
                        help="the CIFAR-10 test-split zip, the offline data (default: $CIFAR10_ZIP)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--max-minutes", type=float, default=20.0,
                        help="stop after the epoch that passes this wall-clock budget (weights are saved every epoch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)

    data = None
    if args.data in ("auto", "torchvision"):
        try:
            data = read_torchvision(REPO / "checkpoints" / "cifar10")
            source = "torchvision CIFAR-10: train on the 50,000 training images, evaluate on the 10,000 test images"
        except Exception as exc:  # torchvision missing, or no network
            if args.data == "torchvision":
                raise SystemExit(f"torchvision's CIFAR-10 is not available: {type(exc).__name__}: {exc}")
            print(f"torchvision CIFAR-10 unavailable ({type(exc).__name__}); using the offline zip.", file=sys.stderr)
    if data is None:
        if not args.zip:
            raise SystemExit("Offline, pass --zip PATH (or set CIFAR10_ZIP) to a zip of the CIFAR-10 test split.")
        data = read_zip_split(args.zip)
        source = ("OFFLINE: only the CIFAR-10 *test* split is available; training on 8,000 of its images "
                  "(800 per class) and evaluating on the other 2,000 (200 per class)")
    print(source, file=sys.stderr)

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    model, _spec = build()
    train_x, train_y = to_tensor(data["train"][0]), torch.from_numpy(data["train"][1])
    eval_x, eval_y = to_tensor(data["heldout"][0]), torch.from_numpy(data["heldout"][1])
    steps_per_epoch = math.ceil(len(train_x) / args.batch_size)
    total_steps = steps_per_epoch * args.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    warmup = steps_per_epoch // 2
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, warmup)) * 0.5 * (
        1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    loss_fn = nn.CrossEntropyLoss()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    history = []
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(train_x), generator=generator)
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch}/{args.epochs}", file=sys.stderr, mininterval=5)
        running = 0.0
        for step in bar:
            index = order[step * args.batch_size:(step + 1) * args.batch_size]
            loss = loss_fn(model(augment(train_x[index], generator)), train_y[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            running = 0.98 * running + 0.02 * loss.item() if step else loss.item()
            bar.set_postfix(loss=f"{running:.3f}")
        heldout = accuracy(model, eval_x, eval_y)
        minutes = (time.monotonic() - start) / 60
        history.append({"epoch": epoch, "train_loss": round(running, 4), "heldout_accuracy": round(heldout, 4),
                        "minutes": round(minutes, 2)})
        print(json.dumps(history[-1]), file=sys.stderr)
        save(model, out, {"data": source, "epochs_done": epoch, "epochs_planned": args.epochs, "history": history})
        if minutes > args.max_minutes and epoch < args.epochs:
            print(f"stopping after epoch {epoch}: {minutes:.1f} min passed the {args.max_minutes:g}-minute budget",
                  file=sys.stderr)
            break
    print(f"saved {out} (held-out accuracy {history[-1]['heldout_accuracy']:.1%} after {history[-1]['epoch']} "
          f"epoch(s))", file=sys.stderr)
    return 0


def save(model: nn.Module, path: Path, record: dict) -> None:
    """Weights as safetensors, with the training record as JSON in the file's metadata."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"training": json.dumps(record)})


if __name__ == "__main__":
    sys.exit(main())
