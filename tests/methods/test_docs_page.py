"""The docs page "Adding a method" shows the example package as it is."""
from __future__ import annotations

from support import REPO


def test_the_page_shows_the_whole_example_package():
    page = (REPO / "docs" / "adding-a-method.md").read_text()
    for name in ("pyproject.toml", "vit_inspect_input_x_gradient.py"):
        assert (REPO / "examples" / "plugin_input_x_gradient" / name).read_text().rstrip() in page
    assert "adding-a-method.md" in (REPO / "mkdocs.yml").read_text()
