"""The page's sections: a few top-level tabs (Explain, Heads, How it sees, Compare, Features, Downloads), the
first three with sub-tabs, so that every view is in reach without Gradio's overflow menu at 1366 pixels or wider; each
sub-tab is a tab module's `layout()` (`ui.tabs`).

The page records the sub-tab it shows in a hidden textbox (``shown``), in the browser and at once: a sub-tab
opening writes its own label and remembers it for its section; a section opening writes the sub-tab it last
showed (its first at the start). Handlers read it to draw only what is in view (`Inspector.redraw_if_shown`)."""
from __future__ import annotations

import json
import gradio as gr

from vit_inspect.ui.context import PageSettings
from vit_inspect.ui.tabs import (all_heads, all_maps, attention, compare, concepts, distance, downloads, faithfulness,
                                 features, gradcam, heads, model, overview, rollout, similarity)

# The page's sections in order: (name, label, elem_id, its views as (name, tab module)); a section of one view
# has no sub-tabs (label and elem_id None: the view's own tab is the section). A new view is one tab module
# (`ui.context`: layout and wire) and one entry here.
SECTIONS = (
    ("explain", "Explain", "explain-section", (("overview", overview), ("attention", attention), ("rollout", rollout),
                                               ("gradcam", gradcam), ("all_maps", all_maps),
                                               ("faithfulness", faithfulness))),
    ("heads_section", "Heads", "heads-section", (("all_heads", all_heads), ("heads", heads))),
    ("sees", "How it sees", "sees-section", (("model", model), ("distance", distance), ("concepts", concepts),
                                            ("similarity", similarity))),
    ("compare", None, None, (("compare", compare),)),
    ("features", None, None, (("features", features),)),
    ("downloads", None, None, (("downloads", downloads),)),
)


class Sections:
    """Every section's tab (``sections``: name -> gr.Tab) and every view (``views``: name -> the tab module's
    View), each also an attribute by its name (``page.attention``, ``page.explain``)."""

    def __init__(self, sections: dict[str, gr.Tab], views: dict[str, object]):
        self.sections, self.views = sections, views

    def __getattr__(self, name: str):
        for table in ("sections", "views"):
            found = self.__dict__.get(table, {})
            if name in found:
                return found[name]
        raise AttributeError(f"the page has no section or view {name!r}")

    def labels(self, section: gr.Tab) -> set[str]:
        """The labels of a section's views."""
        return {tab.label for group, tabs in self.groups() if group is section for tab in tabs}

    def groups(self) -> list[tuple[gr.Tab, list[gr.Tab]]]:
        """(section tab, its sub-tabs) in page order; a section without sub-tabs is its own only one."""
        return [(self.sections[name] if label else self.views[views[0][0]].tab,
                 [self.views[view].tab for view, _ in views]) for name, label, _, views in SECTIONS]


def layout(settings: PageSettings) -> Sections:
    """The sections, inside the page's right-hand column: each view is its tab module's `layout(settings)`."""
    sections, views = {}, {}
    with gr.Tabs(elem_id="sections", overflow_behavior="wrap"):
        for name, label, elem_id, members in SECTIONS:
            if label is None:
                views |= {view: module.layout(settings) for view, module in members}
                continue
            with gr.Tab(label, elem_id=elem_id) as sections[name]:
                with gr.Tabs(elem_id=elem_id.replace("-section", "-tabs"), overflow_behavior="wrap"):
                    views |= {view: module.layout(settings) for view, module in members}
    return Sections(sections, views)


def modules() -> dict[str, object]:
    """view name -> its tab module, in page order (the order their events are registered in, `build_demo`)."""
    return {view: module for *_, members in SECTIONS for view, module in members}


def record_shown(sections: Sections, shown: gr.Textbox) -> None:
    """Browser-only listeners (no server call) that keep ``shown`` the label of the sub-tab in view."""
    for section, tabs in sections.groups():
        name = json.dumps(section.label)
        gr.on([section.select], None, outputs=[shown], queue=False, js=f"() => {remembered(sections, section)}")
        for tab in tabs:
            if tab is not section:
                gr.on([tab.select], None, outputs=[shown], queue=False,
                      js=f"() => ((window.vitInspectTabs = window.vitInspectTabs || {{}})[{name}] = "
                         f"{json.dumps(tab.label)})")


def remembered(sections: Sections, section: gr.Tab) -> str:
    """JS: the label of the view ``section`` shows (the one it last showed; its first at the start)."""
    first = next(tabs[0] for group, tabs in sections.groups() if group is section)
    return f"((window.vitInspectTabs || {{}})[{json.dumps(section.label)}] || {json.dumps(first.label)})"


def shown_js(sections: Sections, section: gr.Tab, position: int) -> str:
    """JS run before a server event on ``section``'s opening: its input at ``position`` (the shown textbox)
    becomes the view the section shows, read in the page, whatever the textbox's own listener has done yet.
    Gradio selects the first section when the page mounts: then the view is the first view."""
    return f"(...values) => {{ values[{position}] = {remembered(sections, section)}; return values; }}"

