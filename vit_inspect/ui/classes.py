"""Choosing a class in the app: the picker's choices and what a typed name or index means. No gradio here."""
from __future__ import annotations

import numpy as np

from vit_inspect.analysis import class_name, search_classes
from vit_inspect.core.errors import InputError

CLASS_CHOICES = 30  # classes listed in the target picker: the top 5, then search results


def class_choices(labels: tuple[str, ...], probs: np.ndarray, indices: list[int]) -> list[tuple[str, str]]:
    """Dropdown choices "label (#index) · p" for these classes, after the top 5 (each listed once)."""
    top = [int(i) for i in np.argsort(-probs)[:5]] if probs.size else []
    shown = list(dict.fromkeys(top + list(indices)))[:CLASS_CHOICES]
    return [(f"{class_name(labels, i)} · {probs[i]:.1%}", str(i)) for i in shown]


def find_class(labels: tuple[str, ...], probs: np.ndarray, text: str | None, role: str) -> int | None:
    """The best class for what was typed (an index or a name); None for an empty box."""
    text = (text or "").strip()[:100]
    if not text:
        return None
    if not labels:
        raise InputError("This model has no classification head, so there is no class to explain.")
    found = search_classes(labels, text, probs, limit=1)
    if not found:
        raise InputError(f"No class matches {text!r} for the {role}; type a name (e.g. 'beagle') or an index "
                         f"from 0 to {len(labels) - 1}.")
    return found[0]
