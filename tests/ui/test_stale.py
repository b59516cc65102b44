"""The one mechanism against stale results (`ui.stale`): what a result records, how the check decides, and
the check through the served app: scores, comparisons, downloads and head ablations of image 1 are cleared,
with a sentence, once image 2 (or another class) is shown."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from support.app import APP_MARKS, CHELSEA, analyze, dependency

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

from vit_inspect.ui.model_cache import CacheKey  # noqa: E402
from vit_inspect.ui.stale import KEEP, NOTE, Basis, Tracked, refresh  # noqa: E402

pytestmark = APP_MARKS
COFFEE = CHELSEA.with_name("coffee.png")
KEY = CacheKey("deit_tiny_patch16_224", None, "cpu")


def session(digest: str = "cat", target=(285, None), model: CacheKey = KEY):
    """What `Basis.of` reads of the page's session."""
    return SimpleNamespace(model=model, model_label="deit_tiny", digest=digest, image_words=f"{digest}.png (crop)",
                           target=target, target_words=lambda: f"class #{target[0]}")


def test_a_basis_is_compared_up_to_what_a_result_depends_on():
    cat, coffee, tabby = Basis.of(session(), KEY), Basis.of(session("coffee"), KEY), Basis.of(session(target=(281, None)), KEY)
    assert cat.key("model") == coffee.key("model") == tabby.key("model")
    assert cat.key("image") != coffee.key("image") and cat.key("image") == tabby.key("image")
    assert cat.key("class") != tabby.key("class")
    assert cat.changed(coffee, "class") == "the image or what the model sees of it changed"
    assert cat.changed(tabby, "class") == "the class to explain changed" and cat.changed(tabby, "image") == ""
    other = CacheKey("deit_small_patch16_224", None, "cpu")
    assert cat.changed(Basis.of(session(), other), "model") == "the model changed"
    assert Basis.of(session(), KEY, extra="B1").key("model") != Basis.of(session(), KEY, extra="B2").key("model")
    settings = Basis.of(session(), KEY, {"layer": 3})
    assert settings.key("class") == cat.key("class") and settings.key("options") != cat.key("options")
    assert Basis.of(None, KEY).image is None and Basis.of(None, KEY).model == KEY


def tracked(name: str, level: str = "class", **kwargs) -> Tracked:
    return Tracked(name, made_from=None, outputs=("figure", "note", "kept"), cleared=(None, NOTE, KEEP), level=level,
                   press="**Score**", **kwargs)


def test_the_check_keeps_clears_or_recomputes_each_result():
    results = (tracked("scores"), tracked("figures", "model", tab="Filters",
                                          recompute=lambda s, k, c: ("new basis", "fig", "", "x")))
    check = refresh(results)
    cat = Basis.of(session(), KEY)
    unchanged = check(session(), KEY, "Overview", cat, None, cat, None)
    assert all(type(v) is dict and v.get("__type__") == "update" for v in unchanged)  # all skipped
    updates = check(session("coffee"), KEY, "Overview", cat, None, cat, None)
    made_from, figure, note, kept = updates[:4]
    assert made_from is None and figure is None and kept.get("__type__") == "update"
    assert note == ("*Cleared: the image or what the model sees of it changed (these were for cat.png (crop)). "
                    "Press **Score** to compute them for coffee.png (crop), class #285.*")
    assert all(v.get("__type__") == "update" for v in updates[4:])  # the model-level result still holds
    other = CacheKey("deit_small_patch16_224", None, "cpu")
    shown = check(session(model=other), other, "Filters", cat, None, cat, None)
    assert shown[4:] == ["new basis", "fig", "", "x"]  # cheap and in view: recomputed
    hidden = check(session(model=other), other, "Overview", cat, None, cat, None)
    assert hidden[4] is None and "the model changed" in hidden[6]  # out of view: cleared, with a sentence
    gone = check(None, KEY, "Overview", cat, None, None, None)
    assert gone[0] is None and gone[2].endswith("to compute them once an image is analysed.*")


def test_a_result_with_its_own_input_and_a_reset():
    result = tracked("compare", extra="key_b", reset=lambda value, s: "kept means")
    check = refresh((result,))
    made = Basis.of(session(), KEY, extra="B1")
    assert check(session(), KEY, "", made, "B1")[0].get("__type__") == "update"
    updates = check(session(), KEY, "", made, "B2")
    assert updates[0] == "kept means" and "the model changed" in updates[2]


def test_an_output_may_word_its_own_sentence():
    """The Heads section's two lines: each names its own button, or says nothing was there to clear."""
    from vit_inspect.ui.tabs.heads import NOT_RANKED, HeadsState, cleared_ablation, cleared_ranking

    result = Tracked("heads", made_from=None, outputs=("effect", "top", "ranking"),
                     cleared=(cleared_ablation, None, cleared_ranking), level="class", press="(both buttons)")
    cat = Basis.of(session(), KEY)
    ablated = HeadsState(key=("cat",), ablated_words="ablated: heads 0:0, mode zero", basis=cat)
    effect, top, ranking = refresh((result,))(session("coffee"), KEY, "Overview", ablated, None)[1:]
    assert effect == ("*Cleared: the image or what the model sees of it changed (these were for cat.png (crop)). "
                      "Press **Ablate these heads** to compute them for coffee.png (crop), class #285.*")
    assert top is None and ranking == NOT_RANKED  # nothing was ranked: nothing cleared, and what to press
    ranked = HeadsState(key=("cat",), importance_words="mode zero", basis=cat)
    effect, _, ranking = refresh((result,))(session("coffee"), KEY, "Overview", ranked, None)[1:]
    assert "Not ablated yet" in effect and "Press **Rank every head** to compute them for coffee.png" in ranking


def outputs(client: Client, api_name: str, **controls) -> dict:
    """An event's outputs (states left out, as gradio_client gives them) by component id."""
    dep = dependency(client, api_name)
    kinds = {c["id"]: c["type"] for c in client.config["components"]}
    shown = [i for i in dep["outputs"] if kinds[i] != "state"]
    return dict(zip(shown, client.predict(**controls, api_name=f"/{api_name}"), strict=True))


def elem(client: Client, elem_id: str) -> int:
    return next(c["id"] for c in client.config["components"] if c.get("props", {}).get("elem_id") == elem_id)


@pytest.mark.slow
def test_a_new_image_clears_what_the_old_one_was_scored_and_compared_with(client):
    analyze(client)
    table = client.predict(api_name="/faithfulness")[1]
    assert table["data"] and "Egyptian cat" in client.predict(api_name="/faithfulness")[2]
    client.predict("deit_tiny_patch16_224", None, api_name="/compare_load_model")
    compared = client.predict(handle_file(str(CHELSEA)), "", 0.6, False, 0.5, "the same class for both",
                              api_name="/compare_models")
    assert "Both models explain the same class" in compared[1] and "Egyptian cat (#285)" in compared[1]
    files, note = client.predict(api_name="/downloads")
    assert note.startswith("Prepared for chelsea.png")
    client.predict("0:0", "zero", [], api_name="/ablate_heads")

    analyze(client, COFFEE)  # image 2; the page then runs the check
    cleared = outputs(client, "stale_check_image")
    for elem_id in ("faithfulness-note", "compare-note", "downloads-note", "ablate-effect"):
        sentence = cleared[elem(client, elem_id)]
        assert sentence.startswith("*Cleared: the image or what the model sees of it changed (these were for "
                                   "chelsea.png"), (elem_id, sentence)
        assert "Egyptian cat" not in sentence and "coffee.png" in sentence and "espresso" in sentence, sentence
    for elem_id in ("faithfulness-curves", "compare-maps-ab", "download-files", "ablated-attention"):
        assert cleared[elem(client, elem_id)] is None, elem_id
    assert not cleared[elem(client, "compare-top-a")]  # a label cleared: no classes (gradio_client gives {})
    for elem_id in ("faithfulness-table", "compare-table", "ablate-top"):  # a table cleared keeps its headers
        assert cleared[elem(client, elem_id)]["data"] == [], elem_id
    verdicts = [cleared[elem(client, f"verdict-{name}")] for name in ("attention", "rollout", "chefer")]
    assert all("not scored yet" in v for v in verdicts)
    again = outputs(client, "stale_check_image")  # nothing left to clear: every output left as it is
    assert all(value == {"__type__": "update"} for value in again.values())


@pytest.mark.slow
def test_another_class_clears_the_scores_and_changed_settings_clear_the_downloads(client):
    analyze(client)
    client.predict(api_name="/faithfulness")
    client.predict("281", "", api_name="/set_target")
    cleared = outputs(client, "stale_check_class")
    assert "the class to explain changed" in cleared[elem(client, "faithfulness-note")]
    client.predict(layer=4, api_name="/downloads")
    kept = outputs(client, "stale_check_settings", layer=4)  # the settings the files were made with: left alone
    assert kept[elem(client, "downloads-note")] == kept[elem(client, "download-files")] == {"__type__": "update"}
    changed = outputs(client, "stale_check_settings", layer=5)
    assert changed[elem(client, "download-files")] is None
    assert "the settings changed" in changed[elem(client, "downloads-note")]


@pytest.mark.slow
def test_a_result_is_checked_again_once_written(client):
    """Downloads pressed while image 2's pass runs read image 1's session and may be written after image 2's own
    check; the page checks every costly result once more when its record changes (whichever of the two ends
    last, the check after it sees both). Here: the wiring, and that check clearing a result of another image."""
    states = {c["id"] for c in client.config["components"] if c["type"] == "state"}
    by_image = dependency(client, "stale_check_image")
    made_from = {i for i in by_image["outputs"] if i in states and i in by_image["inputs"]}
    after = dependency(client, "stale_check_result")
    assert {(i, "change") for i in made_from} == {tuple(t) for t in after["targets"]} and len(made_from) == 15
    # faithfulness, sanity, compare, heads, model, dataset_distance, downloads, the Features view's SAE, codes,
    # edit and explained feature, and the concepts, similarity, class concepts and their heatmaps (`demo.build_demo`)
    assert after["trigger_mode"] == "always_last"  # a record written during a check is checked again, not dropped
    analyze(client, COFFEE)
    files, note = client.predict(api_name="/downloads")
    assert note.startswith("Prepared for coffee.png") and files
    analyze(client)  # another image in the session, and no check run yet
    cleared = outputs(client, "stale_check_result")
    assert cleared[elem(client, "download-files")] is None
    assert cleared[elem(client, "downloads-note")].startswith("*Cleared: the image or what the model sees of it "
                                                              "changed (these were for coffee.png")


@pytest.mark.slow
def test_a_new_image_clears_the_sanity_checks_and_their_verdict_column(client):
    analyze(client)
    client.predict(api_name="/faithfulness")
    client.predict(api_name="/sanity_checks")
    analyze(client, COFFEE)
    cleared = outputs(client, "stale_check_image")
    sentence = cleared[elem(client, "sanity-note")]
    assert sentence.startswith("*Cleared: the image or what the model sees of it changed (these were for "
                               "chelsea.png") and "**Run the sanity checks**" in sentence and "espresso" in sentence
    assert cleared[elem(client, "sanity-strip")] is None and cleared[elem(client, "sanity-curves")] is None
    assert cleared[elem(client, "sanity-table")]["data"] == []
    assert cleared[elem(client, "faithfulness-table")]["data"] == []  # the verdict column goes with its table
