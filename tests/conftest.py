"""Fixtures every test layer shares, and the test run's environment (set before gradio is imported)."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
# Gradio's uploads and served files go to a folder of this run's own (set before gradio is imported), as
# `python app.py` does (app.own_upload_folder): in the folder every Gradio process shares by default, a
# test server that stops deletes the content-named files it served, which another run's server may be
# serving at that moment (its clients then get 403).
GRADIO_FOLDER = tempfile.mkdtemp(prefix="vit_inspect_tests_gradio_")
os.environ["GRADIO_TEMP_DIR"] = GRADIO_FOLDER
atexit.register(shutil.rmtree, GRADIO_FOLDER, ignore_errors=True)

from support import DEIT_WEIGHTS, TINY_TIMM  # noqa: E402  (after the environment above)

# On pytest-xdist's workers (`-n 2`), each worker's torch computes on its share of the cores: two workers of two
# OpenMP threads each on two cores would spin against each other.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# The user-path tests run alone, with the environment the README's install makes (.ci/run's first stage:
# `python -m pytest tests/userpath`); the full suite leaves them out, so that CI does not run them twice.
collect_ignore = ["userpath"]


@pytest.fixture(params=sorted(TINY_TIMM))
def tiny_kind(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def deit():
    """The real DeiT-Ti/16 ImageNet weights from ../shared (skipped only when absent)."""
    if not DEIT_WEIGHTS.is_file():
        pytest.skip(f"real weights not found at {DEIT_WEIGHTS}")
    from vit_inspect.core.load import load_model

    return load_model("deit_tiny_patch16_224", weights=DEIT_WEIGHTS, device="cpu")


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory):
    """Random weights of timm's `test_vit` (6 layers, 2 heads, 160-pixel input) in a .safetensors file: a
    second model for Compare."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "tiny_random_test_vit.safetensors"
    save_file(timm.create_model("test_vit", pretrained=False).state_dict(), str(path))
    return path


