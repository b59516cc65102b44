"""Every command and code block of the README and of docs/getting-started.md, as written, in the environment the
README's install made: the install itself (it made this environment: `.ci/user-path` runs the README's line), each
`vit-inspect` command, and each page's Python blocks in one interpreter, as a notebook runs them; the commands
run elsewhere are named in `ELSEWHERE` and checked to be run there. What a block says it prints is what it
prints, and examples write only into `out/`."""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from PIL import Image
from support import REPO
from support.docs import code_blocks, commands, pinned
from support.user import run, written

from vit_inspect.core.images import find_images

PAGES = ("README.md", "docs/getting-started.md")
CI = (REPO / ".ci" / "user-path").read_text() + (REPO / ".ci" / "run").read_text()
CPU_TORCH = re.compile(r"pip install torch==(\S+) torchvision==(\S+) --index-url https://download\.pytorch\.org/whl/cpu")
ELSEWHERE = {  # commands of the pages run by another part of CI, and where
    "pip install -r requirements.txt -e .": "made this environment (.ci/user-path)",
    "pip install -r requirements-dev.txt": ".ci/run installs the test tools into this environment after this stage",
    "python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder": ".ci/run runs the full suite in this environment after this stage",
    "python app.py": "test_app.py serves the app from this environment and drives every section in Chromium",
}


def shell_commands() -> dict[str, list[str]]:
    """Each distinct command of the pages' shell blocks -> the lines it is written on (with their comments)."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for block in code_blocks(page, "bash"):
            for line in block.code.splitlines():
                for command in commands(line):
                    found.setdefault(command, []).append(f"{page}: {line}")
    return found


COMMANDS = shell_commands()
RUN_HERE = sorted(c for c in COMMANDS if c.startswith(("vit-inspect ", "python -m vit_inspect ")))


def ci_runs(command: str) -> bool:
    """Whether a line of `.ci/user-path` or `.ci/run` is ``command`` as written (its comment aside)."""
    return any(line.split("#")[0].strip() == command for line in CI.splitlines())


def test_the_pages_have_the_commands_a_user_needs():
    assert "pip install -r requirements.txt -e ." in COMMANDS and "python app.py" in COMMANDS
    assert {c.split()[1] for c in RUN_HERE} == {"analyze", "model"}


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - set(RUN_HERE)))
def test_every_other_command_is_run_by_ci(command):
    cpu = CPU_TORCH.fullmatch(command)
    if cpu:  # PyTorch's CPU wheels: not reachable from CI, so its versions must be the ones CI installs
        assert cpu.groups() == (pinned(REPO / "requirements.txt", "torch"),
                                pinned(REPO / "requirements.txt", "torchvision")), COMMANDS[command]
        return
    assert command in ELSEWHERE, f"a command no test runs: {COMMANDS[command]}"
    if command.startswith(("pip ", "python -m pytest")):
        assert ci_runs(command), f".ci/run does not run {command!r}, which {COMMANDS[command]} names"


def test_the_install_put_the_package_and_the_command_on_the_path(tmp_path):
    """`import vit_inspect` from any folder gives this checkout's package, and `vit-inspect` is this
    environment's script."""
    found = run([sys.executable, "-c", "import vit_inspect; print(vit_inspect.__file__)"], cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()) == REPO / "vit_inspect" / "__init__.py"
    assert Path(shutil.which("vit-inspect")).parent == Path(sys.executable).parent


@pytest.mark.parametrize("command", RUN_HERE)
def test_the_command_runs_as_written(command, work):
    done = run(command.split(), cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "\r" not in done.stderr  # progress: a line per update off a terminal
    records = [json.loads(line) for line in done.stdout.splitlines()]
    images = len(find_images([work / word for word in command.split() if word.startswith("assets")]))
    if command.split()[1] == "analyze":  # a record per image
        assert len(records) == images and all(r["topk"] and r["rollout"] for r in records)
    else:  # model --images: one record over the folder
        assert len(records) == 1 and records[0]["num_images"] == images
    assert all(name.startswith("out/") for name in written(work)), written(work)
    claimed = {name for line in COMMANDS[command] for name in re.findall(r"\bout/[\w/.-]+\.png", line)}
    assert claimed <= set(written(work))


@pytest.mark.parametrize("page", PAGES)
def test_the_pages_python_runs_as_written_and_prints_what_it_says(page, work):
    """A page's Python blocks in one interpreter, in order (as a notebook runs them)."""
    blocks = code_blocks(page, "python")
    done = run([sys.executable, "-"], cwd=work, stdin="\n".join(b.code for b in blocks))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "".join(b.printed() for b in blocks)
    assert all(name.startswith("out/") for name in written(work)), written(work)
    for name in re.findall(r"\"(out/[^\"]+)\"", "".join(b.code for b in blocks)):
        assert (work / name).stat().st_size > 0, name
        if name.endswith(".png"):
            with Image.open(work / name) as image:
                assert image.format == "PNG" and image.width > 200


def test_the_readme_says_what_the_quick_start_prints():
    assert "".join(b.printed() for b in code_blocks("README.md", "python")) == (
        "0.44  Egyptian cat (#285)\n0.23  tabby, tabby cat (#281)\n0.19  tiger cat (#282)\n")
