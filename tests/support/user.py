"""Running what a user types: a command in a process of its own, from a folder of the user's, with the `python` and
`vit-inspect` that the PATH finds (the user-path tests, tests/userpath)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from support import REPO

WEIGHTS = REPO / "checkpoints" / "deit_tiny_patch16_224.safetensors"  # where the README says to put them offline


def run(command: list[str], cwd: Path, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``command`` in ``cwd`` with this process's environment but PYTHONPATH: its exit code, stdout and stderr."""
    return subprocess.run(command, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})


def written(folder: Path) -> list[str]:
    """The files under ``folder``, links not followed, as sorted paths relative to it."""
    return sorted(str(Path(root, name).relative_to(folder)) for root, _, names in os.walk(folder) for name in names
                  if not Path(root, name).is_symlink())
