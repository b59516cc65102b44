"""The notebook API: `vit_inspect.analyze` and the `Analysis` it returns (maps, figures, Jupyter's view,
the record and the .npz), on tiny random ViTs and on the real DeiT-Ti weights."""
from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image
from support import DEIT_WEIGHTS, PHOTOS, tiny_handle

import vit_inspect as vi
from vit_inspect.methods import added, get, method_record
from vit_inspect.notebook import api
from vit_inspect.notebook.result import legible
from vit_inspect.passes.records import analysis_record
from vit_inspect.plots.canvas import figure_to_png, map_range
from vit_inspect.plots.maps import PASS_MAPS, maps_panel, overlay


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    path = tmp_path_factory.mktemp("notebook") / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def tiny(picture):
    handle = tiny_handle("cls", seed=1)
    return vi.analyze(picture, model=handle)


def test_analyze_runs_one_pass_and_keeps_its_result(tiny, picture):
    assert isinstance(tiny, vi.Analysis)
    assert tiny.image == str(picture)
    assert tiny.result.model_name == tiny.handle.name
    top = tiny.top(3)
    assert [row["index"] for row in top] == list(np.argsort(-tiny.result.probs)[:3])
    assert [row["prob"] for row in top] == pytest.approx(sorted(tiny.result.probs, reverse=True)[:3])
    assert repr(tiny).startswith(f"Analysis({tiny.handle.name}, {str(picture)!r}, 4x4 patches, 2 layers x 2 heads")


def test_map_gives_the_results_arrays_with_their_options(tiny):
    result = tiny.result
    np.testing.assert_array_equal(tiny.map("attention"), result.attention_map(result.depth - 1))
    np.testing.assert_array_equal(tiny.map("attention", layer=0, head=1, query=(1, 2)),
                                  result.attention_map(0, 1, (1, 2)))
    np.testing.assert_array_equal(tiny.map("rollout", discard_ratio=0.5, head_fusion="max"),
                                  result.rollout("max", 0.5))
    np.testing.assert_array_equal(tiny.map("gradcam", layer=0), result.gradcam[0])
    np.testing.assert_array_equal(tiny.map("gradcam"), result.gradcam[-1])
    for name in ("chefer", "legrad", "attnlrp"):
        np.testing.assert_array_equal(tiny.map(name), getattr(result, name))
    np.testing.assert_array_equal(tiny.map("gradient_rollout", discard_ratio=0.5), result.gradient_rollout(0.5))
    assert set(tiny.maps()) == set(PASS_MAPS) | set(added())  # the built-ins, then the installed plugins


def test_map_refuses_unknown_names_options_and_missing_maps(tiny, picture):
    with pytest.raises(ValueError, match="unknown map 'saliency'"):
        tiny.map("saliency")
    with pytest.raises(ValueError, match="takes no option colour"):
        tiny.map("chefer", colour="red")
    plain = vi.analyze(picture, model=tiny.handle, relevance=False)
    assert "legrad" not in plain.maps() and "gradcam" in plain.maps()
    with pytest.raises(ValueError, match="relevance=True"):
        plain.map("legrad")


def _overlays(fig: Figure) -> list[np.ndarray]:
    return [np.asarray(ax.images[0].get_array()) for ax in fig.axes if ax.images and ax.get_title()]


def test_show_draws_the_map_over_the_crop_with_its_unit(tiny):
    fig = tiny.show("attention", layer=0, head=1)
    assert isinstance(fig, Figure)
    values = tiny.map("attention", layer=0, head=1)
    low, high = map_range(values)
    [drawn] = _overlays(fig)
    np.testing.assert_array_equal(drawn, overlay(tiny.result.rgb, values, vmin=low, vmax=high))
    titles = [ax.get_title() for ax in fig.axes]
    assert "attention (layer=0, head=1)" in titles
    assert any(ax.get_ylabel() == "attention weight (probability)" for ax in fig.axes)  # the colour bar
    assert f"class {tiny.handle.label(tiny.result.target)}" in fig._suptitle.get_text()
    assert figure_to_png(fig).startswith(b"\x89PNG")


def test_show_relus_gradcam_only(tiny):
    values = tiny.map("gradcam")
    low, high = map_range(values, relu=True)
    [drawn] = _overlays(tiny.show("gradcam"))
    np.testing.assert_array_equal(drawn, overlay(tiny.result.rgb, values, relu=True, vmin=low, vmax=high))


def test_show_all_draws_every_map_of_the_pass(tiny):
    fig = tiny.show_all()
    maps = tiny.maps()
    titles = [ax.get_title().replace("\n", " ") for ax in fig.axes if ax.images]
    assert titles == [PASS_MAPS[k][0] if k in PASS_MAPS else k for k in maps]  # a plugin's under its name
    for drawn, (key, values) in zip(_overlays(fig), maps.items()):
        relu = key == "gradcam"
        low, high = map_range(values, relu)
        np.testing.assert_array_equal(drawn, overlay(tiny.result.rgb, values, relu=relu, vmin=low, vmax=high))
    distance = tiny.show_distance()
    assert distance.axes[0].get_ylabel() == "mean attention distance (pixels)"


def test_the_result_shows_itself_in_jupyter(tiny):
    page = tiny._repr_html_()
    for row in tiny.top(5):
        assert f"<td>{row['label']}</td><td>{row['index']}</td><td>{100 * row['prob']:.1f} %</td>" in page
    [data] = re.findall(r'src="data:image/jpeg;base64,([^"]+)"', page)
    shown = np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB"))
    maps = tiny.maps()
    enlarged = legible(tiny.result.rgb)  # the 32-px crop, each pixel a 4x4 block
    assert enlarged.shape == (128, 128, 3)
    np.testing.assert_array_equal(enlarged[::4, ::4], tiny.result.rgb)
    expected = maps_panel(enlarged, {PASS_MAPS[k][0] if k in PASS_MAPS else k: v for k, v in maps.items()},
                          relu_names=(PASS_MAPS["gradcam"][0],),
                          units=dict(PASS_MAPS.values()) | {k: get(k).unit for k in maps if k not in PASS_MAPS})
    assert shown.shape == expected.shape
    assert np.abs(shown.astype(int) - expected).mean() < 4  # the JPEG preview of the same picture


def test_a_prompt_is_named_in_every_title_and_relevance_is_in_cosine_units(picture):
    pytest.importorskip("open_clip")
    from support.clip import clip_handle

    prompted = vi.analyze(picture, model=clip_handle(seed=2), target="a photo of a cat", contrast="a photo of a dog")
    assert prompted.title().endswith("prompt 'a photo of a cat' versus prompt 'a photo of a dog'")
    assert prompted.record()["target"] == {"prompt": "a photo of a cat"}
    fig = prompted.show("legrad")
    assert "prompt 'a photo of a cat'" in fig._suptitle.get_text()
    assert any(ax.get_ylabel() == "relevance (cosine units)" for ax in fig.axes)  # the colour bar's unit
    units = [ax.get_ylabel() for ax in prompted.show_all().axes if not ax.images]
    assert units.count("relevance (cosine units)") == 3 and "relevance (logit units)" not in units
    assert "prompt &#x27;a photo of a cat&#x27;" in prompted._repr_html_()


def test_record_and_npz_are_the_command_lines_record(tiny, tmp_path):
    record = tiny.record()
    pass_record = analysis_record(tiny.handle, tiny.result, tiny.image)
    assert record == method_record(tiny.handle, tiny.result, tiny.image)
    assert {k: record[k] for k in pass_record} == pass_record  # the registry's maps equal the pass's own keys
    path = tiny.to_npz(tmp_path / "r.npz")
    with np.load(path, allow_pickle=False) as saved:
        assert json.loads(str(saved["record"])) == json.loads(json.dumps(record))
        np.testing.assert_array_equal(saved["rollout"], tiny.result.rollout())
        np.testing.assert_allclose(saved["rollout"], record["rollout"], atol=5e-7)
        np.testing.assert_array_equal(saved["gradcam"], tiny.result.gradcam)
        np.testing.assert_array_equal(saved["attention"], tiny.result.attention_stack())
        np.testing.assert_array_equal(saved["probs"], tiny.result.probs)
        assert {"legrad", "attnlrp", "chefer", "mean_distance", "rgb"} <= set(saved.files)


def test_npz_makes_the_folder_it_is_written_into(tiny, tmp_path):
    path = tiny.to_npz(tmp_path / "out" / "runs" / "noise.npz")
    with np.load(path, allow_pickle=False) as saved:
        np.testing.assert_array_equal(saved["probs"], tiny.result.probs)


def test_npz_defaults_to_the_images_stem_in_the_current_folder(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert tiny.to_npz() == tmp_path.joinpath("noise.npz").relative_to(tmp_path)
    assert (tmp_path / "noise.npz").is_file()


def test_models_are_loaded_once_and_the_last_two_kept(monkeypatch, picture):
    loads = []

    def fake_load(name, weights=None, device=None, model_file=None):
        loads.append(name)
        return tiny_handle("cls", seed=len(loads))

    monkeypatch.setattr(api, "load_model", fake_load)
    api._model.cache_clear()
    try:
        first = vi.analyze(picture, model="a")
        again = vi.analyze(picture, model="a")
        assert loads == ["a"] and first.handle is again.handle
        vi.analyze(picture, model="b")
        vi.analyze(picture, model="c")
        vi.analyze(picture, model="a")
        assert loads == ["a", "b", "c", "a"]
    finally:
        api._model.cache_clear()


def test_figures_display_as_png_in_a_running_kernel(monkeypatch):
    pytest.importorskip("IPython")
    from IPython.core.formatters import DisplayFormatter

    import vit_inspect.notebook.display as display

    class Shell:
        display_formatter = DisplayFormatter()

    shell = Shell()
    png = shell.display_formatter.formatters["image/png"]
    fig = Figure()
    fig.add_subplot().plot([0, 1])
    assert png(fig) is None  # IPython alone shows a Figure as text
    monkeypatch.setattr("IPython.get_ipython", lambda: shell)
    assert display.figures_inline() is True
    assert png(fig).startswith(b"\x89PNG")
    chosen = b"\x89PNG drawn by the user's own formatter"
    png.for_type(Figure, lambda f: chosen)  # a formatter the user set is kept
    display.figures_inline()
    assert png(fig) is chosen
    monkeypatch.setattr("IPython.get_ipython", lambda: None)
    assert display.figures_inline() is False


@pytest.fixture(scope="module")
def deit_path():
    if not DEIT_WEIGHTS.is_file():
        pytest.skip(f"real weights not found at {DEIT_WEIGHTS}")
    return DEIT_WEIGHTS


def test_the_cat_and_the_command_lines_record(deit_path, capsys):
    from vit_inspect.cli.main import main

    image = str(PHOTOS / "chelsea.png")
    r = vi.analyze(image, model="deit_tiny_patch16_224", weights=deit_path, device="cpu")
    assert {row["label"] for row in r.top(3)} >= {"Egyptian cat", "tabby, tabby cat"}
    assert main(["analyze", image, "--weights", str(deit_path), "--device", "cpu"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(r.record()))
