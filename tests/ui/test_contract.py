"""The app's one contract with its views (`ui.context`): every tab module has ``layout(settings)`` and
``wire(view, ctx)``, is listed once in `sections.SECTIONS`, and nothing else names it; a new view is one module
plus one line there, and gets its events, its redraws and the stale-result check through the context."""
from __future__ import annotations

import inspect
import pkgutil
import re
import types

import pytest
from support import REPO

gr = pytest.importorskip("gradio")
from vit_inspect.ui import sections, tabs  # noqa: E402
from vit_inspect.ui.context import PageSettings, TabContext  # noqa: E402
from vit_inspect.ui.demo import build_demo  # noqa: E402
from vit_inspect.ui.stale import NOTE, Tracked  # noqa: E402


def tab_modules() -> dict[str, types.ModuleType]:
    return {info.name: __import__(f"vit_inspect.ui.tabs.{info.name}", fromlist=["wire"])
            for info in pkgutil.iter_modules(tabs.__path__)}


def test_every_tab_has_the_two_functions_and_one_entry():
    listed = [module for *_, members in sections.SECTIONS for _, module in members]
    modules = tab_modules()
    assert sorted(m.__name__ for m in listed) == sorted(m.__name__ for m in modules.values())  # each exactly once
    for name, module in modules.items():
        assert list(inspect.signature(module.layout).parameters) == ["settings"], name
        assert list(inspect.signature(module.wire).parameters) == ["view", "ctx"], name


def test_only_the_section_list_names_the_tabs():
    """The page (`demo.py`) and every other module of the app reach a view through the context, never by
    importing its tab module: only `sections.py` does."""
    for path in (REPO / "vit_inspect" / "ui").glob("*.py"):
        if path.name != "sections.py":
            assert not re.search(r"^from vit_inspect\.ui\.tabs|^from vit_inspect\.ui import .*\btabs\b",
                                 path.read_text(), re.M), path.name


def test_a_new_view_is_one_module_and_one_line(monkeypatch):
    """A view written as a plugin author would: its layout gets the page's settings, its wire the context; its
    button works through the page's session, and its result is under the page's stale-result check."""
    seen = {}
    view = types.ModuleType("word_count")

    def layout(settings: PageSettings):
        seen["settings"] = settings
        with gr.Tab("Words", elem_id="words-tab") as tab:
            button = gr.Button("Count")
            out = gr.Markdown(elem_id="words-out")
            made_from = gr.State(None)
        return types.SimpleNamespace(tab=tab, button=button, out=out, made_from=made_from)

    def wire(v, ctx: TabContext):
        seen["ctx"] = ctx
        gr.on([v.button.click], lambda session: "no image" if session is None else session.name,
              inputs=[ctx.session], outputs=[v.out], api_name="count_words")
        ctx.track(Tracked("words", v.made_from, (v.out,), (NOTE,), "image", "**Count**"))

    view.layout, view.wire = layout, wire
    monkeypatch.setattr(sections, "SECTIONS", (*sections.SECTIONS, ("words", None, None, (("words", view),))))
    demo = build_demo()
    assert seen["settings"].session_ttl_s > 0 and isinstance(seen["ctx"], TabContext)
    assert [t.name for t in seen["ctx"].tracked][-1] == "words"
    names = {d.get("api_name") for d in demo.config["dependencies"]}
    assert "count_words" in names and "stale_check_image" in names
    assert "Words" in [tab.label for group, tab_list in seen["ctx"].page.groups() for tab in tab_list]
