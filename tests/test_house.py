"""The shape of the package: layers whose imports only point down, no cycles, small modules, a thin app.py,
and a library that needs neither gradio nor captum. The layers are import-linter contracts in
pyproject.toml; `lint-imports` checks them (imports inside functions included), and these tests prove that
the contracts pass here and break when an upward import or a cycle comes back."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from support import REPO

PACKAGE = REPO / "vit_inspect"
MAX_MODULE_LINES = 600
MAX_APP_LINES = 200


LINT = ("import sys; from importlinter.cli import lint_imports_command; "
        "sys.argv = ['lint-imports', '--config', sys.argv[1], '--no-cache']; lint_imports_command()")


def lint_imports(root) -> subprocess.CompletedProcess:
    """`lint-imports` with this repository's contracts, on the `vit_inspect` package found under ``root``."""
    env = os.environ | {"PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", LINT, str(REPO / "pyproject.toml")], cwd=root, env=env,
                          capture_output=True, text=True)


def test_the_layer_contracts_hold():
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 broken" in done.stdout


@pytest.mark.parametrize("module, line, broken", [
    ("core/tokens.py", "from vit_inspect.plots import canvas  # an upward import", "Layers"),
    ("core/tokens.py", "def _later():\n    from vit_inspect.core import handle  # a cycle, inside a function",
     "No import cycles"),
    ("cli/model.py", "from vit_inspect.cli import analyze  # one command importing another", "No command imports"),
    ("ui/common.py", "from vit_inspect.cli.common import progress  # the UI importing the CLI", "Layers"),
    ("notebook/result.py", "from vit_inspect.ui import panels  # the notebook API importing the app", "Layers"),
    ("plots/maps.py", "from vit_inspect.notebook import analyze  # a lower layer importing the notebook API",
     "Layers"),
])
def test_the_contracts_break_when_the_house_does(tmp_path, module, line, broken):
    shutil.copytree(PACKAGE, tmp_path / "vit_inspect", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "vit_inspect" / module).open("a") as file:
        file.write("\n\n" + line + "\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    assert any(line.startswith(broken) and line.endswith("BROKEN") for line in done.stdout.splitlines()), done.stdout


def test_few_files_at_the_top_and_no_large_module():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "__main__.py"]
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert max(sizes.values()) <= MAX_MODULE_LINES, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    assert len((REPO / "app.py").read_text().splitlines()) <= MAX_APP_LINES


def test_the_library_and_the_command_line_import_neither_gradio_nor_captum():
    """Every module outside `vit_inspect.ui` imports without the app's and the tests' dependencies."""
    code = ("import importlib, pkgutil, sys, vit_inspect\n"
            "for m in pkgutil.walk_packages(vit_inspect.__path__, 'vit_inspect.'):\n"
            "    if not m.name.startswith('vit_inspect.ui') and m.name != 'vit_inspect.__main__':\n"
            "        importlib.import_module(m.name)\n"
            "print(sorted(n for n in ('gradio', 'captum') if n in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
