"""The settings of one pass (`pipeline.analyze_image`), as one frozen object with one set of defaults.

The app (`ui.inspector.Inspector`), the CLI commands, the notebook's `analyze`, the studies and the jobs build
their pass from `PassOptions()` and change only what their user chose (a geometry, an input size, half
precision, whether LeGrad and AttnLRP run); what is explained (the target and contrast classes or prompts)
stays an argument of the pass.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from vit_inspect.core.geometry import InputGeometry
from vit_inspect.core.images import ImageLimits
from vit_inspect.passes import spill as spill_module
from vit_inspect.passes.spill import SpillFolder

AUTOMATIC = "automatic"  # `PassOptions.spill`: the process's own spill folder (`spill.shared_folder`)


@dataclass(frozen=True)
class PassOptions:
    """How one pass runs: what the model sees, which backward passes run, and where large maps go."""

    input_size: tuple[int, int] | None = None  # (height, width) pixels of the model's input; None: its own size
    gradients: bool = True  # one backward pass (Grad-CAM, Chefer, LeGrad, AttnLRP...); False: the forward only
    autocast: bool = False  # the pass in half precision (`pipeline.autocast_dtype`), maps within a stated tolerance
    limits: ImageLimits = ImageLimits()  # what an image file may be (pixels, bytes) before it is decoded
    geometry: InputGeometry | None = None  # crop, squash or keep (`core.geometry`); None: the model's centre crop
    relevance: bool = True  # LeGrad and AttnLRP in the pass (their backwards, about 3x the pass without them)
    score: str | None = None  # a CLIP-style model's explained score: None (cosine similarity) or "logit"
    # where the head-fused maps of a model whose maps are dear to rebuild are written (`spill.worth_spilling`):
    # AUTOMATIC, the process's own temporary folder (`spill.shared_folder`, DEFAULT_SPILL_BUDGET bytes, its files
    # removed when their result is garbage-collected and the folder at exit); a `SpillFolder`; None: nowhere
    spill: SpillFolder | str | None = AUTOMATIC

    def __post_init__(self) -> None:
        if isinstance(self.spill, str) and self.spill != AUTOMATIC:
            raise ValueError(f"PassOptions.spill is a SpillFolder, {AUTOMATIC!r} or None, not {self.spill!r}")

    def replace(self, **changes) -> PassOptions:
        """These options with ``changes`` (field names; an unknown name is a TypeError)."""
        return dataclasses.replace(self, **changes) if changes else self

    def spill_folder(self) -> SpillFolder | None:
        """The folder a pass that spills writes to: `spill`, with AUTOMATIC resolved to `spill.shared_folder`."""
        return spill_module.shared_folder() if self.spill == AUTOMATIC else self.spill


# The pass of a study (ablation, comparison, faithfulness): the defaults, spilling nothing, as its maps are
# read where they are made and not redrawn from the spill (and a ZeroGPU worker's spill would go unread).
STUDY_OPTIONS = PassOptions(spill=None)
