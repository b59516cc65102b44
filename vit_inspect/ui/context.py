"""The one contract between the page and its sections' tabs: each tab module has ``layout(settings) -> View``
(`PageSettings`) and ``wire(view, ctx)`` (`TabContext`), and is listed once in `sections.SECTIONS`.

A tab reads the page only through the context: the page's handlers (``app``, the `Inspector`: passes,
redraws, the model cache), the shared state and controls, the page's events it follows, and the other views
it draws into (``panels``). It registers its own events, and each result that costs model passes or files
with what it was computed from (``track``: the page's one stale-result check, `ui.stale`). Nothing else is
handed to a tab, and no tab imports another."""
from __future__ import annotations

from dataclasses import dataclass, field

import gradio as gr

from vit_inspect.ui.common import DRAW_CONCURRENCY, RAW
from vit_inspect.ui.stale import Tracked


@dataclass(frozen=True)
class PageSettings:
    """What a tab's ``layout`` may read: the app's settings that shape its components."""

    models: tuple[str, ...]  # the model choices a picker offers
    examples: int  # the example photos (the Heads tab's default reference set)
    session_ttl_s: float  # seconds a browser session's results live


@dataclass
class TabContext:
    """What a tab's ``wire(view, ctx)`` may use (see the module's docstring)."""

    app: object  # the page's handlers: its `inspector.Inspector`
    session: gr.State  # the image's passes (`inspector.Session`)
    key: gr.State  # the model every event of this browser session uses
    controls: dict  # the shared controls by name (layer, head, rollout options ...), passed as keyword inputs
    image: gr.Image  # the upload
    scale: gr.Radio  # the colour scale every map follows
    notice: gr.Markdown  # the page-wide refusal line
    shown_tab: gr.Textbox  # the label of the view in sight (`sections.record_shown`)
    page: object  # every section's tab and view: the page's `sections.Sections`
    panels: dict  # panel name (`panels.IMAGE_PANELS`) -> the image it is drawn into
    events: dict = field(default_factory=dict)  # page events tabs follow: "image", "class", "search", "prompt", "model"
    tracked: list = field(default_factory=list)  # the results that can go stale, in the order tabs added them
    after_checks: list = field(default_factory=list)  # (fn, inputs, outputs, api_name) run after each stale check

    def track(self, item: Tracked) -> None:
        """Put a result under the page's stale-result check (`ui.stale`)."""
        self.tracked.append(item)

    def after_check(self, fn, inputs: list, outputs: list, api_name: str) -> None:
        """Run ``fn`` after each of the page's stale-result checks (say, a table's label once its rows were
        cleared); its api name gets the check's name appended. ``fn`` gets the client's raw values (no Gradio
        preprocessing), as every handler of the page does, and checks them itself."""
        self.after_checks.append((fn, inputs, outputs, api_name))

    def opened(self, tab: gr.Tab) -> list:
        """The events on which a view comes into sight: its own select, and its section's."""
        section = next(group for group, tabs in self.page.groups() if tab in tabs)
        return [tab.select] if section is tab else [tab.select, section.select]

    def redraw(self, name: str, triggers: list, api_name: str | None = None) -> None:
        """The panel ``name`` redrawn from the session's pass on ``triggers`` (the newest request wins)."""
        gr.on(triggers, self.app.redraw(name), inputs=[self.session], inputs_kwargs=self.controls,
              outputs=self.panels[name], api_name=api_name or name, trigger_mode="always_last",
              show_progress="hidden", concurrency_limit=DRAW_CONCURRENCY, **RAW)
