"""The pass's options (`passes.options.PassOptions`): one set of defaults for the app, the CLI and the notebook,
the notebook's pass spilling exactly where the app's does, and the same numbers with or without the object."""
from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest
from PIL import Image
from support import TINY_TIMM, tiny_handle

import vit_inspect as vi
from vit_inspect.core.geometry import InputGeometry
from vit_inspect.core.images import ImageLimits
from vit_inspect.passes import attention_store, pipeline, spill
from vit_inspect.passes.options import AUTOMATIC, STUDY_OPTIONS, PassOptions
from vit_inspect.passes.pipeline import analyze_image
from vit_inspect.passes.spill import DEFAULT_SPILL_BUDGET, SpillFolder
from vit_inspect.ui.config import AppConfig
from vit_inspect.ui.inspector import Inspector
from vit_inspect.ui.model_cache import ModelCache


def _image(seed: int = 0, size=(40, 56)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, size=(*size, 3), dtype=np.uint8))


def _inspector(**config) -> Inspector:
    return Inspector(AppConfig(**config), ModelCache(loader=lambda *a, **k: None))


class Called(Exception):
    """Raised by a stand-in pass once it has recorded its options."""


def _recording(seen: list):
    def stand_in(handle, image, target=None, options=PassOptions(), **kwargs):
        seen.append(options.replace(**{k: v for k, v in kwargs.items() if k != "contrast"}))
        raise Called
    return stand_in


def test_the_defaults_are_one_frozen_object():
    defaults = PassOptions()
    assert defaults == PassOptions(input_size=None, gradients=True, autocast=False, limits=ImageLimits(),
                                   geometry=None, relevance=True, score=None, spill=AUTOMATIC)
    with pytest.raises(dataclasses.FrozenInstanceError):
        defaults.relevance = False
    assert STUDY_OPTIONS == defaults.replace(spill=None)
    assert defaults.replace() is defaults and defaults.replace(relevance=False).relevance is False
    with pytest.raises(TypeError):
        defaults.replace(spil=None)  # a misspelt setting is refused, never ignored
    with pytest.raises(ValueError, match="automatic"):
        PassOptions(spill="auto")
    assert defaults.spill_folder() is spill.shared_folder() and spill.shared_folder().budget == DEFAULT_SPILL_BUDGET
    assert PassOptions(spill=None).spill_folder() is None


def test_the_app_the_cli_and_the_notebook_build_their_pass_from_the_defaults(monkeypatch, tmp_path):
    """Each caller changes only what its user chose; every other field is `PassOptions()`'s."""
    from vit_inspect.cli import analyze as cli_analyze
    from vit_inspect.cli import heads as cli_heads
    from vit_inspect.cli.main import main
    from vit_inspect.notebook import api

    handle = tiny_handle("cls")
    path = tmp_path / "noise.png"
    _image().save(path)
    seen: list[PassOptions] = []
    for module in (api, cli_analyze, cli_heads):
        monkeypatch.setattr(module, "analyze_image", _recording(seen))

    with pytest.raises(Called):
        vi.analyze(path, model=handle, geometry="squash", relevance=False)
    assert seen.pop() == PassOptions(geometry=InputGeometry("squash"), relevance=False)
    with pytest.raises(Called):
        vi.analyze(path, model=handle)
    assert seen.pop() == PassOptions()

    monkeypatch.setattr(cli_analyze, "load_model", lambda *args, **kwargs: handle)
    with pytest.raises(Called):
        main(["analyze", str(path), "--model", "tiny", "--no-relevance"])
    assert seen.pop() == PassOptions(relevance=False)
    with pytest.raises(Called):
        cli_heads.heads_record(handle, str(path))
    assert seen.pop() == PassOptions()

    app = _inspector()
    monkeypatch.setattr(app, "run_pass", _recording(seen))
    geometry = InputGeometry("keep", 64)
    with pytest.raises(Called):
        app._pass(handle, path, geometry, relevance=True)
    assert seen.pop() == PassOptions(limits=app.config.limits, spill=app.spill, geometry=geometry)
    assert isinstance(app.spill, SpillFolder) and app.spill.budget == DEFAULT_SPILL_BUDGET  # the automatic's own


@pytest.mark.parametrize("kind", ["cls", "reg4"])
def test_the_notebook_spills_exactly_where_the_app_would(kind, monkeypatch, tmp_path):
    """With the kept-maps bound lowered (the tiny models' maps are a few kB) both passes write a spill; at the
    usual bound, or where rebuilding is cheap (`worth_spilling` false), neither does."""
    handle = tiny_handle(kind)
    picture = _image()
    app = _inspector()
    shared = SpillFolder(2 ** 30, root=tmp_path)  # the notebook's automatic folder, here in the test's own
    monkeypatch.setattr(spill, "shared_folder", lambda: shared)
    monkeypatch.setattr(pipeline, "worth_spilling", lambda *args: cheap is False)
    for bound, cheap, spills in ((0, False, True), (4 * 2 ** 20, False, False), (0, True, False)):
        monkeypatch.setattr(attention_store, "MAPS_IN_MEMORY_BYTES", bound)
        ours = vi.analyze(picture, model=handle, relevance=False).result.attention_store
        theirs = app._pass(handle, picture, InputGeometry()).attention_store
        assert (ours.spill is not None) is (theirs.spill is not None) is spills, (bound, cheap)
        if spills:
            assert ours.spill.alive and ours.spill.path.parent == shared.path
            assert theirs.spill.path.parent == app.spill.path
    del ours, theirs
    gc.collect()
    assert list(shared.path.iterdir()) == [] or shared.reusable == shared.used  # released with its result


def test_results_equal_with_and_without_the_object(tiny_kind, monkeypatch):
    """Bit-identical maps from the keyword settings and from the object, Q/K store and kept maps alike."""
    handle = tiny_handle(tiny_kind)
    size = TINY_TIMM[tiny_kind][1]
    for bound in (0, 4 * 2 ** 20):
        monkeypatch.setattr(attention_store, "MAPS_IN_MEMORY_BYTES", bound)
        loose = analyze_image(handle, _image(), input_size=size, geometry=InputGeometry("squash"), spill=None)
        whole = analyze_image(handle, _image(), None,
                              PassOptions(input_size=size, geometry=InputGeometry("squash"), spill=None))
        for name in ("probs", "gradcam", "chefer", "legrad", "attnlrp", "patch_features", "rgb", "mean_distance"):
            a, b = getattr(loose, name), getattr(whole, name)
            if a is None:
                assert b is None, name
            else:
                np.testing.assert_array_equal(a, b, err_msg=name)
        for layer in range(handle.depth):
            np.testing.assert_array_equal(loose.attention_map(layer), whole.attention_map(layer))
        for option in ({}, {"head_fusion": "max", "discard_ratio": 0.9}, {"start_layer": 1, "head_fusion": "min"}):
            np.testing.assert_array_equal(loose.rollout(**option), whole.rollout(**option))
        np.testing.assert_array_equal(loose.gradient_rollout(), whole.gradient_rollout())
