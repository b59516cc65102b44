"""The sanity checks of the page's maps, on demand (`studies.sanity.sanity_check`): the handler, its cancel flag
and what it keeps, for the Faithfulness tab (`ui.tabs.faithfulness`), which shows them beside its scores.

For the session's image and class (or the prompt of a CLIP-style model), on the crop its pass saw: the cascading
randomisation (the last block first, down to the patch embedding), the random-logit test and max-sensitivity and
infidelity; no independent randomisation (one more pass per block). Every map of `SANITY_METHODS` is recomputed at each step by the
one-pass code. The checks change the loaded model's weights in place for the length of the run and copy them
back bit for bit afterwards, also when cancelled or failing; they run on the model-pass queue, like every
event that reads the model, so no other event sees the randomised weights.

The result (`ImageSanity`, every map at every step) is held in the app's byte-bounded store (`session_store`);
the session keeps a `Checked`: its slot, the verdicts (small, so that the table keeps them when the store lets
the maps go) and what they were computed from (`stale.Basis`), for the page's stale-result check.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import gradio as gr
import numpy as np

from vit_inspect.core.errors import Cancelled, VitInspectError
from vit_inspect.core.prompts import Prompt
from vit_inspect.plots.faithfulness import paper_name
from vit_inspect.plots.sanity import cascading_panel, similarity_panel
from vit_inspect.studies.robustness import RobustnessSettings
from vit_inspect.studies.sanity import PASS_THRESHOLD, SANITY_METHODS, ImageSanity, SanitySettings, sanity_check
from vit_inspect.ui.cancel import Cancels
from vit_inspect.ui.common import public_message, public_name
from vit_inspect.ui.panels import FIGURE_PIXELS
from vit_inspect.ui.session_store import Slot
from vit_inspect.ui.stale import Basis, result_key
from vit_inspect.ui.untrusted import redact_paths
from vit_inspect.ui.zerogpu import gpu_pass

SETTINGS = SanitySettings(independent=False, robustness=RobustnessSettings())  # what the app runs
PRESS = "Run the sanity checks"
VERDICT_HEADER = f"randomisation test (ρ < {PASS_THRESHOLD})"
HEADERS = ["map", "ρ, every layer random", VERDICT_HEADER, "ρ, random logit", "max-sensitivity", "infidelity"]
NOT_RUN = "not run"
NOT_CHECKED = "–"  # a map the checks do not recompute (the random map, the other tabs' choices)


def passes_of(depth: int, settings: SanitySettings = SETTINGS) -> int:
    """Analysis passes of one run: the trained model, every cascading step, the random logit, the noisy inputs."""
    robustness = settings.robustness.sensitivity_samples if settings.robustness is not None else 0
    return 1 + depth + 1 + (depth if settings.independent else 0) + int(settings.random_logit) + robustness


def press_label(settings: SanitySettings = SETTINGS) -> str:
    """The button's words, true for a model of any depth: `passes_of` is a fixed count plus some per block."""
    fixed, per_block = passes_of(0, settings), passes_of(1, settings) - passes_of(0, settings)
    return f"{PRESS} ({fixed} analysis passes + {per_block} per block)"


def checks_of_crop(handle, rgb: np.ndarray, target: int | Prompt, **options) -> ImageSanity:
    """`sanity_check` of the (H, W, 3) uint8 crop a pass saw, on the handle's device (so that `zerogpu.gpu_pass`
    can run it on a lent GPU: the result holds numpy arrays only)."""
    pixels = handle.preprocess.normalize(rgb).to(handle.device)  # (1, 3, H, W)
    return sanity_check(handle, pixels, SANITY_METHODS, target=target, settings=SETTINGS, **options)


def verdict_cell(passes: bool | None, spearman: float) -> str:
    """"passes (ρ 0.12)", "fails (ρ 0.81)" or "undefined (a constant map)"."""
    if passes is None or not math.isfinite(spearman):
        return "undefined (a constant map)"
    return f"{'passes' if passes else 'fails'} (ρ {spearman:.2f})"


@dataclass(frozen=True, eq=False)
class Checked:
    """One run's results as the session keeps them (held in gr.State)."""

    key: tuple  # `stale.result_key`: model key, crop digest, class, target as given
    slot: Slot  # the `ImageSanity`, in the app's byte-bounded store
    verdicts: dict[str, str]  # paper name of each map -> `verdict_cell`
    rows: list  # the sanity table (`HEADERS`)
    basis: Basis | None = None  # what they were computed from, for the page's stale-result check

    def __hash__(self) -> int:
        """Its basis's, as the faithfulness scores' (`Scored.__hash__`)."""
        return hash(self.basis)


def released(checked: Checked | None, session) -> None:
    """`stale.Tracked.reset`: a cleared run's maps leave the store at once; the session keeps nothing."""
    if checked is not None:
        checked.slot.release()


def table_rows(result: ImageSanity) -> list[list[str]]:
    """One row per map (`HEADERS`): Spearman with every layer random and the verdict, the random-logit Spearman,
    max-sensitivity and infidelity."""
    def number(value: float | None, digits: str = ".2f") -> str:
        return "–" if value is None or not math.isfinite(value) else format(value, digits)

    verdicts = result.passes_randomisation()
    rows = []
    for method, steps in result.cascading.items():
        last = steps[-1].spearman
        logit = result.random_logit.get(method)
        rows.append([paper_name(method), number(last), verdict_cell(verdicts[method], last),
                     number(None if logit is None else logit.spearman), number(result.max_sensitivity.get(method)),
                     number(result.infidelity.get(method), ".3g")])
    return rows


class SanityChecks:
    """The handlers. ``handle_of`` gives the model of a cache key, ``store`` is the app's byte-bounded store."""

    def __init__(self, handle_of: Callable, store):
        self.handle_of = handle_of
        self.store = store
        self.cancels = Cancels("Nothing to cancel: no sanity checks are running for you.",
                               "Cancelling: the sanity checks stop before their next pass, and the model's weights "
                               "are restored.")
        self.run_checks = gpu_pass(checks_of_crop)

    def run(self, current, checked: Checked | None, key, request: gr.Request | None,
            progress: Callable = lambda *args, **kwargs: None) -> tuple:
        """(Checked, cascading panel, similarity panel, table rows, note) for the session's image and class;
        `Cancelled` (a sentence) when this browser session's Cancel was pressed before the next pass."""
        if current is None:
            raise VitInspectError("Analyse an image first; its maps are what the sanity checks test.")
        result = current.result
        if result.target is None:
            raise VitInspectError("The sanity checks explain a class: this model has no classification head.")
        if getattr(result, "versus", None) is not None:
            raise VitInspectError("The sanity checks explain one prompt, not one versus another. Clear the versus "
                                  "prompt, then run them.")
        prompt = getattr(result, "prompt", None)
        handle = self.handle_of(current.model)
        total = passes_of(handle.depth)
        progress(0, desc=f"Sanity checks: {total} analysis passes")
        with self.cancels.run(request) as stop:
            checks = self.run_checks(handle, result.rgb, result.target if prompt is None else prompt,
                                     cancelled=stop.is_set,
                                     progress=lambda done, all_: progress((done, all_), unit="passes"))
        nbytes = sum(np.asarray(m).nbytes for maps in checks.maps.values() for m in maps)
        slot = checked.slot if checked is not None else None
        if slot is None:
            slot = self.store.put(checks, nbytes)
        else:
            slot.set(checks, nbytes)
        rows = table_rows(checks)
        verdicts = {row[0]: row[2] for row in rows}
        target = f"prompt {prompt.text!r}" if prompt is not None else f"class {handle.label(result.target)!r}"
        upload = getattr(current, "image_words", "")
        words = (f"{public_name(handle.name)}, {target}" + ("" if prompt is not None else f" (#{result.target})")
                 + (f", {upload}" if upload else ""))
        strip = cascading_panel(result.rgb, checks, f"Cascading randomisation, the last block first — {words}. "
                                                    "Each map min-max normalised to its own range.", FIGURE_PIXELS)
        curves = similarity_panel(checks, f"Similarity to the trained model's map — {words}. Random logit: "
                                          f"{handle.label(checks.random_class)!r} (#{checks.random_class}).",
                                  FIGURE_PIXELS)
        robust = checks.settings.robustness
        passing = [row[0] for row in rows if row[2].startswith("passes")]
        other = ("zero-shot label " if prompt is not None else "class ") + \
            f"{handle.label(checks.random_class)!r} (#{checks.random_class})"
        note = (f"Ran {total} analysis passes for {target}" + (f" of {upload}" if upload else "") + ". "
                f"A map **passes the randomisation test** when its Spearman rank correlation ρ with the trained "
                f"model's map, once every block and the patch embedding are re-drawn by the model's own "
                f"initialiser (seed {checks.settings.seed}; the head kept), is below {PASS_THRESHOLD}: "
                f"{len(passing)} of {len(rows)} maps pass. Random logit: the map for {other}, drawn at random "
                f"with the seed; ρ near 1 means the map ignores the {'prompt' if prompt is not None else 'class'} "
                "(raw attention and rollout have none). "
                f"Max-sensitivity: the largest relative change of the map over {robust.sensitivity_samples} "
                f"inputs with uniform noise of ±{robust.radius} on the 0–1 pixel scale (0 = stable); infidelity: "
                f"{robust.infidelity_samples} random removals of each patch with probability "
                f"{robust.removal_probability} (logit², lower is better). The model's weights were restored "
                "afterwards. One image is noisy: the documentation's table over 200 images (Which map to "
                "trust) is steadier.")
        made = Checked(key=result_key(current), slot=slot, verdicts=verdicts, rows=rows,
                       basis=Basis.of(current, key or current.model))
        return made, strip, curves, rows, note

    def cancel(self, request: gr.Request | None) -> str:
        """Stop this browser session's run before its next pass."""
        return self.cancels.cancel(request)

    def handler(self, table: Callable[[object, Checked | None], object]):
        """The event's function: `run`, its library errors as sentences (a cancelled run a note, leaving the
        results as they were), then the faithfulness table with the verdict column (``table(scored, checked)``)."""
        def sanity_checks(current, checked: Checked | None, scored, key=None, request: gr.Request = None,
                          progress=gr.Progress()):
            try:
                made, strip, curves, rows, note = self.run(current, checked, key, request, progress)
            except Cancelled as exc:
                return gr.skip(), gr.skip(), gr.skip(), gr.skip(), f"{exc.public} Nothing was changed.", gr.skip()
            except VitInspectError as exc:
                raise gr.Error(public_message(exc), print_exception=False) from None
            except ValueError as exc:
                raise gr.Error(redact_paths(str(exc)), print_exception=False) from None
            return made, strip, curves, rows, note, table(scored, made)
        return sanity_checks
