"""The official metrics (bertkit.tasks.metrics) against sklearn, scipy, seqeval and by hand."""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy import stats
from seqeval.metrics import classification_report as seqeval_report
from seqeval.metrics import f1_score as seqeval_f1
from seqeval.metrics import precision_score as seqeval_precision
from seqeval.metrics import recall_score as seqeval_recall
from sklearn import metrics as sk

from bertkit.tasks import metrics
from bertkit.tasks.ner import to_iob2


def test_classification_by_hand():
    assert metrics.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    # tp=2 fp=1 fn=1 -> 2*2 / (4 + 1 + 1)
    assert metrics.f1_binary([1, 1, 1, 0], [1, 1, 0, 1]) == pytest.approx(4 / 6)
    assert metrics.f1_binary([0, 0], [1, 0]) == 0.0  # nothing predicted positive
    # tp=1 tn=2 fp=1 fn=0: (1*2 - 1*0) / sqrt(2*1*3*2)
    assert metrics.matthews_corrcoef([1, 0, 1, 0], [1, 0, 0, 0]) == pytest.approx(2 / 12**0.5)
    assert metrics.matthews_corrcoef([1, 1, 1], [1, 0, 1]) == 0.0  # constant predictions
    assert metrics.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert metrics.spearman([1, 2, 3, 4], [10, 20, 20, 5]) == pytest.approx(
        stats.spearmanr([1, 2, 3, 4], [10, 20, 20, 5]).statistic
    )
    with pytest.raises(ValueError, match="2 predictions for 3 labels"):
        metrics.accuracy([1, 0], [1, 0, 1])


@pytest.mark.parametrize("seed", range(5))
def test_classification_against_sklearn_and_scipy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 300))
    labels = rng.integers(0, 2, n)
    predictions = np.where(rng.random(n) < 0.7, labels, 1 - labels)
    assert metrics.accuracy(predictions, labels) == pytest.approx(
        sk.accuracy_score(labels, predictions)
    )
    assert metrics.f1_binary(predictions, labels) == pytest.approx(sk.f1_score(labels, predictions))
    assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(
        sk.matthews_corrcoef(labels, predictions)
    )
    three = rng.integers(0, 3, n), rng.integers(0, 3, n)  # the multi-class form too
    assert metrics.matthews_corrcoef(*three) == pytest.approx(
        sk.matthews_corrcoef(three[1], three[0])
    )
    scores = rng.integers(0, 26, n) / 5  # STS-B-like scores with many ties
    guesses = scores + rng.normal(0, 1, n)
    assert metrics.pearson(guesses, scores) == pytest.approx(stats.pearsonr(guesses, scores)[0])
    assert metrics.spearman(guesses, scores) == pytest.approx(stats.spearmanr(guesses, scores)[0])
    assert metrics.spearman(np.round(guesses), scores) == pytest.approx(
        stats.spearmanr(np.round(guesses), scores)[0]
    )


def test_squad_normalisation_cases_of_the_official_script():
    # lower case, punctuation and the articles a/an/the removed, whitespace collapsed
    assert metrics.normalize_answer("The Denver Broncos") == "denver broncos"
    assert metrics.normalize_answer("  an   Apple, a day!") == "apple day"
    assert metrics.normalize_answer("theatre") == "theatre"  # only whole-word articles
    assert metrics.normalize_answer("U.S.") == "us"
    assert metrics.normalize_answer("Saint-Denis") == "saintdenis"  # punctuation is deleted
    assert metrics.squad_exact("the Broncos.", "Broncos") == 1
    # F1 on tokens: pred "denver broncos win", gold "broncos" -> p=1/3 r=1 f1=0.5
    assert metrics.squad_f1("Denver Broncos win", "the Broncos") == pytest.approx(0.5)
    assert metrics.squad_f1("", "") == 1.0  # v2.0: no answer predicted for no answer
    assert metrics.squad_f1("", "Broncos") == 0.0
    assert metrics.squad_f1("", "", version=1) == 0.0  # v1.1: an empty side is always 0


def _dataset(questions):
    return [
        {
            "title": "t",
            "paragraphs": [
                {
                    "context": "c",
                    "qas": [
                        {
                            "id": qid,
                            "answers": [{"text": a, "answer_start": 0} for a in answers],
                            **({"is_impossible": True} if not answers else {}),
                        }
                        for qid, answers in questions
                    ],
                }
            ],
        }
    ]


def test_squad_v1_max_over_gold_and_missing_predictions():
    dataset = _dataset([("q1", ["Denver Broncos", "Broncos"]), ("q2", ["1990"]), ("q3", ["x"])])
    result = metrics.squad_v1(dataset, {"q1": "the broncos", "q2": "in 1990 or so"})
    # q1 exact via the second answer; q2 f1 = 2*(1/4*1)/(1/4+1) = 0.4; q3 missing -> 0
    assert result["exact_match"] == pytest.approx(100 / 3)
    assert result["f1"] == pytest.approx(100 * (1 + 0.4) / 3)


def test_squad_v2_thresholds_and_splits():
    dataset = _dataset([("a", ["Paris"]), ("b", []), ("c", ["blue sky"]), ("d", [])])
    predictions = {"a": "Paris", "b": "London", "c": "sky", "d": "Rome"}
    odds = {"a": -3.0, "b": 2.0, "c": 1.0, "d": -1.0}
    result = metrics.squad_v2(dataset, predictions, odds, threshold=0.0)
    # no-answer where odds > 0: b and c; b right, c wrong (has an answer); d answered -> wrong
    assert result["exact"] == pytest.approx(100 * (1 + 1 + 0 + 0) / 4)
    assert result["HasAns_exact"] == pytest.approx(50.0)
    assert result["NoAns_exact"] == pytest.approx(50.0)
    assert result["HasAns_total"] == 2 and result["NoAns_total"] == 2
    # sweep (sorted odds a, d, c, b): start 2 (both NoAns right); +a=3; d answered -1 -> 2;
    # c f1 2/3 -> 2.67; b answered -> 1.67. Best 3 after a, threshold -3.0.
    assert result["best_exact"] == pytest.approx(75.0)
    assert result["best_exact_thresh"] == -3.0
    assert result["best_f1"] == pytest.approx(75.0)


def test_entities_read_iob1_iob2_and_iobes_like_conlleval():
    assert metrics.entities(["B-PER", "I-PER", "O", "I-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    iob1 = ["I-LOC", "B-LOC", "O", "I-PER", "I-PER", "I-ORG"]
    iob2 = ["B-LOC", "B-LOC", "O", "B-PER", "I-PER", "B-ORG"]
    iobes = ["S-LOC", "S-LOC", "O", "B-PER", "E-PER", "S-ORG"]
    expected = [("LOC", 0, 0), ("LOC", 1, 1), ("PER", 3, 4), ("ORG", 5, 5)]
    assert metrics.entities(iob1) == metrics.entities(iob2) == metrics.entities(iobes) == expected
    assert to_iob2(iob1) == iob2
    with pytest.raises(ValueError, match="not O or B-"):
        metrics.entities(["X-PER"])


def _random_tags(rng: random.Random, n: int) -> list[str]:
    tags = []
    for _ in range(n):
        r = rng.random()
        kind = rng.choice(["PER", "LOC", "ORG", "MISC"])
        tags.append("O" if r < 0.5 else ("B-" if r < 0.75 else "I-") + kind)
    return tags


@pytest.mark.parametrize("seed", range(5))
def test_entity_f1_against_seqeval(seed):
    rng = random.Random(seed)
    gold = [_random_tags(rng, rng.randint(1, 25)) for _ in range(40)]
    predicted = [
        [t if rng.random() < 0.8 else rng.choice(["O", "B-PER", "I-LOC", "I-ORG"]) for t in s]
        for s in gold
    ]
    ours = metrics.entity_scores(predicted, gold)
    assert ours["f1"] == pytest.approx(seqeval_f1(gold, predicted))
    assert ours["precision"] == pytest.approx(seqeval_precision(gold, predicted))
    assert ours["recall"] == pytest.approx(seqeval_recall(gold, predicted))
    report = seqeval_report(gold, predicted, output_dict=True)
    for kind in ("PER", "LOC", "ORG", "MISC"):
        if kind in report:
            assert ours[f"f1_{kind}"] == pytest.approx(report[kind]["f1-score"])


def test_entity_scores_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "B-MISC"]]
    result = metrics.entity_scores(predicted, gold)
    # found 4 (PER, ORG, ORG, MISC), gold 3 (PER, LOC, ORG), correct 2 (PER, second ORG)
    assert result["precision"] == pytest.approx(2 / 4)
    assert result["recall"] == pytest.approx(2 / 3)
    assert result["f1"] == pytest.approx(2 * (1 / 2) * (2 / 3) / (1 / 2 + 2 / 3))
    assert result["accuracy"] == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match="sentence 0: 1 predicted tags for 2 tokens"):
        metrics.entity_scores([["O"]], [["O", "O"]])
