"""The Concepts and Patch similarity tabs: their handlers on a tiny random ViT against the library's own answers
(`passes.concepts`), clicks, hostile values, the stale-result redraw, and a second image kept in the store."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image
from support import tiny_handle

gr = pytest.importorskip("gradio")
from vit_inspect.core.geometry import InputGeometry  # noqa: E402
from vit_inspect.core.images import load_image  # noqa: E402
from vit_inspect.passes.concepts import image_concepts, patch_similarity  # noqa: E402
from vit_inspect.passes.pipeline import analyze_image  # noqa: E402
from vit_inspect.studies.class_concepts import class_concept_heatmaps, class_concepts  # noqa: E402
from vit_inspect.ui.config import AppConfig  # noqa: E402
from vit_inspect.ui.inputs import EXAMPLE_PATHS  # noqa: E402
from vit_inspect.ui.inspector import Inspector, Session  # noqa: E402
from vit_inspect.ui.model_cache import ModelCache  # noqa: E402
from vit_inspect.ui.panels import main_scale  # noqa: E402
from vit_inspect.ui.stale import Basis  # noqa: E402
from vit_inspect.ui.tabs.concepts import LABEL as CONCEPTS  # noqa: E402
from vit_inspect.ui.tabs.concepts import ConceptsTab  # noqa: E402
from vit_inspect.ui.tabs.similarity import LABEL as SIMILARITY  # noqa: E402
from vit_inspect.ui.tabs.similarity import Other, SimilarityTab  # noqa: E402


def progress(*args, **kwargs):
    return None


def noise(seed: int, size=(48, 40)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def page():
    """(Inspector, its tiny handle, a Session on a noise picture)."""
    handle = tiny_handle("cls")
    inspector = Inspector(AppConfig(device="cpu"), ModelCache(loader=lambda *a, **k: handle))
    picture = noise(0)
    result = inspector._pass(handle, picture, InputGeometry())
    session = Session(model=inspector.default_key, source=picture, name="noise.png", target=(result.target, None),
                      slot=inspector.store.put({(result.target, None): result}, result.nbytes()), distance=None,
                      labels=handle.labels, model_label="tiny (random)", digest="noise", image_words="noise.png")
    return inspector, handle, session


def test_the_concepts_are_the_librarys_for_the_same_block_and_k(page):
    inspector, handle, session = page
    tab = ConceptsTab(inspector)
    shown = tab.concepts(session, 0, 3)
    expected = image_concepts(handle, session.result, 3, 0, seed=0)
    np.testing.assert_array_equal(shown.heatmaps, expected.heatmaps)
    np.testing.assert_array_equal(shown.areas, expected.areas)
    np.testing.assert_array_equal(shown.logits, expected.logits)
    basis, picture, note, slider = tab.draw(session, None, 0, 3, progress=progress)
    assert basis == Basis.of(session, session.model) and picture.ndim == 3 and picture.dtype == np.uint8
    assert note.startswith("3 concepts of noise.png at the output of block 0 (seed 0)")
    assert slider["maximum"] == handle.depth - 1 and slider["value"] == 0


def test_concept_controls_out_of_range_are_clamped_and_nonsense_is_a_sentence(page):
    inspector, handle, session = page
    tab = ConceptsTab(inspector)
    assert tab.concepts(session, 99, 99).layer == handle.depth - 1  # clamped to the model
    assert tab.concepts(session, -5, 0).k == 1
    most = min(20, session.result.layout.num_patches, handle.embed_dim)
    assert tab.concepts(session, 1, 1e308).k == most  # 16 patches of the 4×4 grid
    for block, k, words in (("abc", 2, "The block must be a number"), (1, float("nan"), "not NaN")):
        with pytest.raises(gr.Error) as error:
            tab.draw(session, None, block, k, progress=progress)
        assert words in error.value.message
    with pytest.raises(gr.Error) as error:
        tab.draw(None, None, 1, 2, progress=progress)
    assert error.value.message == "Analyse an image first; its concepts are found in its own tokens."


def test_concepts_redraw_after_a_check_only_when_shown_and_drawn_for_something_else(page):
    inspector, _, session = page
    tab = ConceptsTab(inspector)
    basis, *_ = tab.draw(session, None, 1, 2, progress=progress)
    skipped = tab.draw_if_shown(session, None, CONCEPTS, 1, 2, basis, progress=progress)
    assert all(isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1
               for value in skipped)  # gr.skip(): drawn for this page already
    assert tab.draw_if_shown(session, None, "Attention", 1, 2, None, progress=progress) == skipped  # not in view
    stale = Basis(model=session.model, image="another picture")
    assert tab.draw_if_shown(session, None, CONCEPTS, 1, 2, stale, progress=progress)[0] == basis


def test_a_patch_is_similar_to_itself_and_the_second_image_map_is_the_librarys(page):
    inspector, handle, session = page
    tab = SimilarityTab(inspector)
    other = Other(noise(1, (40, 56)), "other.png", inspector.store.put({}, 0))
    found = tab.similarity(session, other, 1, 2, 3)
    assert found.patch == (2, 3) and found.layer == 1
    assert found.own[2, 3] == pytest.approx(1.0)
    second = analyze_image(handle, noise(1, (40, 56)), gradients=False, relevance=False)
    own, theirs = patch_similarity(handle, session.result, (2, 3), 1, second)
    np.testing.assert_allclose(found.own, own)
    np.testing.assert_allclose(found.other, theirs)
    assert other.slot.get()[(session.model, session.geometry)] is found.other_result  # kept, not run again
    assert tab.similarity(session, other, 1, 0, 0).other_result is found.other_result
    basis, own_map, other_map, note, row, col, kept = tab.draw(session, None, other, 1, 2, 3, progress=progress)
    assert (row, col, kept) == (2, 3, other) and other_map is not None
    assert note.startswith("Patch (row 2, column 3) of noise.png at block 1: similarity 1 on itself")
    without = tab.draw(session, None, None, 1, 2, 3, progress=progress)
    assert without[2] is None


def test_a_click_on_the_map_picks_its_patch_and_the_colour_bar_does_nothing(page):
    inspector, _, session = page
    tab = SimilarityTab(inspector)
    scale = main_scale(session.result)
    layout = session.result.layout
    x, y = (3 * layout.patch_w + 1) * scale, (1 * layout.patch_h + 2) * scale  # patch (1, 3)
    drawn = tab.pick(gr.SelectData(None, {"index": [x, y], "value": None}), session, None, None, 0,
                     progress=progress)
    assert drawn[4:6] == (1, 3)
    beside = tab.pick(gr.SelectData(None, {"index": [layout.input_size[1] * scale + 5, 3], "value": None}),
                      session, None, None, 0, progress=progress)
    assert all(value.get("__type__") == "update" for value in beside)
    for index in ([float("nan"), 3], ["x", 1], [1]):
        with pytest.raises(gr.Error) as error:
            tab.pick(gr.SelectData(None, {"index": index, "value": None}), session, None, None, 0, progress=progress)
        assert len(error.value.message.split()) >= 5


def test_opening_the_tab_draws_only_when_no_map_of_this_image_is_shown(page):
    """Opening the tab sends the row and column the browser had then, and runs after a click on the map that came
    meanwhile: it keeps the clicked patch's maps rather than drawing the old patch over them."""
    inspector, _, session = page
    tab = SimilarityTab(inspector)
    layout, scale = session.result.layout, main_scale(session.result)
    clicked = tab.pick(gr.SelectData(None, {"index": [(2 * layout.patch_w + 1) * scale, 1], "value": None}),
                       session, None, None, 0, progress=progress)
    assert clicked[3].startswith("Patch (row 0, column 2)")
    kept = tab.draw_on_open(session, None, None, 0, 1, 1, clicked[0], progress=progress)
    assert all(value.get("__type__") == "update" for value in kept)
    for made_from in (None, Basis(model=session.model, image="another picture")):
        drawn = tab.draw_on_open(session, None, None, 0, 1, 1, made_from, progress=progress)
        assert drawn[0] == clicked[0] and drawn[3].startswith("Patch (row 1, column 1)") and drawn[4:6] == (1, 1)


def test_similarity_redraws_after_a_check_only_when_shown_and_drawn_for_another_image(page):
    inspector, _, session = page
    tab = SimilarityTab(inspector)
    basis = tab.draw(session, None, None, 0, 1, 1, progress=progress)[0]
    assert all(v.get("__type__") == "update" for v in tab.draw_if_shown(session, None, SIMILARITY, None, 0, 1, 1,
                                                                          basis, progress=progress))
    stale = Basis(model=session.model, image="another picture")
    assert tab.draw_if_shown(session, None, SIMILARITY, None, 0, 1, 1, stale, progress=progress)[0] == basis


def test_class_concepts_are_the_librarys_and_map_on_the_image(page):
    inspector, handle, session = page
    tab = ConceptsTab(inspector)
    run, picture, note = tab.find_class_concepts(None, True, "3", 2, session, None, progress=progress)
    pictures = [load_image(path) for path in EXAMPLE_PATHS]
    expected = class_concepts(handle, pictures, 3, k=2)
    found = run.slot.get()
    np.testing.assert_allclose(found.importance, expected.importance)
    np.testing.assert_allclose(found.logit_drop, expected.logit_drop)
    assert run.basis.model == session.model and picture.dtype == np.uint8
    assert run.words.startswith(f"class {handle.label(3)!r} (#3), {len(EXAMPLE_PATHS)} images, block 0, k=2")
    assert note.startswith(f"2 concepts of {run.words}, ranked by importance")
    basis, maps, words = tab.map_class_concepts(run, session, None)
    assert basis == Basis.of(session, session.model) and maps.dtype == np.uint8
    assert words.startswith(f"The concepts of {run.words} on noise.png")
    heatmaps = class_concept_heatmaps(handle, found, load_image(session.source))
    assert heatmaps.shape == (2, 4, 4)  # the tiny model's 4×4 grid, one heatmap per concept


def test_class_concepts_refuse_too_few_images_hostile_values_and_stop_on_cancel(page):
    inspector, _, session = page
    tab = ConceptsTab(inspector)
    for files, examples, wanted, k, words in (
            (None, False, "3", 2, "Upload at least two images"),
            (None, True, "no such class at all", 2, "No class matches"),
            (None, True, "3", float("nan"), "not NaN"),
            (None, "yes", "3", 2, "must be true or false"),
            ([{"path": "/etc/passwd"}], False, "3", 2, "not available"),
            (None, True, ["3"], 2, "must be text")):
        with pytest.raises(gr.Error) as error:
            tab.find_class_concepts(files, examples, wanted, k, session, None, progress=progress)
        assert words in error.value.message, error.value.message
    request = SimpleNamespace(session_hash="one browser")
    assert tab.cancel(request) == "Nothing to cancel: no class concepts are being found for you."
    pressed = []

    def press_cancel(*args, **kwargs):  # the Cancel button, pressed as the run reports its first step
        pressed.append(tab.cancel(request))

    kept = tab.find_class_concepts(None, True, "3", 2, session, None, request=request, progress=press_cancel)
    assert kept[:2] == (gr.skip(), gr.skip())
    assert kept[2] == f"Class concepts were cancelled after 0 of {1 + len(EXAMPLE_PATHS)} steps. Nothing was changed."
    assert pressed[-1].startswith("Cancelling")
    with pytest.raises(gr.Error) as error:
        tab.map_class_concepts(None, session, None)
    assert "Find the class's concepts first" in error.value.message
