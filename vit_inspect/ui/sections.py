"""The page's sections: a few top-level tabs (Explain, Heads, How it sees, Compare, Downloads), the first three
with sub-tabs, so that every view is in reach without Gradio's overflow menu at 1366 pixels or wider; each
sub-tab is a tab module's `layout()` (`ui.tabs`).

The page records the sub-tab it shows in a hidden textbox (``shown``), in the browser and at once: a sub-tab
opening writes its own label and remembers it for its section; a section opening writes the sub-tab it last
showed (its first at the start). Handlers read it to draw only what is in view (`Inspector.redraw_if_shown`)."""
from __future__ import annotations

import json
from dataclasses import dataclass

import gradio as gr

from vit_inspect.ui.tabs import (all_heads, all_maps, attention, compare, distance, downloads, faithfulness, gradcam,
                                 heads, model, overview, rollout)


@dataclass(frozen=True)
class Sections:
    """Every section's tab and every sub-tab's view."""

    explain: gr.Tab
    heads_section: gr.Tab
    sees: gr.Tab
    overview: overview.OverviewView
    attention: attention.AttentionView
    rollout: rollout.RolloutView
    gradcam: gradcam.GradcamView
    all_maps: all_maps.AllMapsView
    faithfulness: faithfulness.FaithfulnessView
    all_heads: all_heads.AllHeadsView
    heads: heads.HeadsView
    model: model.ModelView
    distance: distance.DistanceView
    compare: compare.CompareView
    downloads: downloads.DownloadsView

    def labels(self, section: gr.Tab) -> set[str]:
        """The labels of a section's views."""
        return {tab.label for group, tabs in self.groups() if group is section for tab in tabs}

    def groups(self) -> list[tuple[gr.Tab, list[gr.Tab]]]:
        """(section tab, its sub-tabs) in page order; a section without sub-tabs is its own only one."""
        return [(self.explain, [self.overview.tab, self.attention.tab, self.rollout.tab, self.gradcam.tab,
                                self.all_maps.tab, self.faithfulness.tab]),
                (self.heads_section, [self.all_heads.tab, self.heads.tab]),
                (self.sees, [self.model.tab, self.distance.tab]),
                (self.compare.tab, [self.compare.tab]), (self.downloads.tab, [self.downloads.tab])]


def layout(models, examples: int, session_ttl_s: float) -> Sections:
    """The sections, inside the page's right-hand column; ``models`` are the choices model B's picker offers,
    ``examples`` the number of example photos (the Heads tab's default reference set)."""
    with gr.Tabs(elem_id="sections", overflow_behavior="wrap"):
        with gr.Tab("Explain", elem_id="explain-section") as explain:
            with gr.Tabs(elem_id="explain-tabs", overflow_behavior="wrap"):
                views = dict(overview=overview.layout(), attention=attention.layout(), rollout=rollout.layout(),
                             gradcam=gradcam.layout(), all_maps=all_maps.layout(), faithfulness=faithfulness.layout())
        with gr.Tab("Heads", elem_id="heads-section") as heads_section:
            with gr.Tabs(elem_id="heads-tabs", overflow_behavior="wrap"):
                views |= dict(all_heads=all_heads.layout(), heads=heads.layout(examples, session_ttl_s))
        with gr.Tab("How it sees", elem_id="sees-section") as sees:
            with gr.Tabs(elem_id="sees-tabs", overflow_behavior="wrap"):
                views |= dict(model=model.layout(), distance=distance.layout())
        views |= dict(compare=compare.layout(models, session_ttl_s), downloads=downloads.layout())
    return Sections(explain=explain, heads_section=heads_section, sees=sees, **views)


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


def opened(section: gr.Tab, tab: gr.Tab) -> list:
    """The events on which a sub-tab comes into view: its own select, and its section's."""
    return [tab.select, section.select]
