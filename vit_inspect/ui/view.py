"""What the controls ask to see (`View`), in library terms, and the choices the controls offer.

Every value comes from a client and is untrusted: `View.from_controls` clamps numbers beyond the model,
refuses NaN and wrong types with a sentence (`InputError`), and maps the
radio labels to library names (an unknown label is the default). A backward rollout range (From after To) is
swapped, and the View says so (`swapped`): the Rollout tab shows the swap on its sliders, the Faithfulness tab
scores the same swapped range, and every caption names the layers drawn."""
from __future__ import annotations

from dataclasses import dataclass

from vit_inspect.core.errors import InputError
from vit_inspect.passes.result import ImageAnalysis
from vit_inspect.ui.untrusted import finite_float, finite_int, flag

HEAD_FUSIONS = ("mean", "max", "min")
READOUT, PATCH = "class / readout token", "clicked patch"  # choices of the attention query
SCALES = {"each map its own range": "own", "shared across layers and heads": "shared", "absolute (0 to 1)": "absolute"}
ROLLOUTS = {"attention rollout (Abnar & Zuidema)": "attention", "gradient rollout for the class (vit-explain)": "gradient"}
SWAPPED = " (From and To swapped)"  # a backward rollout range, as every caption and score names it
DISCARDS = {"lowest in each row (ours)": "row", "lowest in the whole matrix (vit-explain)": "matrix"}


@dataclass(frozen=True)
class View:
    """What the controls ask to see, in library terms, fitted to one result's geometry."""

    layer: int
    head: int | None  # None: mean of heads
    patch: tuple[int, int] | None  # query patch (row, col); None: the readout token
    head_fusion: str  # rollout: how heads are fused
    discard_ratio: float  # rollout: fraction of the lowest attention dropped
    first_layer: int  # rollout: first and last layer, both included
    last_layer: int
    gradcam_layer: int
    scale: str = "own"  # colour range: "own" (each map), "shared" (across layers/heads), "absolute" (0 to 1)
    rollout_method: str = "attention"  # "attention" (Abnar & Zuidema) or "gradient" (vit-explain, class-specific)
    discard: str = "row"  # "row" (ours) or "matrix" (vit-explain's whole-matrix discard)
    threshold: float | None = None  # heads grid: keep the patches holding this fraction of the mass; None: off
    swapped: bool = False  # rollout: From and To were given backwards and are swapped

    @classmethod
    def from_controls(cls, result: ImageAnalysis, *, layer, head, mean_heads, query, row, col, head_fusion,
                      discard_ratio, first_layer, last_layer, gradcam_layer, scale=None, rollout_method=None,
                      discard=None, threshold_on=False, threshold=60) -> View:
        """Raw client values -> a View. Values beyond this model (±inf included) are clamped, an empty
        box is 0; NaN and wrong types are refused with a sentence (`InputError`); a backward rollout range
        is swapped, and `swapped` records it (the Rollout tab shows it on its sliders)."""
        layout = result.layout
        top = result.depth - 1

        def clamp(value, what: str, hi: int) -> int:
            return finite_int(value, what, 0, hi, default=0)

        def choice(value, options: dict, default: str) -> str:
            return options[value] if isinstance(value, str) and value in options else default

        first, last = clamp(first_layer, "From layer", top), clamp(last_layer, "To layer", top)
        swapped = first > last
        first, last = min(first, last), max(first, last)
        mass = finite_float(threshold, "Attention mass kept", 1.0, 100.0, default=60.0) / 100.0
        return cls(layer=clamp(layer, "Layer", top),
                   head=None if flag(mean_heads, "Mean of heads") else clamp(head, "Head", result.num_heads - 1),
                   patch=((clamp(row, "Patch row", layout.grid_h - 1), clamp(col, "Patch column", layout.grid_w - 1))
                          if query == PATCH else None),
                   head_fusion=head_fusion if isinstance(head_fusion, str) and head_fusion in HEAD_FUSIONS else "mean",
                   discard_ratio=finite_float(discard_ratio, "Discard ratio", 0.0, 0.95, default=0.0),
                   first_layer=first, last_layer=last, gradcam_layer=clamp(gradcam_layer, "Grad-CAM block", top),
                   scale=choice(scale, SCALES, "own"), rollout_method=choice(rollout_method, ROLLOUTS, "attention"),
                   discard=choice(discard, DISCARDS, "row"),
                   threshold=mass if flag(threshold_on, "Threshold mask") else None, swapped=swapped)

    def query_text(self) -> str:
        return "the class / readout token" if self.patch is None else f"patch (row {self.patch[0]}, col {self.patch[1]})"

    def titles(self) -> dict[str, str]:
        heads = "mean of heads" if self.head is None else f"head {self.head}"
        discard = f", discard {self.discard_ratio:.0%} {'per row' if self.discard == 'row' else 'of the whole matrix'}"
        rollout = ("gradient rollout for the class (vit-explain)" if self.rollout_method == "gradient"
                   else f"rollout ({self.head_fusion} of heads)")
        return {"attention": f"attention, layer {self.layer}, {heads}, from {self.query_text()}",
                "rollout": f"{rollout}, layers {self.first_layer}-{self.last_layer}"
                           + (SWAPPED if self.swapped else "") + (discard if self.discard_ratio > 0 else ""),
                "gradcam": f"Grad-CAM (ReLU), block {self.gradcam_layer}",
                "chefer": "gradient-weighted attention (Chefer et al.)"}

    def record(self) -> dict:
        """These settings for the downloads."""
        return {"attention": {"layer": self.layer, "head": "mean of heads" if self.head is None else self.head,
                              "query": "class / readout token" if self.patch is None else list(self.patch)},
                "rollout": {"method": self.rollout_method, "head_fusion": self.head_fusion,
                            "discard_ratio": self.discard_ratio, "discard": self.discard,
                            "first_layer": self.first_layer, "last_layer": self.last_layer},
                "gradcam_block": self.gradcam_layer, "colour_scale": self.scale,
                "threshold_mass": self.threshold}


def download_options(session, controls: dict) -> dict:
    """The settings a session's downloads depend on (`View.record` of its pass shown), or a mark that the
    controls are unreadable."""
    try:
        return View.from_controls(session.result, **controls).record()
    except InputError:
        return {"unreadable": True}
