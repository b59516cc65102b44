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



def xdist_group(item: pytest.Item) -> str:
    """The unit of work a test belongs to on pytest-xdist's workers (`--dist loadgroup`): the group it names
    (`pytest.mark.xdist_group`), else its file."""
    names = sorted(str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                   for mark in item.iter_markers("xdist_group"))
    return "_".join(names) or item.path.as_posix()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """How the suite spreads over two workers (the README's `-n 2 --dist loadgroup --no-loadscope-reorder`):
    - a test file is one unit, so its module fixtures (a served app, a model) start once, unless a test names
      a group of its own, as the parts of the longest test do;
    - the units holding slow tests run first, so the run does not end with one worker busy on a long unit while
      the other waits. Plain `python -m pytest` runs the same tests in this order in one process."""
    for item in items:
        if not any(item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group(item.path.relative_to(config.rootpath).as_posix()))
    slow = {xdist_group(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: xdist_group(item) not in slow)  # stable: each unit stays in one piece


# The user-path tests run alone, with the environment the README's install makes (.ci/run's first stage:
# `python -m pytest -n 2 --dist loadfile tests/userpath`); the full suite leaves them out, so that CI does not run
# them twice.
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


