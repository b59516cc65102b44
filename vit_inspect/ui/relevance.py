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

TOGGLE_LABEL = "Add AttnLRP and LeGrad (one more forward and backward pass)"
NAMES = {"legrad": "LeGrad", "attnlrp": "AttnLRP"}  # ImageAnalysis field -> the name figures use


def present(result) -> dict[str, np.ndarray]:
    """{"LeGrad": map, "AttnLRP": map} of the maps a result holds, (grid_h, grid_w) each."""
    return {name: getattr(result, field) for field, name in NAMES.items() if getattr(result, field) is not None}


def computed(session) -> bool:
    """Whether LeGrad and AttnLRP were computed for the pass the session shows: present, or computed and
    found unavailable for this model (its readout or attention is one they cannot follow)."""
    return bool(present(session.result)) or session.target in getattr(session, "relevance_for", ())


def with_relevance(session, handle, run: Callable, limits, nbytes_of: Callable):
    """The session with LeGrad and AttnLRP added to the pass it shows, stored back in its slot (the
    byte-bounded store counts them); ``run`` is `passes.pipeline.add_relevance` or its ZeroGPU wrapper. The
    session itself when they were computed already or the model has no head (no class to explain).
    An evicted result raises `ResultDropped` (a sentence), as every other action does."""
    result = session.result
    if result.target is None or computed(session):
        return session
    results = dict(session.results)
    results[session.target] = run(handle, result, session.source, limits=limits, geometry=session.geometry)
    session.slot.set(results, nbytes_of(results))
    return replace(session, relevance_for=session.relevance_for | {session.target})


def relevance_words(session) -> str:
    """What a figure says when it lacks LeGrad or AttnLRP, so that it never lacks them silently; "" when
    both are shown or the model has no head (then it has no gradient maps at all)."""
    if session.result.target is None:
        return ""
    if not computed(session):
        return f"AttnLRP and LeGrad: not computed; tick '{TOGGLE_LABEL}' to add them"
    missing = [name for name in NAMES.values() if name not in present(session.result)]
    return f"{' and '.join(missing)}: not available for this model" if missing else ""
