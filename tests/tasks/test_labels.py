"""Label columns of users' files (bertkit.tasks.labels): what problem they are, their label
set, thresholds and per-class figures (checked against scikit-learn)."""

from __future__ import annotations

import numpy as np
import pytest

from bertkit.tasks.labels import (
    LabelError,
    LabelSet,
    best_thresholds,
    infer_problem,
    multi_label_figures,
    parse_label,
    per_class,
    report_table,
    sorted_names,
)


def lines(values):
    return list(enumerate(values, start=2))


@pytest.mark.parametrize(
    ("values", "separator", "problem"),
    [
        (["sports", "tech", "sports"], None, "single-label"),
        (["1", "2", " 3 "], None, "single-label"),
        ([1, 2, 3], None, "single-label"),
        (["0.5", "4.25", "3"], None, "regression"),
        ([0.5, 1.0], None, "regression"),
        ([str(i) for i in range(40)], None, "regression"),  # many integers: scores
        ([["a", "b"], [], ["c"]], None, "multi-label"),
        (["a|b", "c", ""], "|", "multi-label"),
    ],
)
def test_problem_inferred(values, separator, problem):
    assert infer_problem(lines(values), separator)[0] == problem


def test_mixed_kinds_are_refused_with_a_line_of_each():
    with pytest.raises(
        LabelError, match=r"mixes words and numbers \(int on line 2, text on line 3\)"
    ):
        infer_problem(lines(["1", "positive", "2"]))
    with pytest.raises(LabelError, match=r"mixes lists"):
        infer_problem(lines([["a"], "b"]))
    with pytest.raises(LabelError, match="every label is empty"):
        infer_problem(lines(["", " "]))


def test_parse_and_order_labels():
    assert parse_label(" 03 ", "single-label") == "3"
    assert parse_label(True, "single-label") == "true"
    assert parse_label("a| b |a", "multi-label", "|") == ("a", "b")
    assert parse_label(["x", 2], "multi-label") == ("x", "2")
    assert parse_label("", "multi-label") == ()
    assert parse_label("2.5", "regression") == 2.5
    with pytest.raises(LabelError, match="not a number"):
        parse_label("high", "regression")
    with pytest.raises(LabelError, match="an empty label"):
        parse_label("", "single-label")
    assert sorted_names(["10", "2", "b", "a", "2"]) == ["2", "10", "a", "b"]
    labels = LabelSet.from_labels("multi-label", [("b",), ("a", "b"), ()])
    assert labels.names == ("a", "b") and labels.counts == {"a": 1, "b": 2}


def test_balanced_weights_are_scikit_learns():
    sklearn = pytest.importorskip("sklearn.utils.class_weight")
    gold = ["a"] * 6 + ["b"] * 3 + ["c"]
    labels = LabelSet.from_labels("single-label", gold)
    expected = sklearn.compute_class_weight("balanced", classes=np.array(["a", "b", "c"]), y=gold)
    assert labels.balanced_weights(len(gold)) == pytest.approx(expected)
    multi = LabelSet.from_labels("multi-label", [("a",), ("a", "b"), ("a",), ()])
    assert multi.balanced_weights(4) == pytest.approx([1 / 3, 3.0])  # negatives / positives


def test_per_class_figures_are_scikit_learns():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    gold, predicted = rng.integers(0, 4, 200), rng.integers(0, 4, 200)
    predicted[:50] = gold[:50]
    found = per_class(gold, predicted, ["a", "b", "c", "d"])
    p, r, f, s = metrics.precision_recall_fscore_support(gold, predicted, labels=[0, 1, 2, 3])
    table = found["per_class"]
    assert [table[n]["f1"] for n in "abcd"] == pytest.approx(f)
    assert [table[n]["precision"] for n in "abcd"] == pytest.approx(p)
    assert [table[n]["support"] for n in "abcd"] == list(s)
    assert found["macro_f1"] == pytest.approx(metrics.f1_score(gold, predicted, average="macro"))
    assert found["micro_f1"] == pytest.approx(metrics.f1_score(gold, predicted, average="micro"))
    assert found["confusion"] == metrics.confusion_matrix(gold, predicted).tolist()
    gold_sets, guessed = rng.random((100, 3)) < 0.4, rng.random((100, 3)) < 0.5
    multi = multi_label_figures(gold_sets, guessed, ["x", "y", "z"])
    assert multi["micro_f1"] == pytest.approx(metrics.f1_score(gold_sets, guessed, average="micro"))
    assert multi["macro_f1"] == pytest.approx(metrics.f1_score(gold_sets, guessed, average="macro"))
    assert multi["subset_accuracy"] == pytest.approx(metrics.accuracy_score(gold_sets, guessed))


def test_report_table_lists_classes_by_support_with_their_figures():
    found = per_class(np.array([0, 0, 0, 1, 2, 2]), np.array([0, 0, 1, 1, 2, 0]), ["a", "bb", "c"])
    found["per_class"]["c"]["threshold"] = 0.25
    lines = report_table(found).splitlines()
    assert lines[0].split() == ["label", "precision", "recall", "f1", "support"]
    assert [line.split()[0] for line in lines[1:]] == ["a", "c", "bb"]  # 3, 2, 1 gold rows
    assert lines[1].split()[1:] == ["0.667", "0.667", "0.667", "3"]
    assert lines[2].endswith("(threshold 0.25)")
    assert report_table(found, limit=1).splitlines()[-1] == "… 2 more in results.json"


def test_thresholds_reach_the_best_f1_of_any_cut():
    rng = np.random.default_rng(1)
    gold = rng.random((300, 4)) < np.array([0.1, 0.3, 0.5, 0.0])
    probabilities = np.clip(gold * 0.3 + rng.random((300, 4)) * 0.7, 0, 1)
    chosen = best_thresholds(probabilities, gold)
    assert chosen[3] == 0.5  # no positives: the default stays

    def f1(c, t):
        guess = probabilities[:, c] >= t
        tp = (guess & gold[:, c]).sum()
        return 2 * tp / (guess.sum() + gold[:, c].sum())

    for c in range(3):
        brute = max(f1(c, t) for t in np.unique(probabilities[:, c]))
        assert f1(c, chosen[c]) == pytest.approx(brute)
        assert not np.isin(chosen[c], probabilities[:, c])  # between two rows' values
