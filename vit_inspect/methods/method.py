"""`Method`: one map, described as data (what it is, what it reads, what it costs, how it is drawn) beside the
function that computes it; `MethodContext`: what that function may read; `MethodFailure`: why a map is missing."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from vit_inspect.core.handle import ViTHandle
from vit_inspect.passes.result import ImageAnalysis

READS = {  # what a method reads from the one pass -> what the pass must have recorded for it
    "attention": "the attention the pass captures (every model)",
    "gradients": "the pass's backward from the explained score (a model with a classification head)",
    "relevance": "the pass's LeGrad and AttnLRP records (analyze(..., relevance=True), a timm or Hugging Face model)",
    "own passes": "nothing from the pass: it runs the model itself (see `forwards` and `backwards`)",
}


@dataclass(frozen=True)
class MethodContext:
    """What a method's `compute` may read: the cached pass, and for a method with passes of its own the model
    and the exact input the pass saw. A method must not change the model (its weights, hooks or modes)."""

    result: ImageAnalysis  # the one pass over the image: plain arrays (see `ImageAnalysis`)
    handle: ViTHandle | None = None  # the model; None where only the pass is at hand (a method that needs it fails)
    pixels: torch.Tensor | None = None  # (1, 3, H, W) normalised model input; None: rebuilt from `result.rgb`

    @property
    def target(self) -> int | None:
        """The class (column of the head) the pass explained; None for a model without a head."""
        return self.result.target

    def model_input(self) -> torch.Tensor:
        """(1, 3, H, W) float32 normalised input of the pass: `pixels`, or the crop the pass saw normalised
        with the model's mean and std (the same float32 values the pass's own input had)."""
        if self.pixels is not None:
            return self.pixels
        if self.handle is None:
            raise ValueError("the model input needs the model's normalisation: no model was given")
        return self.handle.preprocess.normalize(self.result.rgb)


@dataclass(frozen=True)
class Method:
    """One map of one image over the patch grid, and everything a consumer needs to know about it.

    ``compute(context, **options)`` returns a raw (grid_h, grid_w) float array (no clamping or normalising:
    signs are kept, display choices are below), or None where this pass cannot have the map (say, a gradient
    map of a model without a head). Keyword options, with defaults, are the map's settings (`Analysis.map`
    passes them); consumers that score maps call it without options.
    """

    name: str  # the key every consumer uses: lower case, digits and "_" only
    title: str  # one line saying what the map is, with its default settings
    unit: str  # the colour bar's unit; "{score}" stands for what gradients explain ("logit" or "cosine")
    paper: str  # the citation, down to the equation or section
    reads: str  # a key of `READS`: what the one pass must have recorded for it
    compute: Callable[..., np.ndarray | None]  # (MethodContext, **options) -> (grid_h, grid_w) raw map, or None
    forwards: int = 0  # forward passes of its own per map (reads == "own passes"), beyond the one pass
    backwards: int = 0  # backward passes of its own per map
    signed: bool = False  # the map has meaningful negative values (drawn on a diverging scale)
    relu: bool = False  # drawn after a ReLU (only the positive part shown)
    cmap: str = "inferno"  # matplotlib colour map for display
    faithfulness: bool = True  # scored by the faithfulness study (and `evaluate`)
    sanity: bool = True  # checked by the sanity study (and `sanity`)
    record: bool = True  # its default map is a key of the `analyze` JSON record
    time_limit: float = 60.0  # seconds one map may take before it is given up with a `MethodFailure`

    def __post_init__(self) -> None:
        if not self.name or not all(c.islower() or c.isdigit() or c == "_" for c in self.name):
            raise ValueError(f"a method's name is lower case letters, digits and '_', got {self.name!r}")
        if self.reads not in READS:
            raise ValueError(f"method {self.name!r} reads {self.reads!r}; choose one of {', '.join(READS)}")
        if (self.reads == "own passes") != (self.forwards + self.backwards > 0):
            raise ValueError(f"method {self.name!r}: a method states its own forward and backward passes "
                             "exactly when it reads 'own passes'")
        if self.time_limit <= 0:
            raise ValueError(f"method {self.name!r}: the time limit must be positive, got {self.time_limit}")

    def cost(self) -> str:
        """The cost in passes, as `vit-inspect methods` states it."""
        if self.reads != "own passes":
            return f"none of its own: reads {self.reads} from the one pass"
        return f"{self.forwards} forward + {self.backwards} backward of its own per map"


@dataclass(frozen=True)
class MethodFailure:
    """Why a method gave no map for an image: a sentence a user can read, naming no server path."""

    name: str  # the method
    public: str  # the sentence
    detail: str = ""  # for the operator and the command line: the exception's own message, which may name paths

    def __str__(self) -> str:
        return self.public
