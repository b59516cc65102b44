"""The benches' tools: another version's package loaded beside this checkout's (`--before-tree`)."""
from __future__ import annotations

import sys

from bench.bench_rollout_redraw import load_package


def test_every_module_of_the_other_version_is_its_own(tmp_path):
    """The other version's modules import one another as ``vit_inspect.…``; loaded under an alias, each of
    them (at the top of a module, inside a function, several names in parentheses) must reach the other
    version's modules, not this checkout's."""
    package = tmp_path / "vit_inspect"
    (package / "passes").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "passes" / "__init__.py").write_text("")
    (package / "passes" / "layer_stream.py").write_text('WHO = "the other version"\nALSO = 2\n')
    (package / "passes" / "pipeline.py").write_text(
        "from vit_inspect.passes.layer_stream import WHO\n"
        "from vit_inspect.passes.layer_stream import (\n    ALSO,\n)\n"
        "import vit_inspect.passes.layer_stream as stream\n"
        "LOGGER = 'vit_inspect.app'  # a string is left alone\n\n\n"
        "def later():\n    from vit_inspect.passes import layer_stream\n    return layer_stream.WHO\n")
    alias = "vit_inspect_tree_under_test"
    try:
        other = load_package(tmp_path, alias)
        import importlib

        pipeline = importlib.import_module(f"{alias}.passes.pipeline")
        assert pipeline.WHO == "the other version" and pipeline.ALSO == 2 and pipeline.later() == "the other version"
        assert pipeline.stream.__name__ == f"{alias}.passes.layer_stream" and pipeline.LOGGER == "vit_inspect.app"
        assert other.__name__ == alias
        import vit_inspect.passes.layer_stream as ours

        assert not hasattr(ours, "WHO")  # this checkout's module is untouched
        assert (package / "passes" / "pipeline.py").read_text().startswith("from vit_inspect.")  # the tree too
    finally:
        for name in [n for n in sys.modules if n == alias or n.startswith(alias + ".")]:
            del sys.modules[name]
