"""The method registry: the built-ins' entries, registration rules, entry-point plugins, and methods that fail."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from support import run_cli, tiny_handle

from vit_inspect.methods import Method, MethodContext, MethodFailure, compute_map, get, methods, plugin_failures
from vit_inspect.passes.pipeline import analyze_pixels
from vit_inspect.studies.faithfulness import faithfulness_methods, scored_maps
from vit_inspect.studies.sanity import SanitySettings, needs_relevance, sanity_check, sanity_methods

BUILT_IN = ("attention", "rollout", "gradcam", "gradcam_relu", "chefer", "legrad", "attnlrp", "gradient_rollout",
            "dff_concept")
GRID = (4, 4)  # the tiny "cls" model: 32 x 32 pixels in 8 x 8 patches


def constant(value):
    return lambda context: np.full(GRID, value)


def method(name: str, compute, **fields) -> Method:
    return Method(name=name, title=f"test {name}", unit="a.u.", paper="none", reads="attention", compute=compute,
                  **fields)


@pytest.fixture(scope="module")
def tiny():
    handle = tiny_handle("cls")
    pixels = handle.preprocess.normalize(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    return handle, pixels, analyze_pixels(handle, pixels, target=3)


def test_built_ins_keep_the_studies_lists_and_units():
    assert list(methods())[:len(BUILT_IN)] == list(BUILT_IN)
    assert {k: v for k, v in faithfulness_methods().items() if k in ("random", *BUILT_IN)} == {
        "random": "random map (the floor)",
        "attention": "raw attention, last layer, mean of heads",
        "rollout": "attention rollout (Abnar & Zuidema 2020), defaults",
        "gradcam": "Grad-CAM last block, signed",
        "gradcam_relu": "Grad-CAM last block, ReLU'd (as drawn)",
        "chefer": "gradient-weighted attention (Chefer et al. 2021)",
        "legrad": "LeGrad (Bousselham et al. 2025)",
        "attnlrp": "AttnLRP (Achtibat et al. 2024)",
        "dff_concept": "DFF concept with the largest class logit, last block, k 5"}
    assert [m for m in sanity_methods() if m in BUILT_IN] == [
        "attention", "rollout", "gradcam", "gradcam_relu", "chefer", "legrad", "attnlrp"]
    assert {n: get(n).unit for n in BUILT_IN} == {
        "attention": "attention weight (probability)", "rollout": "rollout weight (fraction)",
        "gradient_rollout": "rollout weight (fraction)", "gradcam": "activation × gradient",
        "gradcam_relu": "activation × gradient", "chefer": "relevance ({score} units)",
        "legrad": "relevance ({score} units)", "attnlrp": "relevance ({score} units)",
        "dff_concept": "NMF coefficient (token units over the concept's scale)"}
    assert [n for n in BUILT_IN if get(n).reads == "relevance"] == ["legrad", "attnlrp"]
    assert needs_relevance(("random", "gradcam")) is False and needs_relevance(("legrad",)) is True
    assert [n for n in BUILT_IN if get(n).relu] == ["gradcam"]
    assert [n for n in BUILT_IN if get(n).record] == ["rollout", "gradcam", "chefer", "legrad", "attnlrp"]


def test_built_in_maps_equal_the_pass(tiny):
    _, _, result = tiny
    context = MethodContext(result)
    expected = {"attention": result.attention_map(result.depth - 1), "rollout": result.rollout(),
                "gradcam": result.gradcam[-1], "gradcam_relu": np.maximum(result.gradcam[-1], 0.0),
                "chefer": result.chefer, "legrad": result.legrad, "attnlrp": result.attnlrp,
                "gradient_rollout": result.gradient_rollout()}
    for name, values in expected.items():
        np.testing.assert_array_equal(compute_map(get(name), context), values)


def test_registration_refuses_clashes_and_malformed_methods(registered):
    with pytest.raises(ValueError, match="'rollout' is already registered"):
        registered(method("rollout", constant(1.0)))
    with pytest.raises(ValueError, match="only a vit_inspect.methods.Method"):
        registered(object())
    with pytest.raises(ValueError, match="lower case"):
        method("Bad-Name", constant(1.0))
    with pytest.raises(ValueError, match="choose one of attention"):
        Method("odd", "t", "u", "p", "everything", constant(1.0))
    with pytest.raises(ValueError, match="exactly when it reads 'own passes'"):
        Method("dear", "t", "u", "p", "own passes", constant(1.0))
    with pytest.raises(ValueError, match="exactly when it reads 'own passes'"):
        Method("cheap", "t", "u", "p", "attention", constant(1.0), forwards=1)
    registered(method("ones", constant(1.0)))
    assert "ones" in methods() and "ones" in faithfulness_methods() and "ones" in sanity_methods()
    with pytest.raises(ValueError, match="unknown method 'nothing'"):
        get("nothing")


def test_plugins_load_once_and_failures_are_sentences(plugins, fake_entry_point):
    good = method("plugin_ones", constant(1.0))
    calls = []

    def load_good():
        calls.append(1)
        return good

    def broken():
        raise ImportError("No module named 'missing_dependency'")

    plugins(fake_entry_point("plugin_ones", "ones_plugin:METHOD", load_good),
            fake_entry_point("broken", "broken_plugin:METHOD", broken),
            fake_entry_point("clash", "clash_plugin:METHOD", lambda: method("gradcam", constant(0.0))),
            fake_entry_point("not_a_method", "odd_plugin:THING", lambda: "a string"))
    assert list(methods()) == [*BUILT_IN, "plugin_ones"]
    methods(), plugin_failures()
    assert calls == [1]  # loaded once, on the first read
    failures = {name: failure.public for name, failure in plugin_failures().items()}
    assert failures == {
        "broken": "The plugin 'broken_plugin:METHOD' failed to import: ImportError: No module named "
                  "'missing_dependency'",
        "clash": "The plugin 'clash_plugin:METHOD' was refused: a method named 'gradcam' is already registered "
                 "(Grad-CAM last block, signed).",
        "not_a_method": "The plugin 'odd_plugin:THING' was refused: only a vit_inspect.methods.Method can be "
                        "registered, got str."}
    assert get("gradcam").title == "Grad-CAM last block, signed"  # the built-in stays


def test_methods_cli_lists_methods_and_failed_plugins(plugins, fake_entry_point, capsys):
    def broken():
        raise RuntimeError("boom")

    plugins(fake_entry_point("broken", "broken_plugin:METHOD", broken))
    code, out, _ = run_cli(capsys, "methods", "--json")
    record = json.loads(out)
    assert code == 0 and list(record["methods"]) == list(BUILT_IN)
    assert record["methods"]["legrad"] | {"paper": None} == {
        "title": "LeGrad (Bousselham et al. 2025)", "paper": None, "unit": "relevance ({score} units)",
        "reads": "relevance", "forwards": 0, "backwards": 0, "cost": "none of its own: reads relevance from the one pass",
        "faithfulness": True, "sanity": True, "record": True, "signed": False, "relu": False, "cmap": "inferno",
        "time_limit_s": 60.0}
    assert record["failed_plugins"] == {"broken": "The plugin 'broken_plugin:METHOD' failed to import: "
                                                  "RuntimeError: boom"}
    code, out, _ = run_cli(capsys, "methods")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2 + len(BUILT_IN) + 1
    assert lines[2].startswith("| attention | raw attention, last layer, mean of heads | Vaswani")
    assert lines[-1] == "plugin broken not loaded: The plugin 'broken_plugin:METHOD' failed to import: RuntimeError: boom"


def bad_methods(release: threading.Event) -> dict[str, Method]:
    def raises(context):
        raise RuntimeError("/secret/path/model.py exploded")

    def blocks(context):
        release.wait()
        return np.ones(GRID)

    return {"raises": method("raises", raises), "wrong_shape": method("wrong_shape", lambda c: np.ones((3, 5))),
            "not_numbers": method("not_numbers", lambda c: {"a": 1}),
            "nan": method("nan", constant(np.nan)), "inf": method("inf", constant(-np.inf)),
            "slow": method("slow", blocks, time_limit=0.05)}


EXPECTED_FAILURES = {
    "raises": "raises raised RuntimeError.",
    "wrong_shape": "wrong_shape returned a map of shape (3, 5); the patch grid is (4, 4).",
    "not_numbers": "not_numbers returned dict, not an array of numbers.",
    "nan": "nan returned NaN or infinite values.", "inf": "inf returned NaN or infinite values.",
    "slow": "slow took longer than its limit of 0.05 s and was given up."}


def test_a_failing_method_gives_a_sentence_and_scores_leave_it_out(tiny, registered):
    handle, pixels, result = tiny
    release = threading.Event()
    try:
        for bad in bad_methods(release).values():
            registered(bad)
        outcomes = {name: compute_map(get(name), MethodContext(result)) for name in EXPECTED_FAILURES}
        assert {n: o.public for n, o in outcomes.items()} == EXPECTED_FAILURES
        assert all(isinstance(o, MethodFailure) for o in outcomes.values())
        assert outcomes["raises"].detail == "/secret/path/model.py exploded"  # for the operator, not the sentence
        names = ("random", "rollout", *EXPECTED_FAILURES, "gradcam")
        rng = np.random.default_rng(0)
        maps, failures = scored_maps(result, names, rng, handle, pixels)
        assert list(maps) == ["random", "rollout", "gradcam"]
        np.testing.assert_array_equal(maps["random"], np.random.default_rng(0).random(GRID))
        np.testing.assert_array_equal(maps["rollout"], result.rollout())
        assert {n: f.public for n, f in failures.items()} == EXPECTED_FAILURES
    finally:
        release.set()


def test_sanity_leaves_a_failing_method_out_with_its_reason(tiny, registered):
    handle, pixels, _ = tiny
    registered(method("wrong_shape", lambda c: np.ones((3, 5))))
    calls = []

    def fails_once_random(context):  # a map that breaks only on a randomised model
        calls.append(1)
        return np.ones(GRID) if len(calls) == 1 else np.full(GRID, np.nan)

    registered(method("breaks_later", fails_once_random))
    settings = SanitySettings(independent=False, robustness=None)
    result = sanity_check(handle, pixels, ("gradcam", "wrong_shape", "breaks_later"), target=3, settings=settings)
    assert list(result.cascading) == ["gradcam"] and list(result.random_logit) == ["gradcam"]
    assert result.record()["left_out"] == {
        "wrong_shape": "wrong_shape returned a map of shape (3, 5); the patch grid is (4, 4).",
        "breaks_later": "breaks_later returned NaN or infinite values."}
    alone = sanity_check(handle, pixels, ("gradcam",), target=3, settings=settings)
    assert result.record()["methods"] == alone.record()["methods"]  # the others are as without the bad ones


def test_a_result_made_from_another_does_not_inherit_its_kept_maps(tiny):
    """`compute_maps` keeps each map in the pass's result; a result made from it (LeGrad and AttnLRP added, or
    taken away) is another pass and computes its maps again."""
    import dataclasses

    from vit_inspect.methods import MethodContext, compute_maps

    _, _, result = tiny
    maps, _ = compute_maps(MethodContext(result), ("legrad",))
    assert "legrad" in result.method_maps and "legrad" in maps
    bare = dataclasses.replace(result, legrad=None, attnlrp=None)
    assert bare.method_maps == {} and compute_maps(MethodContext(bare), ("legrad",)) == ({}, {})
