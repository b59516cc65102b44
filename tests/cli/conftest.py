"""Fixtures of the command-line tests: the flags that load the real DeiT-Ti."""
from __future__ import annotations

import pytest
from support import DEIT_WEIGHTS


@pytest.fixture(scope="module")
def deit_args():
    """--model, --weights and --device for the real DeiT-Ti/16 from ../shared (skipped only when absent)."""
    if not DEIT_WEIGHTS.is_file():
        pytest.skip(f"real weights not found at {DEIT_WEIGHTS}")
    return ["--model", "deit_tiny_patch16_224", "--weights", str(DEIT_WEIGHTS), "--device", "cpu"]
