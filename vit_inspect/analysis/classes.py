"""Finding a class by index or by name among a model's labels."""
from __future__ import annotations

import numpy as np


def search_classes(labels: tuple[str, ...] | list[str], query: str, probs: np.ndarray | None = None,
                   limit: int = 20) -> list[int]:
    """Class indices matching ``query``, best first, at most ``limit``.

    An empty query gives the classes in order of probability (the top-k), or of index without
    ``probs``. Otherwise, in this order of rank:

    0. the class whose index is the query ("1" → class 1), if the query is a whole number in range;
    1. classes with a synonym equal to the query ("beagle"; labels are comma-separated synonyms, as in
       ImageNet's "tabby, tabby cat"), case-insensitive;
    2. classes with a synonym or word that starts with the query;
    3. classes whose label contains the query anywhere.

    Within a rank, more probable classes come first (``probs``, the model's softmax for the image), then
    lower indices. A digit inside a label ("#281") never matches an index query: indices are matched
    only as whole numbers (rank 0), and digits are matched as text only in ranks 1-3.
    """
    if limit < 1:
        return []
    num_classes = len(labels)
    text = query.strip().lower().lstrip("#")
    order_of = (lambda i: (-float(probs[i]), i)) if probs is not None and len(probs) == num_classes else (lambda i: (0.0, i))
    if not text:
        return sorted(range(num_classes), key=order_of)[:limit]
    ranks: dict[int, int] = {}
    if text.isdigit() and int(text) < num_classes:
        ranks[int(text)] = 0
    for index, label in enumerate(labels):
        if index in ranks:
            continue
        lowered = label.lower()
        synonyms = [s.strip() for s in lowered.split(",")]
        if text in synonyms:
            ranks[index] = 1
        elif any(s.startswith(text) for s in synonyms) or any(w.startswith(text) for w in lowered.replace(",", " ").split()):
            ranks[index] = 2
        elif text in lowered:
            ranks[index] = 3
    return sorted(ranks, key=lambda i: (ranks[i], *order_of(i)))[:limit]


def class_name(labels: tuple[str, ...] | list[str], index: int) -> str:
    """"label (#index)", e.g. "goldfish, Carassius auratus (#1)"; the index alone when there are no labels."""
    if 0 <= index < len(labels) and labels[index] != str(index):
        return f"{labels[index]} (#{index})"
    return f"class #{index}"
