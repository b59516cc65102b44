"""The project's text: a README that sells and orients, notebooks committed with their outputs, benchmarks that
quote their CSV files, and no history in what users read.

CI also builds the site (`mkdocs build --strict`), executes the notebooks (`pytest --nbmake docs/notebooks`) and, in
its first stage, runs every command and code block of the README and of docs/getting-started.md in the
environment the README's install makes (tests/userpath)."""
from __future__ import annotations

import json
import re
import subprocess

import pytest
from PIL import Image
from support import REPO

README = REPO / "README.md"
NOTEBOOKS = sorted((REPO / "docs" / "notebooks").glob("*.ipynb"))
MAX_README_LINES = 300
FIRST_SCREEN_LINES = 30  # the picture must be this close to the top


def test_the_readme_is_short_and_shows_the_app_first():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES
    assert lines[0] == "---" and "app_file: app.py" in lines[:12]  # the Space's front matter
    picture = next(i for i, line in enumerate(lines) if line.startswith("!["))
    assert picture < FIRST_SCREEN_LINES
    path = re.search(r"\]\(([^)]+)\)", lines[picture]).group(1)
    with Image.open(REPO / path) as image:
        assert image.format == "PNG" and image.width >= 800
    assert (REPO / path).stat().st_size < 400_000


def test_every_relative_link_of_the_readme_exists():
    for target in re.findall(r"\]\((?!https?://|#)([^)#]+)", README.read_text()):
        assert (REPO / target).exists(), target


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_committed_with_their_outputs(path):
    notebook = json.loads(path.read_text())
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert code and all(cell["outputs"] for cell in code), "every code cell has its output"
    assert not any(output.get("output_type") == "error" for cell in code for output in cell["outputs"])
    kinds = {kind for cell in code for output in cell["outputs"] for kind in output.get("data", {})}
    assert {"image/png", "text/html"} <= kinds  # figures, and a result that shows itself
    text = path.read_text()
    assert "../shared" not in text and "/work/" not in text  # nothing of the machine it ran on


def test_the_notebooks_and_the_site_are_where_ci_builds_them():
    config = (REPO / "mkdocs.yml").read_text()
    for path in NOTEBOOKS:
        assert f"notebooks/{path.name}" in config
    assert "strict: true" in config
    ci = (REPO / ".ci" / "run").read_text()
    assert "mkdocs build --strict" in ci and re.search(r"pytest .*--nbmake\b.* docs/notebooks", ci)


def test_benchmarks_quote_the_csv_files_the_scripts_write():
    text = (REPO / "BENCHMARKS.md").read_text()
    quoted = set(re.findall(r"bench/results/([\w.]+\.csv)", text))
    assert quoted and all((REPO / "bench" / "results" / name).is_file() for name in quoted)
    for name in quoted:
        header = (REPO / "bench" / "results" / name).read_text().splitlines()[0]
        assert header.endswith("threads,date,command,machine")


# What the project's text must not carry: how it was built instead of what it does.
HISTORY = re.compile(
    r"\bissues?[ -]?#?\d+|\brounds? of work\b|\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth"
    r"|eleventh|twelfth|[a-z]+teenth|twentieth|\d+(st|nd|rd|th)) (session|round)\b"
    r"|\bdevelopers?\b|\bmachine (was |is )?shared\b|\.\./shared"
    r"|\b(against|before|baseline|since|tree|archive) [0-9a-f]{7,40}\b", re.I)
PROJECT_TEXT = ["README.md", "*/README.md", "BENCHMARKS.md", "CHANGELOG.md", "docs/**/*.md", "docs/notebooks/*.ipynb",
                "vit_inspect/**/*.py", "bench/*.py", "examples/*.py", "app.py"]


def test_the_projects_text_speaks_of_the_project():
    """No issue numbers, numbered sessions or rounds of work, developers or shared machines, workspace paths or
    commit hashes as baselines in the README, the docs and notebooks, BENCHMARKS, the changelog, or the code's
    docstrings and comments (`HISTORY` over `PROJECT_TEXT`)."""
    found = []
    for pattern in PROJECT_TEXT:
        for path in sorted(REPO.glob(pattern)):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if HISTORY.search(line):
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


def test_install_commands_name_only_what_a_clone_has():
    """An install command in the project's text names a requirements file or the clone itself, never
    `vit_inspect[extra]`: the package is on no index."""
    found = [f"{path.relative_to(REPO)}:{number}" for pattern in PROJECT_TEXT for path in sorted(REPO.glob(pattern))
             for number, line in enumerate(path.read_text().splitlines(), 1) if "vit_inspect[" in line]
    assert not found, found


def test_requirements_txt_is_the_apps_dependencies_and_what_a_space_installs():
    """Every dependency of the package and of its `app` extra (captum for the sanity checks included) pinned at the
    version tested, and no line that installs the package itself: a Space installs this file before it copies the
    repository (the README's install adds the package with `-e .`)."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's TOML reader")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {re.match(r"[\w.-]+", d).group(0).lower() for d in
              project["dependencies"] + project["optional-dependencies"]["app"]}
    lines = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    lines = [line for line in lines if line]
    assert not [line for line in lines if line in (".", "-e .") or line.startswith(("-e", "file:", "./"))]
    assert {re.match(r"[\w.-]+", line).group(0).lower() for line in lines} == wanted
    assert "captum" in wanted and "gradio" in wanted


def test_the_history_search_finds_what_it_looks_for():
    for line in ("as stated in issue 13", "the machine was shared by eight developers", "against afcd7f7",
                 "cp ../shared/models/x .", "the eighteenth session took", "two rounds of work",
                 "git archive 9a7eb95 vit_inspect", "after the 3rd round"):
        assert HISTORY.search(line), line
    for line in ("a Gradio session's results", "one forward per image", "Sessions never see each other's results",
                 "the first release's pass", "the fourth layer", "the handler and session"):
        assert not HISTORY.search(line), line


def test_git_tracks_no_weights_or_datasets():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.splitlines()
    if not tracked:
        pytest.skip("not a git checkout")
    assert not [p for p in tracked if p.endswith((".safetensors", ".pth", ".pt", ".bin", ".zip", ".npz"))]
