"""One mechanism against stale results: every result the page shows records what it was computed from (its
`Basis`), and one handler (`refresh`) compares each record with the page as it now is after anything that
can change it (a new model, image, geometry or class, a tab opening). A result whose basis changed is
recomputed when that is cheap and its tab is shown, and otherwise cleared, with a sentence saying what it
was computed for, what changed and what to press; a panel never shows another input's result as current.

Two kinds of results:
- the maps drawn from the session's one pass (`panels.draw_panels`): cheap, so every change that affects
  them redraws them, and a new image or model clears those out of view until their tab opens (`demo`);
- results that cost model passes or files (faithfulness scores, Compare, downloads, head ablation and
  importance, the Model tab's figures and files, a dataset's mean distance): each is a `Tracked` result,
  whose ``made_from`` state holds its `Basis` (or a value with a ``basis``), checked by `refresh`.

No library code here; `Basis.of` reads the session the page keeps (`inspector.Session`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Callable

import gradio as gr

from vit_inspect.ui.model_cache import CacheKey

LEVELS = ("model", "image", "class", "options")  # what a result can depend on, each level including those before
WHAT_CHANGED = {"model": "the model changed", "image": "the image or what the model sees of it changed",
                "class": "the class to explain changed", "options": "the settings changed"}
KEEP = object()  # `Tracked.cleared`: the output keeps its value when the result is cleared


@dataclass(frozen=True)
class Basis:
    """What a result was computed from. Compared up to a level (`key`); the words are for sentences only."""

    model: CacheKey | None  # the model (name, weights, device)
    model_words: str = ""  # "deit_tiny_patch16_224 (deit_tiny_patch16_224.safetensors)"
    image: str | None = None  # digest of the input the model saw (the upload and its geometry); None: no image
    image_words: str = ""  # "chelsea.png (model's centre crop, 224×224 pixels)"
    target: tuple = (None, None)  # (class, contrast) explained; (None, None) for a model without a head
    class_words: str = ""  # "class tabby, tabby cat (#281)", or "prompt 'a photo of a cat'"
    options: str = ""  # the settings (JSON) of results that depend on them
    extra: object = None  # a result's own input beyond the page's (Compare: model B)

    @classmethod
    def of(cls, session, key: CacheKey | None, options: dict | None = None, extra: object = None) -> Basis:
        """The basis of the page now: the model of ``key`` (the session's when None), the session's image and
        class (`inspector.Session`; None before any image), and ``options`` (settings) if given."""
        words = json.dumps(options, sort_keys=True, default=str) if options is not None else ""
        if session is None:
            return cls(model=key, model_words=getattr(key, "name", str(key)), options=words, extra=extra)
        return cls(model=key or session.model, model_words=session.model_label, image=session.digest,
                   image_words=session.image_words, target=session.target,
                   class_words=session.target_words(), options=words, extra=extra)

    def key(self, level: str) -> tuple:
        """What two results at ``level`` must share to be the same (see LEVELS)."""
        depth = LEVELS.index(level)
        return (self.model, self.extra, *((self.image,) if depth >= 1 else ()),
                *((self.target,) if depth >= 2 else ()), *((self.options,) if depth >= 3 else ()))

    def changed(self, now: Basis, level: str) -> str:
        """Words for the first thing that differs between this basis and ``now``, up to ``level``."""
        if (self.model, self.extra) != (now.model, now.extra):
            return WHAT_CHANGED["model"]
        for name, value, other in (("image", self.image, now.image), ("class", self.target, now.target),
                                   ("options", self.options, now.options)):
            if LEVELS.index(name) <= LEVELS.index(level) and value != other:
                return WHAT_CHANGED[name]
        return ""

    def words(self, level: str) -> str:
        """What the result was computed for, as far as ``level`` goes: "chelsea.png, class tabby (#281)"."""
        parts = [self.image_words if LEVELS.index(level) >= 1 else "",
                 self.class_words if LEVELS.index(level) >= 2 else ""]
        return ", ".join(p for p in parts if p) or self.model_words or "another input"


def result_key(session) -> tuple:
    """What a costly result of one session's pass depends on, to tell whether two results (faithfulness scores,
    sanity checks, head ablation) belong together: the model's cache key, a digest of the exact crop the model
    saw, the class, and the session's target as given (a prompt's text, None for a class)."""
    result = session.result
    digest = hashlib.blake2b(result.rgb.tobytes(), digest_size=16).hexdigest()
    return (session.model, digest, result.target, getattr(session, "target", None))


def basis_of(value) -> Basis | None:
    """The basis a ``made_from`` state holds: a `Basis`, a value with a ``basis`` attribute, or None."""
    return value if isinstance(value, Basis) or value is None else getattr(value, "basis", None)


@dataclass(frozen=True, eq=False)
class Tracked:
    """A result the page shows that costs model passes (or files): the state recording what it was made from,
    the outputs showing it, what it depends on, and how it is cleared or recomputed."""

    name: str  # for the api_name and messages
    made_from: gr.State  # its Basis, or a value with a ``basis`` (None: nothing shown)
    outputs: tuple  # the components showing it
    cleared: tuple  # the value of each output once cleared: None, "", KEEP, NOTE (where the sentence goes), or a
    #                 function (this Tracked, made_from, old basis, now) -> that output's own sentence
    level: str  # what it depends on: "model", "image", "class" or "options" (LEVELS)
    press: str  # what to press to compute it again, in Markdown: "**Score the maps**"
    tab: str | None = None  # the tab showing it, where `recompute` may run
    recompute: Callable | None = None  # cheap results: (session, key, controls) -> (made_from, *outputs)
    reset: Callable | None = None  # (made_from value, session) -> the value kept once cleared; default None
    extra: gr.State | None = None  # an input of its own that is part of its basis (Compare: model B's key)
    options: Callable | None = None  # (session, controls) -> the settings it depends on (level "options")
    sentence: Callable | None = field(default=None)  # (old basis, now) -> the words shown once cleared


NOTE = "\u2063note"  # `Tracked.cleared`: this output shows the sentence


def cleared_sentence(tracked: Tracked, old: Basis, now: Basis) -> str:
    """"Cleared: the image or what the model sees of it changed (these were for chelsea.png). Press **Score the
    maps** to compute them for coffee.png, class espresso (#967)." It names the input they were for only by its
    file, never its classes: a cleared result shows nothing of the input it was computed from."""
    if tracked.sentence is not None:
        return tracked.sentence(old, now)
    change = old.changed(now, tracked.level)
    were = f" (these were for {old.image_words})" if old.image_words and old.image != now.image else ""
    target = now.words(tracked.level)
    for_now = f" for {target}" if now.image is not None or tracked.level == "model" else " once an image is analysed"
    return f"*Cleared: {change}{were}. Press {tracked.press} to compute them{for_now}.*"


def own_sentence(press: str, shown: str, nothing: str) -> Callable:
    """A `Tracked.cleared` entry for one of a result's outputs with a button of its own (the Heads tab's ablation
    and ranking): the cleared sentence naming ``press``, or ``nothing`` when the ``made_from`` value's attribute
    ``shown`` (the words of what that output showed) is empty, since there was nothing to clear."""
    def sentence(tracked: Tracked, made_from, old: Basis, now: Basis) -> str:
        if not getattr(made_from, shown, ""):
            return nothing
        return cleared_sentence(replace(tracked, press=press), old, now)
    return sentence


def refresh(tracked: tuple[Tracked, ...]):
    """The one handler: (session, key, shown tab, each tracked result's made_from and extra, controls) ->
    for each tracked result, (made_from, *outputs): skipped where its basis still holds, recomputed where it
    is cheap and its tab is shown, cleared (with its sentence) otherwise."""
    def handler(session, key, shown, *states, **controls):
        updates = []
        for index, item in enumerate(tracked):
            made_from = states[2 * index]
            extra = states[2 * index + 1] if item.extra is not None else None
            old = basis_of(made_from)
            skip = [gr.skip()] * (1 + len(item.outputs))
            if old is None:
                updates += skip
                continue
            options = item.options(session, controls) if item.options is not None and session is not None else None
            now = Basis.of(session, key, options, extra)
            if old.key(item.level) == now.key(item.level):
                updates += skip
            elif item.recompute is not None and shown == item.tab and (session is not None or item.level == "model"):
                updates += list(item.recompute(session, key, controls))
            else:
                sentence = cleared_sentence(item, old, now)
                kept = item.reset(made_from, session) if item.reset is not None else None
                updates += [kept, *[sentence if value is NOTE else gr.skip() if value is KEEP
                                    else value(item, made_from, old, now) if callable(value) else value
                                    for value in item.cleared]]
        return updates
    return handler


def refresh_io(tracked: tuple[Tracked, ...]) -> tuple[list, list]:
    """(extra inputs, outputs) of `refresh`: each result's made_from and extra, then its made_from and outputs."""
    inputs = [component for item in tracked for component in (item.made_from, item.extra or item.made_from)]
    outputs = [component for item in tracked for component in (item.made_from, *item.outputs)]
    return inputs, outputs
