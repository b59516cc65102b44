"""The user's path: what a new user does after the README's install, in the environment that install made.

`.ci/run`'s first stage makes a fresh virtual environment, runs the README's install command in it (and installs
pytest, pytest-xdist and playwright, nothing else), then runs `python -m pytest -n 2 --dist loadfile tests/userpath`
with that environment active.
Every command here runs as the user would run it: in a process of its own, from a folder outside the repository
(beside a link to its `assets/`), with the `python` and `vit-inspect` the PATH finds (`support.user`). The full
suite leaves this folder out (tests/conftest.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from support import REPO
from support.user import WEIGHTS


@pytest.fixture(scope="session")
def weights() -> Path:
    """The default model's weights where the README says to put them offline (skipped only when absent)."""
    if not WEIGHTS.is_file():
        pytest.skip(f"no DeiT-Ti weights at {WEIGHTS} (.ci/run copies them there)")
    return WEIGHTS


@pytest.fixture
def work(tmp_path, weights) -> Path:
    """An empty folder outside the repository with a link to the repository's `assets/`, where a README example
    expects to find them."""
    (tmp_path / "assets").symlink_to(REPO / "assets")
    return tmp_path
