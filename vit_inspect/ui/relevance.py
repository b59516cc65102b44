"""LeGrad and AttnLRP in the app, computed on demand. No gradio here; only app.py and the tabs import it.

The app's pass is ``analyze_image(relevance=False)``: one forward and one ordinary backward, the floor of
any gradient method. LeGrad (Bousselham et al. 2025) and AttnLRP (Achtibat et al. 2024) need LRP rules on
the forward and five more backwards (2.4-2.7x the pass without them, BENCHMARKS.md), so a session asks for them:
the All maps toggle adds them to the pass shown now (`passes.pipeline.add_relevance`: one more forward and those
backwards, equal to the maps of a one-pass ``relevance=True``) and, while ticked, the session's later
passes compute them in their own forward. The Faithfulness tab adds them before scoring.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from vit_inspect.methods import MethodContext, added, compute_maps

TOGGLE_LABEL = "Add AttnLRP and LeGrad (one more forward and backward pass)"
NAMES = {"legrad": "LeGrad", "attnlrp": "AttnLRP"}  # ImageAnalysis field -> the name figures use


def present(result) -> dict[str, np.ndarray]:
    """{"LeGrad": map, "AttnLRP": map} of the maps a result holds, (grid_h, grid_w) each."""
    return {name: getattr(result, field) for field, name in NAMES.items() if getattr(result, field) is not None}


def computed(session) -> bool:
    """Whether LeGrad and AttnLRP were computed for the pass the session shows: present, or computed and
    found unavailable for this model (its readout or attention is one they cannot follow)."""
    return bool(present(session.result)) or session.target in getattr(session, "relevance_for", ())


def toggle_label() -> str:
    """The All maps toggle's label: `TOGGLE_LABEL`, and the added methods it also computes (`dear_methods`)."""
    dear = dear_methods()
    own = "its own" if len(dear) == 1 else "their own"
    return TOGGLE_LABEL if not dear else f"{TOGGLE_LABEL}, and {', '.join(dear)} (passes of {own})"


def dear_methods() -> dict:
    """name -> `Method`, the added methods (plugins) that run passes of their own: computed with LeGrad and
    AttnLRP, on demand (the All maps toggle, or before scoring), never by the one pass."""
    return {name: m for name, m in added().items() if m.reads == "own passes"}


def with_relevance(session, handle, run: Callable, options, nbytes_of: Callable):
    """The session with LeGrad and AttnLRP, and the maps of `dear_methods`, added to the pass it shows, stored
    back in its slot (the byte-bounded store counts them); ``run`` is `passes.pipeline.add_relevance` or its
    ZeroGPU wrapper, ``options`` the app's `PassOptions` (the session's geometry replaces its own). The session
    itself when they were computed already or the model has no head (no class to explain). An evicted result
    raises `ResultDropped` (a sentence), as every other action does."""
    result = session.result
    if result.target is None:
        return session
    dear = tuple(name for name in dear_methods() if name not in result.method_maps)
    if computed(session) and not dear:
        return session
    if not computed(session):
        result = run(handle, result, session.source, options.replace(geometry=session.geometry))
    compute_maps(MethodContext(result, handle), dear)  # kept in result.method_maps, failures with them
    results = dict(session.results)
    results[session.target] = result
    session.slot.set(results, nbytes_of(results))
    return replace(session, relevance_for=session.relevance_for | {session.target})


def added_maps(session) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(name -> map, name -> sentence) of the added methods (`methods.added`) for the pass shown, at their
    defaults: a method that reads the pass is computed from it (once per pass); one with passes of its own
    is shown once `with_relevance` computed it, and until then its sentence says how to get it; a failed
    method's sentence says why it is missing. A map this pass cannot have (a gradient map of a model
    without a head) is in neither."""
    result = session.result
    cheap = tuple(name for name, m in added().items() if m.reads != "own passes")
    maps, failures = compute_maps(MethodContext(result), cheap)
    notes = {name: f"{name}: {failure.public}" for name, failure in failures.items()}
    for name, method in dear_methods().items():
        outcome = result.method_maps.get(name, "not computed")
        if isinstance(outcome, np.ndarray):
            maps[name] = outcome.astype(np.float64)
        elif isinstance(outcome, str) and result.target is not None:
            notes[name] = f"{name}: not computed ({method.cost()}); tick '{toggle_label()}' to add it"
        elif outcome is not None and not isinstance(outcome, str):
            notes[name] = f"{name}: {outcome.public}"
    return {name: maps[name] for name in added() if name in maps}, notes


def relevance_words(session) -> str:
    """What a figure says when it lacks LeGrad or AttnLRP, so that it never lacks them silently; "" when
    both are shown or the model has no head (then it has no gradient maps at all)."""
    if session.result.target is None:
        return ""
    if not computed(session):
        return f"AttnLRP and LeGrad: not computed; tick '{toggle_label()}' to add them"
    missing = [name for name in NAMES.values() if name not in present(session.result)]
    return f"{' and '.join(missing)}: not available for this model" if missing else ""
