"""The official metrics of the paper's tasks, in numpy and the standard library.

GLUE: accuracy, F1 of the positive class (MRPC, QQP), Matthews correlation (CoLA), Pearson and
Spearman correlation (STS-B). SQuAD: exact match and token F1 after the official answer
normalisation, the maximum over gold answers, and for v2.0 the HasAns/NoAns split and the best
no-answer threshold. CoNLL-2003: entity-level precision/recall/F1 with conlleval's chunk rules,
which read IOB1, IOB2 and IOBES alike. Scores are fractions in [0, 1] except SQuAD's, which the
official scripts report in percent.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Iterable, Mapping, Sequence

import numpy as np


# --------------------------------------------------------------------------- classification
def accuracy(predictions: Sequence, labels: Sequence) -> float:
    """accuracy([1, 0, 1], [1, 1, 1]) -> 0.666..."""
    pred, gold = _pair(predictions, labels)
    return float((pred == gold).mean())


def f1_binary(predictions: Sequence, labels: Sequence, positive=1) -> float:
    """F1 of the positive class: f1_binary([1, 1, 0], [1, 0, 1]) -> 0.5 (0 when undefined)."""
    pred, gold = _pair(predictions, labels)
    tp = int(((pred == positive) & (gold == positive)).sum())
    fp = int(((pred == positive) & (gold != positive)).sum())
    fn = int(((pred != positive) & (gold == positive)).sum())
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def matthews_corrcoef(predictions: Sequence, labels: Sequence) -> float:
    """Matthews correlation (Gorodkin's multi-class form; the binary MCC for two classes);
    0 when a marginal is constant: matthews_corrcoef([1, 0, 1, 0], [1, 0, 0, 0]) -> 0.577..."""
    pred, gold = _pair(predictions, labels)
    classes, index = np.unique(np.concatenate([gold, pred]), return_inverse=True)
    truth, guess = index[: len(gold)], index[len(gold) :]
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, (truth, guess), 1)
    true_totals, pred_totals = confusion.sum(1), confusion.sum(0)
    correct, total = np.trace(confusion), confusion.sum()
    numerator = correct * total - true_totals @ pred_totals
    denominator = np.sqrt(
        (total**2 - pred_totals @ pred_totals) * (total**2 - true_totals @ true_totals)
    )
    return 0.0 if denominator == 0 else float(numerator / denominator)


def pearson(
    predictions: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray
) -> float:
    """Pearson's r: pearson([1, 2, 3], [2, 4, 7]) -> 0.993..."""
    x, y = (np.asarray(v, dtype=np.float64) for v in _pair(predictions, labels))
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x @ x) * (y @ y))
    return 0.0 if denominator == 0 else float((x @ y) / denominator)


def spearman(predictions: Sequence[float], labels: Sequence[float]) -> float:
    """Spearman's rho: Pearson's r of the ranks, ties sharing their mean rank."""
    x, y = _pair(predictions, labels)
    return pearson(_ranks(x), _ranks(y))


def _ranks(values: np.ndarray) -> np.ndarray:
    """_ranks([10, 20, 20, 5]) -> [2, 3.5, 3.5, 1]"""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.zeros(len(counts))
    np.add.at(sums, inverse, ranks)
    return (sums / counts)[inverse]


def _pair(
    predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    pred, gold = np.asarray(predictions), np.asarray(labels)
    if pred.shape != gold.shape:
        raise ValueError(f"{len(pred)} predictions for {len(gold)} labels")
    if len(gold) == 0:
        raise ValueError("no examples to score")
    return pred, gold


# --------------------------------------------------------------------------- SQuAD
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """The official normalisation: lower case, no punctuation, no articles, single spaces.
    normalize_answer("The  Denver Broncos!") -> "denver broncos" """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_exact(prediction: str, gold: str) -> int:
    return int(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str, version: int = 2) -> float:
    """Token-overlap F1 of the normalised strings. v2.0's script scores an empty side 1 against
    an empty other side (the no-answer), 0 otherwise; v1.1's scores any empty side 0."""
    predicted, true = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version == 2 and (not predicted or not true):
        return float(predicted == true)
    common = collections.Counter(predicted) & collections.Counter(true)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(true)
    return 2 * precision * recall / (precision + recall)


def squad_questions(dataset: Iterable[Mapping], version: int = 2) -> dict[str, list[str]]:
    """Gold answers by question id from the official JSON's `data` list. v2.0's script drops
    answers that normalise to nothing, and an unanswerable question (`is_impossible`, or no
    answers left) has the single gold answer ""; v1.1's takes the answers as they are."""
    gold = {}
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = [a["text"] for a in qa.get("answers", [])]
                if version == 2:
                    answers = [a for a in answers if normalize_answer(a)]
                    answers = answers if answers and not qa.get("is_impossible") else [""]
                gold[qa["id"]] = answers
    return gold


def squad_v1(dataset: Iterable[Mapping], predictions: Mapping[str, str]) -> dict[str, float]:
    """The v1.1 evaluation script: mean over every question of the dataset (a missing
    prediction scores 0) of the max EM and F1 over its gold answers, in percent."""
    gold = squad_questions(dataset, version=1)
    exact = f1 = 0.0
    for qid, answers in gold.items():
        if qid in predictions and answers:
            exact += max(squad_exact(predictions[qid], a) for a in answers)
            f1 += max(squad_f1(predictions[qid], a, version=1) for a in answers)
    return {"exact_match": 100.0 * exact / len(gold), "f1": 100.0 * f1 / len(gold)}


def squad_v2(
    dataset: Iterable[Mapping],
    predictions: Mapping[str, str],
    no_answer_probs: Mapping[str, float] | None = None,
    threshold: float = 1.0,
) -> dict[str, float]:
    """The v2.0 evaluation script: `exact`/`f1` overall and split into `HasAns_*`/`NoAns_*`
    (percent); with no-answer probabilities, a prediction whose probability exceeds
    `threshold` counts as "no answer", and `best_exact`/`best_f1` with their thresholds give
    the best a threshold chosen on this set could do."""
    gold = squad_questions(dataset)
    missing = [qid for qid in gold if qid not in predictions]
    if missing:
        raise ValueError(f"no prediction for {len(missing)} questions, e.g. {missing[0]!r}")
    probs = no_answer_probs or {qid: 0.0 for qid in gold}
    has_answer = {qid: answers != [""] for qid, answers in gold.items()}
    exact = {qid: max(squad_exact(predictions[qid], a) for a in gold[qid]) for qid in gold}
    f1 = {qid: max(squad_f1(predictions[qid], a) for a in gold[qid]) for qid in gold}

    def thresholded(scores: Mapping[str, float]) -> dict[str, float]:
        return {
            qid: float(not has_answer[qid]) if probs[qid] > threshold else s
            for qid, s in scores.items()
        }

    exact_t, f1_t = thresholded(exact), thresholded(f1)
    result = {"exact": _mean(exact_t.values()), "f1": _mean(f1_t.values()), "total": len(gold)}
    for name, keep in (("HasAns", True), ("NoAns", False)):
        ids = [qid for qid in gold if has_answer[qid] == keep]
        if ids:
            result[f"{name}_exact"] = _mean(exact_t[q] for q in ids)
            result[f"{name}_f1"] = _mean(f1_t[q] for q in ids)
            result[f"{name}_total"] = len(ids)
    if no_answer_probs is not None:
        for name, scores in (("exact", exact), ("f1", f1)):
            best, best_threshold = _best_threshold(scores, predictions, probs, has_answer)
            result[f"best_{name}"], result[f"best_{name}_thresh"] = best, best_threshold
    return result


def _best_threshold(scores, predictions, probs, has_answer) -> tuple[float, float]:
    """Sweep the threshold over the sorted no-answer probabilities: start from answering
    nothing (every NoAns right), then answer one more question at a time."""
    score = best = sum(not has_answer[q] for q in scores)
    best_threshold = 0.0
    for qid in sorted(scores, key=lambda q: probs[q]):
        if has_answer[qid]:
            score += scores[qid]
        elif predictions[qid]:
            score -= 1
        if score > best:
            best, best_threshold = score, probs[qid]
    return 100.0 * best / len(scores), float(best_threshold)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return 100.0 * sum(values) / len(values)


# --------------------------------------------------------------------------- CoNLL entities
Entity = tuple[str, int, int]  # (type, first token, last token), over the whole sequence


def _split_tag(tag: str) -> tuple[str, str]:
    """_split_tag("B-PER") -> ("B", "PER"); _split_tag("O") -> ("O", "")"""
    if tag == "O" or not tag:
        return "O", ""
    prefix, _, kind = tag.partition("-")
    if not kind or prefix not in ("B", "I", "E", "S"):
        raise ValueError(f"tag {tag!r} is not O or B-/I-/E-/S-TYPE")
    return prefix, kind


def _chunk_end(prev: str, prev_type: str, tag: str, kind: str) -> bool:
    # conlleval's endOfChunk
    return (
        prev in ("E", "S")
        or (prev, tag) in {("B", "B"), ("B", "S"), ("B", "O"), ("I", "B"), ("I", "S"), ("I", "O")}
        or (prev != "O" and prev_type != kind)
    )


def _chunk_start(prev: str, prev_type: str, tag: str, kind: str) -> bool:
    # conlleval's startOfChunk
    return (
        tag in ("B", "S")
        or (prev, tag) in {("E", "E"), ("E", "I"), ("S", "E"), ("S", "I"), ("O", "E"), ("O", "I")}
        or (tag != "O" and prev_type != kind)
    )


def entities(tags: Sequence[str]) -> list[Entity]:
    """The chunks of one sentence as conlleval finds them, for IOB1, IOB2 or IOBES tags:
    entities(["B-PER", "I-PER", "O", "I-LOC"]) -> [("PER", 0, 1), ("LOC", 3, 3)]"""
    found, start = [], None
    prev, prev_type = "O", ""
    for i, tag in enumerate([*tags, "O"]):
        current, kind = _split_tag(tag)
        if start is not None and _chunk_end(prev, prev_type, current, kind):
            found.append((prev_type, start, i - 1))
            start = None
        if _chunk_start(prev, prev_type, current, kind):
            start = i
        prev, prev_type = current, kind
    return found


def entity_scores(
    predicted: Sequence[Sequence[str]], gold: Sequence[Sequence[str]]
) -> dict[str, float]:
    """conlleval's figures over sentences of tags: entity-level `precision`, `recall`, `f1`
    (an entity counts only with the same type and span), token `accuracy`, and the same three
    per entity type (`f1_PER`, ...)."""
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predicted sentences for {len(gold)} gold ones")
    correct: collections.Counter = collections.Counter()
    found_pred: collections.Counter = collections.Counter()
    found_gold: collections.Counter = collections.Counter()
    tokens = right_tokens = 0
    for n, (pred_tags, goldtags) in enumerate(zip(predicted, gold, strict=True)):
        if len(pred_tags) != len(goldtags):
            raise ValueError(
                f"sentence {n}: {len(pred_tags)} predicted tags for {len(goldtags)} tokens"
            )
        pred_chunks, goldchunks = set(entities(pred_tags)), set(entities(goldtags))
        found_pred.update(kind for kind, _, _ in pred_chunks)
        found_gold.update(kind for kind, _, _ in goldchunks)
        correct.update(kind for kind, _, _ in pred_chunks & goldchunks)
        tokens += len(goldtags)
        right_tokens += sum(p == g for p, g in zip(pred_tags, goldtags, strict=True))

    def prf(right: int, guessed: int, true: int) -> tuple[float, float, float]:
        precision = right / guessed if guessed else 0.0
        recall = right / true if true else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return precision, recall, f1

    p, r, f = prf(sum(correct.values()), sum(found_pred.values()), sum(found_gold.values()))
    result = {"precision": p, "recall": r, "f1": f, "accuracy": right_tokens / max(tokens, 1)}
    for kind in sorted(set(found_gold) | set(found_pred)):
        p, r, f = prf(correct[kind], found_pred[kind], found_gold[kind])
        result.update({f"precision_{kind}": p, f"recall_{kind}": r, f"f1_{kind}": f})
    return result
