"""Prompts are untrusted text: bounded, refused with a sentence; the zero-shot head by hand."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vit_inspect.core.errors import InputError
from vit_inspect.core.prompts import (MAX_PROMPT_CHARS, Prompt, UnitNormalize, ZeroShotHead, as_prompt, check_labels,
                                      check_prompt, label_embeddings)


@pytest.mark.parametrize("text, says", [
    ("", "empty"), ("   \n ", "empty"), ("x" * 100_000, "100,000 characters"), ("a\x00cat", "U+0000"),
    ("a cat\x1b[31m", "U+001B"), ("a\u200bcat", "U+200B"), ("tab\there", "U+0009"), (b"bytes", "must be text"),
    (None, "must be text"),
])
def test_a_hostile_prompt_gets_a_sentence(text, says):
    with pytest.raises(InputError) as caught:
        check_prompt(text)
    assert says in caught.value.public and len(caught.value.public) < 200


def test_a_plain_prompt_is_kept_stripped():
    assert check_prompt("  a photo of a cat ") == "a photo of a cat"
    assert check_prompt("ein Foto einer Katze, 猫の写真") == "ein Foto einer Katze, 猫の写真"
    assert len(check_prompt("y" * MAX_PROMPT_CHARS)) == MAX_PROMPT_CHARS


def test_labels_and_templates_are_checked():
    assert check_labels(["cat", " dog "], ["a photo of a {}."]) == (("cat", "dog"), ("a photo of a {}.",))
    for labels, templates, says in ([[], ["{}"], "empty"], [["cat"], ["a photo"], "exactly once"],
                                    [["cat"], ["{} {}"], "exactly once"], [["cat\x07"], ["{}"], r"U\+0007"],
                                    [["c" * 290], ["a photo of a {}."], "characters"]):
        with pytest.raises(InputError, match=says):
            check_labels(labels, templates)


def test_given_label_embeddings_are_all_or_none():
    names, rows = label_embeddings([Prompt("a", np.array([1.0, 0.0])), Prompt("b", np.array([0.0, 2.0]))])
    assert names == ("a", "b") and rows.shape == (2, 2)
    assert label_embeddings(["a", "b"]) == (("a", "b"), None)
    with pytest.raises(InputError, match="not a mix"):
        label_embeddings([Prompt("a", np.array([1.0])), "b"])
    with pytest.raises(InputError, match="finite"):
        as_prompt(Prompt("a", np.array([np.nan, 1.0])))


def test_zero_shot_head_by_hand():
    # f = (3, 4): unit f = (0.6, 0.8); t_0 = (1, 0) -> cos 0.6, t_1 = (0, 5) -> unit (0, 1), cos 0.8
    head = ZeroShotHead(lambda: torch.tensor([[1.0, 0.0], [0.0, 5.0]]), scale=10.0, bias=-1.0)
    logits = head(torch.tensor([[3.0, 4.0]]))
    torch.testing.assert_close(logits, torch.tensor([[5.0, 7.0]]))  # 10·cos - 1
    torch.testing.assert_close(head.cosine(logits), torch.tensor([[0.6, 0.8]]))
    torch.testing.assert_close(UnitNormalize()(torch.tensor([[0.0, -2.0]])), torch.tensor([[0.0, -1.0]]))
