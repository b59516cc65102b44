"""Running a method so that it cannot break its consumer: whatever a method does (raises, returns the wrong
shape, NaN or infinity, or runs past its `Method.time_limit`), the caller gets a `MethodFailure` with a
sentence, and every other map is computed as usual."""
from __future__ import annotations

import inspect
import threading

import numpy as np

from vit_inspect.methods.method import Method, MethodContext, MethodFailure
from vit_inspect.methods.registry import get

Outcome = np.ndarray | MethodFailure | None  # a (grid_h, grid_w) map, why there is none, or None: not in this pass


def check_options(method: Method, options: dict) -> None:
    """ValueError when `method.compute` takes none of `options` (a compute with ``**options`` takes any)."""
    parameters = list(inspect.signature(method.compute).parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    unknown = sorted(set(options) - {p.name for p in parameters})
    if unknown:
        raise ValueError(f"the {method.name} map takes no option {', '.join(unknown)}")


def compute_map(method: Method, context: MethodContext, **options) -> Outcome:
    """`method`'s map of the image in `context`: the array as the method returned it, checked to be a finite
    (grid_h, grid_w) array; None where the pass cannot have it (`Method.compute` said so); or a
    `MethodFailure`. The method runs on a worker thread: one past its time limit is given up (its thread
    is left to finish on its own, and its result is dropped)."""
    if method.reads == "own passes" and context.handle is None:
        return MethodFailure(method.name, f"{method.name} runs passes of its own and no model was given to it.")
    outcome: list = []

    def work() -> None:
        try:
            outcome.append(method.compute(context, **options))
        except Exception as exc:  # a method's own code may raise anything: it becomes a sentence
            outcome.append(MethodFailure(method.name, f"{method.name} raised {type(exc).__name__}.", str(exc)))

    worker = threading.Thread(target=work, name=f"method-{method.name}", daemon=True)
    worker.start()
    worker.join(method.time_limit)
    if not outcome:
        return MethodFailure(method.name, f"{method.name} took longer than its limit of {method.time_limit:g} s "
                                          "and was given up.")
    values = outcome[0]
    if values is None or isinstance(values, MethodFailure):
        return values
    layout = context.result.layout
    try:
        array = np.asarray(values)
        numbers = array.astype(np.float64)
    except (TypeError, ValueError):
        return MethodFailure(method.name, f"{method.name} returned {type(values).__name__}, not an array of numbers.")
    if array.shape != (layout.grid_h, layout.grid_w):
        return MethodFailure(method.name, f"{method.name} returned a map of shape {array.shape}; the patch grid is "
                                          f"({layout.grid_h}, {layout.grid_w}).")
    if not np.isfinite(numbers).all():
        return MethodFailure(method.name, f"{method.name} returned NaN or infinite values.")
    return array


def compute_maps(context: MethodContext, names: tuple[str, ...]) -> tuple[dict[str, np.ndarray], dict[str, MethodFailure]]:
    """(name -> (grid_h, grid_w) float64 map, name -> failure) for the registered methods `names` at their
    default options; a map the pass cannot have (None) is in neither. Each method runs once per pass: its
    outcome is kept in the pass's `ImageAnalysis.method_maps` when the context reads the pass's own input
    (``pixels`` None), and read from there again (a redraw, a second study of the same pass)."""
    maps: dict[str, np.ndarray] = {}
    failures: dict[str, MethodFailure] = {}
    kept = getattr(context.result, "method_maps", None) if context.pixels is None else None
    kept = {} if kept is None else kept
    for name in names:
        if name in kept:
            outcome = kept[name]
        else:
            method = get(name)
            outcome = compute_map(method, context)
            if context.pixels is None and not (method.reads == "own passes" and context.handle is None):
                kept[name] = outcome  # a failure for want of a model is not kept: the next caller may give one
        if isinstance(outcome, MethodFailure):
            failures[name] = outcome
        elif outcome is not None:
            maps[name] = np.array(outcome, dtype=np.float64)  # a copy: the kept map stays as computed
    return maps, failures
