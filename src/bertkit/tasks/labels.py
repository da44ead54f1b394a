"""Labels of the user's own classification data: what kind of problem a label column is,
the label set it holds, per-label thresholds for multi-label outputs, and the per-class figures
users read (precision, recall, F1, support, the confusion matrix). Pure functions over plain
values and numpy arrays.

A label column is read as one of three problems:
- **single-label**: one name per row (strings, or integers: `3` and `"3"` are the same label);
- **multi-label**: a list per row (JSON), or a string split on `--label-separator`;
- **regression**: a number per row (floats).

`--problem auto` takes lists (or a separator) as multi-label, numbers with a fractional part as
regression, integers as single-label (more than 32 distinct integers: regression), words as
single-label; words mixed with numbers in one column are refused (a shifted column, more often
than not), unless `--problem single-label` says every value is a name.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PROBLEMS = ("auto", "single-label", "multi-label", "regression")
MAX_INTEGER_CLASSES = 32  # more distinct integers than this: auto reads them as scores


class LabelError(ValueError):
    """A label value that cannot be read as the problem asks; the caller adds file and line."""


def kind_of(value: Any) -> str:
    """What a raw label cell holds: "list", "int", "float", "text" or "empty".
    kind_of("3") -> "int"; kind_of(" 2.5") -> "float"; kind_of(["a"]) -> "list" """
    if value is None:
        return "empty"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, bool):
        return "text"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    text = str(value).strip()
    if not text:
        return "empty"
    try:
        int(text)
        return "int"
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return "text"
    return "float" if math.isfinite(number) else "text"


def label_name(value: Any) -> str:
    """The name of a single label: label_name(3) -> "3"; label_name(" sports ") -> "sports";
    label_name(True) -> "true" """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    if kind_of(text) == "int":
        return str(int(text))  # "03" and "3" are one label
    return text


def infer_problem(
    values: Iterable[tuple[int, Any]], separator: str | None = None
) -> tuple[str, str | None]:
    """(problem, why) for the raw label cells of a training file, as (line, value) pairs.
    Mixed kinds raise LabelError naming a line of each kind."""
    if separator is not None:
        return "multi-label", f"--label-separator {separator!r}"
    first_line: dict[str, int] = {}
    integers: set[int] = set()
    for line, value in values:
        kind = kind_of(value)
        first_line.setdefault(kind, line)
        if kind == "int" and len(integers) <= MAX_INTEGER_CLASSES:
            integers.add(int(str(value).strip()) if not isinstance(value, int) else value)
    kinds = set(first_line) - {"empty"}
    if not kinds:
        raise LabelError("every label is empty")
    if "list" in kinds:
        if kinds != {"list"}:
            raise LabelError(_mixed(first_line, "lists"))
        return "multi-label", "the labels are lists"
    if "text" in kinds:
        if kinds != {"text"}:
            raise LabelError(_mixed(first_line, "words and numbers"))
        return "single-label", "the labels are words"
    if "float" in kinds:
        return "regression", "the labels are numbers with fractions"
    if len(integers) > MAX_INTEGER_CLASSES:
        return "regression", f"more than {MAX_INTEGER_CLASSES} distinct integers"
    return "single-label", "the labels are integers (--problem regression reads them as scores)"


def _mixed(first_line: dict[str, int], what: str) -> str:
    shown = ", ".join(f"{kind} on line {line}" for kind, line in sorted(first_line.items()))
    return (
        f"the label column mixes {what} ({shown}): a shifted column? "
        "(--problem single-label reads every value as a label name)"
    )


def parse_label(value: Any, problem: str, separator: str | None = None) -> Any:
    """A raw cell as the problem's label: a name (single-label), a tuple of names
    (multi-label: parse_label("a|b", "multi-label", "|") -> ("a", "b")) or a float."""
    kind = kind_of(value)
    if problem == "regression":
        if kind not in ("int", "float"):
            raise LabelError(f"{value!r} is not a number")
        return float(value)
    if problem == "multi-label":
        if kind == "empty":
            return ()
        if kind == "list":
            names = [label_name(v) for v in value]
        elif separator is not None:
            names = [label_name(v) for v in str(value).split(separator)]
        else:
            names = [label_name(value)]
        names = [n for n in names if n]
        return tuple(dict.fromkeys(names))  # a label named twice counts once
    if kind == "empty":
        raise LabelError("an empty label")
    if kind == "list":
        raise LabelError(f"a list {value!r} where one label was expected (--problem multi-label?)")
    return label_name(value)


def sorted_names(names: Iterable[str]) -> list[str]:
    """Integers in numeric order, then words in text order: ["10", "2", "b", "a"] ->
    ["2", "10", "a", "b"]"""

    def key(name: str) -> tuple:
        return (0, int(name), "") if kind_of(name) == "int" else (1, 0, name)

    return sorted(set(names), key=key)


@dataclass(frozen=True)
class LabelSet:
    """The problem and, for classification, the label names in the classifier's order with
    their training counts (multi-label: rows carrying the label)."""

    problem: str
    names: tuple[str, ...]
    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_labels(cls, problem: str, labels: Sequence[Any]) -> LabelSet:
        """From parsed training labels (names, tuples of names, or floats)."""
        if problem == "regression":
            return cls(problem, ("score",), {})
        counts: collections.Counter = collections.Counter()
        for label in labels:
            counts.update(label if problem == "multi-label" else (label,))
        names = tuple(sorted_names(counts))
        if not names:
            raise LabelError("no labels in the training data")
        return cls(problem, names, {n: counts[n] for n in names})

    def balanced_weights(self, rows: int) -> list[float]:
        """Class weights for a skewed label set, as scikit-learn's "balanced": rows / (classes ·
        count) per class; multi-label: negatives / positives per label (BCE's pos_weight)."""
        if self.problem == "regression":
            raise ValueError("class weights are for classification, not regression")
        if self.problem == "multi-label":
            return [max(rows - c, 1) / max(c, 1) for c in (self.counts[n] for n in self.names)]
        return [rows / (len(self.names) * max(self.counts[n], 1)) for n in self.names]


# --------------------------------------------------------------------------- figures
def per_class(gold: np.ndarray, predicted: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
    """Per-class precision, recall, F1 and support of integer class ids, with macro F1 (mean
    over classes that occur in gold or predictions) and micro F1."""
    classes = len(names)
    confusion = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(confusion, (gold, predicted), 1)
    return {"confusion": confusion.tolist(), **_prf(np.diag(confusion), confusion.sum(0),
                                                    confusion.sum(1), names)}  # fmt: skip


def multi_label_figures(
    gold: np.ndarray, predicted: np.ndarray, names: Sequence[str]
) -> dict[str, Any]:
    """As per_class for (N, C) boolean arrays, plus the share of rows predicted exactly."""
    right = (gold & predicted).sum(0)
    result = _prf(right, predicted.sum(0), gold.sum(0), names)
    result["subset_accuracy"] = float((gold == predicted).all(1).mean()) if len(gold) else 0.0
    return result


def _prf(right, guessed, true, names) -> dict[str, Any]:
    table = {}
    f1s = []
    for n, name in enumerate(names):
        p = right[n] / guessed[n] if guessed[n] else 0.0
        r = right[n] / true[n] if true[n] else 0.0
        f = 2 * p * r / (p + r) if p + r else 0.0
        table[name] = {"precision": float(p), "recall": float(r), "f1": float(f),
                       "support": int(true[n])}  # fmt: skip
        if true[n] or guessed[n]:
            f1s.append(f)
    total_right, total_guessed, total_true = right.sum(), guessed.sum(), true.sum()
    p = total_right / total_guessed if total_guessed else 0.0
    r = total_right / total_true if total_true else 0.0
    return {
        "per_class": table,
        "macro_f1": float(np.mean(f1s)) if f1s else 0.0,
        "micro_f1": float(2 * p * r / (p + r)) if p + r else 0.0,
        "micro_precision": float(p),
        "micro_recall": float(r),
    }


def report_table(report: dict[str, Any], limit: int = 50) -> str:
    """A report's per-class figures as aligned text, the rarest classes last (what the
    commands print; results.json keeps the whole report)."""
    table = report.get("per_class") or {}
    rows = sorted(table.items(), key=lambda item: -item[1]["support"])
    width = max([5, *(len(str(name)) for name, _ in rows[:limit])])
    lines = [f"{'label':<{width}}  precision  recall     f1  support"]
    for name, row in rows[:limit]:
        threshold = f"  (threshold {row['threshold']:.2f})" if "threshold" in row else ""
        lines.append(f"{str(name):<{width}}  {row['precision']:9.3f}  {row['recall']:6.3f}  "
                     f"{row['f1']:5.3f}  {row['support']:7,}{threshold}")  # fmt: skip
    if len(rows) > limit:
        lines.append(f"… {len(rows) - limit} more in results.json")
    return "\n".join(lines)


def best_thresholds(probabilities: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Per label, the threshold that maximises that label's F1 on these rows (predict the label
    where its probability is at least the threshold); 0.5 for a label no row carries. Thresholds
    fall midway between the probabilities they separate, so they do not sit on a row's value.

    >>> best_thresholds(np.array([[0.9], [0.4], [0.2]]), np.array([[1], [1], [0]])).round(2)
    array([0.3])
    """
    rows, labels = probabilities.shape
    chosen = np.full(labels, 0.5)
    for c in range(labels):
        positives = int(gold[:, c].sum())
        if positives == 0 or positives == rows:
            continue
        order = np.argsort(-probabilities[:, c], kind="stable")
        ranked = probabilities[order, c]
        hits = np.cumsum(gold[order, c])  # true positives when the top k+1 are predicted
        k = np.arange(1, rows + 1)
        f1 = 2 * hits / (k + positives)
        # a cut can only fall between two different probabilities
        valid = np.append(ranked[:-1] > ranked[1:], True)
        best = int(np.argmax(np.where(valid, f1, -1.0)))
        below = ranked[best + 1] if best + 1 < rows else 0.0
        chosen[c] = (ranked[best] + below) / 2
    return chosen


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(logits, -60, 60)))


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)
