"""Where the score floors of the fine-tuning tests come from: the same generated files, learnt by
an independent model (scikit-learn's linear models, scored with scikit-learn's and seqeval's
metrics, not bertkit's).

A floor such as `results["dev"]["accuracy"] >= 0.9` (tests/tasks/test_text_classification.py)
was first read off bertkit's own seeds. Each test here shows the data it is applied to is learnt
well above it by a model that shares no code with bertkit, so a floor is a margin below what
the data allows, not a figure fitted to our runs: a bertkit that learns nothing fails it, one
that learns what a bag of words learns passes it.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import scored_rows, tagged_sentences, topic_rows

sklearn = pytest.importorskip("sklearn")
from sklearn.feature_extraction import DictVectorizer  # noqa: E402
from sklearn.feature_extraction.text import CountVectorizer  # noqa: E402
from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: E402
from sklearn.metrics import accuracy_score, f1_score  # noqa: E402
from sklearn.multiclass import OneVsRestClassifier  # noqa: E402
from sklearn.preprocessing import MultiLabelBinarizer  # noqa: E402


def _words(texts):
    vectorizer = CountVectorizer(token_pattern=r"[^ ]+")
    return vectorizer, vectorizer.fit_transform(texts)


def test_the_single_label_floor_is_below_a_bag_of_words():
    # floor 0.9: test_text_classification.py's end to end, test_named.py
    train, dev = topic_rows(160, seed=0), topic_rows(48, seed=1)
    vectorizer, x = _words([r["headline"] for r in train])
    model = LogisticRegression(max_iter=1000).fit(x, [r["topic"] for r in train])
    guess = model.predict(vectorizer.transform([r["headline"] for r in dev]))
    assert accuracy_score([r["topic"] for r in dev], guess) >= 0.97


def test_the_multi_label_floor_is_below_a_bag_of_words():
    # floor 0.85 micro-F1 on a test split: test_multi_label_thresholds_chosen_on_validation
    train, dev = topic_rows(200, seed=0, topics=2), topic_rows(48, seed=2, topics=2)
    labels = MultiLabelBinarizer().fit([r["topic"] for r in train])
    vectorizer, x = _words([r["headline"] for r in train])
    model = OneVsRestClassifier(LogisticRegression(max_iter=1000))
    model.fit(x, labels.transform([r["topic"] for r in train]))
    guess = model.predict(vectorizer.transform([r["headline"] for r in dev]))
    assert f1_score(labels.transform([r["topic"] for r in dev]), guess, average="micro") >= 0.95


def test_the_regression_floor_is_below_a_count_of_words():
    # floor Pearson 0.8: test_text_classification.py's regression
    train, dev = scored_rows()
    vectorizer, x = _words([r["text"] for r in train])
    model = LinearRegression().fit(x, [r["label"] for r in train])
    guess = model.predict(vectorizer.transform([r["text"] for r in dev]))
    assert np.corrcoef(guess, [r["label"] for r in dev])[0, 1] >= 0.99


def test_the_tagging_floor_is_below_a_word_by_word_classifier():
    # floor entity F1 0.85: test_token_classification.py (CoNLL files, JSON lines, a dataset)
    seqeval = pytest.importorskip("seqeval.metrics")
    train, dev = tagged_sentences(400, 0), tagged_sentences(40, 1)

    def features(words):  # the word and the one before it (I- after an entity word)
        return [{"w": w, "prev": words[i - 1] if i else "<s>"} for i, w in enumerate(words)]

    vectorizer = DictVectorizer()
    x = vectorizer.fit_transform([f for words, _ in train for f in features(words)])
    model = LogisticRegression(max_iter=2000).fit(x, [t for _, tags in train for t in tags])
    guesses = [list(model.predict(vectorizer.transform(features(words)))) for words, _ in dev]
    assert seqeval.f1_score([tags for _, tags in dev], guesses) >= 0.95
