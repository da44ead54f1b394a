"""`text-classification`: your own labelled texts (or text pairs), single-label, multi-label or
regression, from any file `bertkit.rows` reads.

Features are `[CLS] text [SEP] (pair [SEP])`, cut as transformers cuts them (the longer segment
first) — or, with `stride`, over-long inputs read whole as overlapping windows of the longer
segment, each window trained with the example's label and the window logits averaged for the
prediction. Single-label is softmax cross-entropy, multi-label a sigmoid per label with the
threshold of each label chosen on validation (best F1; 0.5 before that), regression MSE on
one output. Figures: accuracy, macro and micro F1 and Matthews correlation; micro and macro F1
and the exact-set accuracy (multi-label); Pearson, Spearman, MSE (regression); per-class
precision, recall, F1 and the confusion matrix in the report.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.core.losses import sequence_loss
from bertkit.rows import missing_column, read_rows
from bertkit.tasks import metrics
from bertkit.tasks.base import DataError, Feature, head_logits
from bertkit.tasks.labels import (
    LabelError,
    LabelSet,
    best_thresholds,
    infer_problem,
    multi_label_figures,
    parse_label,
    per_class,
    sigmoid,
    softmax,
)
from bertkit.tasks.own import OwnTask, text_cell, write_jsonl

logger = logging.getLogger("bertkit")

PROBLEM_TYPES = {  # config.json's names for them (transformers' pipeline reads it)
    "single-label": "single_label_classification",
    "multi-label": "multi_label_classification",
    "regression": "regression",
}
_CHUNK = 20_000  # texts tokenised at a time: flat memory over a million rows


@dataclass(frozen=True, slots=True)
class TextExample:
    source: str  # the file
    line: int
    text: str
    text_pair: str | None = None
    label: Any = None  # the raw cell; None: unlabelled


class TextClassificationTask(OwnTask):
    name = "text-classification"
    head = "BertForSequenceClassification"
    reading_fields = ("text_column", "text_pair_column", "label_column", "label_separator",
                      "format", "columns", "encoding", "delimiter", "escape_char", "stride")  # fmt: skip

    def __init__(self, data=None) -> None:
        super().__init__(data)
        self.label_set: LabelSet | None = None
        self.why = ""
        self.thresholds: np.ndarray | None = None  # multi-label: per label, tuned on validation
        self.weights: list[float] | None = None
        self._index: tuple[LabelSet | None, dict[str, int]] = (None, {})

    # ----------------------------------------------------------------- labels
    @property
    def problem(self) -> str:
        if self.label_set is None:
            raise ValueError(f"{self.name}: no label set yet (fitted(train) first)")
        return self.label_set.problem

    @property
    def problem_type(self) -> str | None:  # type: ignore[override]
        return PROBLEM_TYPES[self.problem] if self.label_set else None

    @property
    def metrics(self) -> tuple[str, ...]:  # type: ignore[override]
        return {
            "single-label": ("accuracy", "macro_f1"),
            "multi-label": ("micro_f1", "macro_f1"),
            "regression": ("pearson", "spearman"),
        }[self.problem]

    def labels(self) -> list[str]:
        return list(self.label_set.names) if self.label_set else []

    def fitted(self, train: Sequence[TextExample]) -> TextClassificationTask:
        if not train:
            raise ValueError(f"{self.data.train}: no training examples")
        source = Path(train[0].source)
        problem, why = self.data.problem, "--problem"
        if problem == "auto":
            try:
                problem, why = infer_problem(  # type: ignore[assignment]
                    ((e.line, e.label) for e in train), self.data.label_separator
                )
            except LabelError as err:
                raise DataError(source, None, f"column {self.data.label_column!r}: {err}") from None
        labels = [self._parse(e, problem) for e in train]
        task = copy.copy(self)
        task.label_set, task.why = LabelSet.from_labels(problem, labels), why
        if problem == "regression":
            # random batches by default, as GLUE's regression (STS-B) draws them: sorted by
            # length, a batch's texts share a length that may go with their score (STS-B's
            # did: one epoch scored 4.1 points lower over 8 seeds, docs/results)
            task.default_bucket_batches = 1
        else:
            for name, count in task.label_set.counts.items():
                if count == 1:
                    first = next(e for e, label in zip(train, labels, strict=True)
                                 if name in (label if problem == "multi-label" else (label,)))  # fmt: skip
                    logger.warning(
                        "%s:%d: label %r has a single training example: the model can hardly "
                        "learn it, and validation scores it on luck",
                        source, first.line, name,
                    )  # fmt: skip
        if self.data.class_weights == "balanced":
            task.weights = task.label_set.balanced_weights(len(train))
        return task

    def _parse(self, example: TextExample, problem: str | None = None) -> Any:
        try:
            return parse_label(example.label, problem or self.problem, self.data.label_separator)
        except LabelError as err:
            raise DataError(
                example.source, example.line, f"column {self.data.label_column!r}: {err}"
            ) from None

    def _gold(self, example: TextExample) -> Any:
        """The example's label as the classifier's target: a class id, a 0/1 row, a float."""
        label = self._parse(example)
        if self.problem == "regression":
            return label
        if self._index[0] is not self.label_set:  # built once per label set
            self._index = (self.label_set, {name: i for i, name in enumerate(self.labels())})
        index = self._index[1]
        unseen = [name for name in (label if self.problem == "multi-label" else (label,))
                  if name not in index]  # fmt: skip
        if unseen:
            shown = ", ".join(self.labels()[:12]) + (", ..." if len(self.labels()) > 12 else "")
            raise DataError(
                example.source,
                example.line,
                f"column {self.data.label_column!r}: label {unseen[0]!r} never occurs in the "
                f"training file (its labels: {shown})",
            )
        if self.problem == "multi-label":
            row = [0.0] * len(index)
            for name in label:
                row[index[name]] = 1.0
            return row
        return index[label]

    # ----------------------------------------------------------------- reading
    def read(self, data, split: str) -> list[TextExample]:
        return list(self.stream(data, split))

    def stream(self, data, split: str) -> Iterator[TextExample]:
        """The split's examples one by one as the file is read (memory flat in its length)."""
        path = self.split_path(data, split)
        d = self.data
        needed = [d.text_column] + ([d.text_pair_column] if d.text_pair_column else [])
        labelled = split in ("train", "dev")
        if labelled:
            needed.append(d.label_column)
        optional = () if labelled else (d.label_column,)
        source, empty = str(path), True
        for row in read_rows(path, needed, d.reading, optional=optional):
            v = row.values
            text = text_cell(path, row.line, d.text_column, v[d.text_column])
            pair = None
            if d.text_pair_column:  # an empty second text is no second segment
                pair = text_cell(path, row.line, d.text_pair_column, v[d.text_pair_column],
                                 required=False) or None  # fmt: skip
            empty = False
            yield TextExample(source, row.line, text, pair, v.get(d.label_column))
        if empty:
            raise DataError(path, None, "no rows")

    def labelled(self, examples, split: str) -> bool:
        return bool(examples) and all(e.label is not None for e in examples)

    def data_summary(self, split, examples, features) -> dict[str, Any]:
        summary: dict[str, Any] = {"file": examples[0].source if examples else "",
                                   "examples": len(examples)}  # fmt: skip
        if split == "train" and self.label_set is not None:
            summary.update(problem=self.problem, why=self.why)
            if self.problem != "regression":
                summary["labels"] = dict(self.label_set.counts)
        summary.update(length_summary(features, len(examples)))
        return summary

    # ----------------------------------------------------------------- features
    def featurize(self, examples, tokenizer, max_seq_length: int) -> list[Feature]:
        stride = self.data.stride
        features: list[Feature] = []
        labelled = self.label_set is not None and all(e.label is not None for e in examples)
        for start in range(0, len(examples), _CHUNK):
            chunk = examples[start : start + _CHUNK]
            firsts = tokenizer.encode_ids([e.text for e in chunk])
            pairs = [e.text_pair for e in chunk]
            seconds = (
                tokenizer.encode_ids([p or "" for p in pairs])
                if any(pairs)
                else [None] * len(chunk)
            )
            for k, example in enumerate(chunk):
                n = start + k
                a, b = firsts[k], seconds[k] if pairs[k] else None
                label = self._gold(example) if labelled else None
                for window in encode_windows(a, b, max_seq_length, stride, tokenizer):
                    window["_example"] = n
                    if label is not None:
                        window["labels"] = label
                    features.append(window)
        return features

    # ----------------------------------------------------------------- training
    def loss(self, model, batch):
        logits = head_logits(model, batch)
        weight = None
        if self.weights is not None:
            weight = torch.tensor(self.weights, dtype=torch.float32, device=logits.device)
        total = sequence_loss(
            logits, batch["labels"], PROBLEM_TYPES[self.problem], reduction="sum", weight=weight
        )
        return total, torch.tensor(len(logits))

    def outputs(self, model, batch):
        return {"logits": head_logits(model, batch)}

    # ----------------------------------------------------------------- predictions
    def predictions(self, examples, features, outputs) -> np.ndarray:
        """Each example's logits: the mean over its windows. (N, C)"""
        return pool_windows(outputs["logits"], features, len(examples))

    def _decisions(self, logits: np.ndarray) -> Any:
        if self.problem == "single-label":
            return logits.argmax(-1)
        if self.problem == "multi-label":
            thresholds = self.thresholds if self.thresholds is not None else 0.5
            return sigmoid(logits) >= thresholds
        return logits[:, 0]

    def _gold_array(self, examples) -> np.ndarray:
        return np.array([self._gold(e) for e in examples])

    def score(self, examples, predictions: np.ndarray) -> dict[str, float]:
        gold = self._gold_array(examples)
        decided = self._decisions(predictions)
        if self.problem == "regression":
            return {
                "pearson": metrics.pearson(decided, gold),
                "spearman": metrics.spearman(list(decided), list(gold)),
                "mse": float(np.mean((decided - gold) ** 2)),
            }
        if self.problem == "multi-label":
            found = multi_label_figures(gold.astype(bool), decided, self.labels())
            keys = ("micro_f1", "macro_f1", "subset_accuracy", "micro_precision", "micro_recall")
            return {k: found[k] for k in keys}
        found = per_class(gold, decided, self.labels())
        return {
            "accuracy": metrics.accuracy(list(decided), list(gold)),
            "macro_f1": found["macro_f1"],
            "micro_f1": found["micro_f1"],  # (= accuracy: one label per example)
            "mcc": metrics.matthews_corrcoef(list(decided), list(gold)),
        }

    def report(self, examples, predictions) -> dict[str, Any] | None:
        if self.problem == "regression":
            return None
        gold = self._gold_array(examples)
        decided = self._decisions(predictions)
        if self.problem == "multi-label":
            found = multi_label_figures(gold.astype(bool), decided, self.labels())
            thresholds = self.thresholds if self.thresholds is not None else [0.5] * len(gold[0])
            for name, t in zip(self.labels(), thresholds, strict=True):
                found["per_class"][name]["threshold"] = round(float(t), 4)
            # which labels are predicted for rows that carry another (a multi-label "confusion")
            overlap = gold.astype(np.int64).T @ decided.astype(np.int64)
            found["confusion"] = {"labels": self.labels(), "matrix": overlap.tolist(),
                                  "rows": "gold label", "columns": "predicted label"}  # fmt: skip
            return found
        found = per_class(gold, decided, self.labels())
        found["confusion"] = {"labels": self.labels(), "matrix": found["confusion"],
                              "rows": "gold label", "columns": "predicted label"}  # fmt: skip
        return found

    def dev_settings(self, examples, predictions, figures) -> dict[str, Any]:
        if self.problem != "multi-label":
            return {}
        chosen = best_thresholds(sigmoid(predictions), self._gold_array(examples).astype(bool))
        return {"thresholds": {n: round(float(t), 6) for n, t in zip(self.labels(), chosen,
                                                                      strict=True)}}  # fmt: skip

    def settings(self) -> dict[str, Any]:
        base = super().settings()
        if self.label_set is not None:
            base.update(problem=self.problem, labels=self.labels())
        return base

    def with_settings(self, settings) -> TextClassificationTask:
        task = self.restored(settings)
        assert isinstance(task, TextClassificationTask)
        if "labels" in settings:
            task.label_set = LabelSet(settings["problem"], tuple(settings["labels"]))
        if "thresholds" in settings and task.label_set is not None:
            given = settings["thresholds"]
            task.thresholds = np.array([float(given.get(n, 0.5)) for n in task.labels()])
        return task

    # ----------------------------------------------------------------- outputs for people
    def _answers(self, logits: np.ndarray) -> list[dict[str, Any]]:
        thresholds = self.thresholds if self.thresholds is not None else 0.5
        return classification_answers(logits, self.labels(), self.problem, thresholds)

    def write_predictions(self, examples, predictions, path: Path) -> Path:
        """predictions.jsonl: each row's line, text(s), gold and predicted labels and the
        probabilities, to read the errors."""
        labelled = self.labelled(examples, "")
        rows = []
        for example, answer in zip(examples, self._answers(predictions), strict=True):
            row: dict[str, Any] = {"line": example.line, "text": example.text}
            if example.text_pair is not None:
                row["text_pair"] = example.text_pair
            if labelled:
                gold = self._parse(example)
                row["gold"] = list(gold) if isinstance(gold, tuple) else gold
            predicted = answer.get("label", answer.get("labels", answer.get("score")))
            row["predicted"] = predicted
            if labelled and self.problem != "regression":
                row["correct"] = row["gold"] == predicted
            row.update({k: v for k, v in answer.items() if k not in ("label", "labels")})
            rows.append(row)
        return write_jsonl(path, rows)

    def example_of(self, item: Any, n: int) -> TextExample:
        d = self.data
        if isinstance(item, dict):  # the columns the model was trained on, and no other
            for column in (d.text_column, d.text_pair_column):
                if column is not None and column not in item:
                    found = missing_column(column, list(item), "item's keys are")
                    raise ValueError(f"item {n}: {found}")
            text = item[d.text_column]
            pair = item[d.text_pair_column] if d.text_pair_column else None
        elif isinstance(item, (list, tuple)):
            if len(item) != 2:
                raise ValueError(f"item {n}: a pair is two texts, got {len(item)}")
            if not d.text_pair_column:  # a pair would be read as the model never saw input
                raise ValueError(f"item {n}: {self.name} takes single texts here (the model "
                                 f"was trained on {d.text_column!r} alone), not pairs")  # fmt: skip
            text, pair = item
        else:
            text, pair = item, None
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"item {n}: an empty text" if isinstance(text, str) else
                             f"item {n}: {type(text).__name__}, expected a text")  # fmt: skip
        return TextExample("<input>", n + 1, text, pair or None)

    def answer(self, examples, features, outputs) -> list[dict[str, Any]]:
        return self._answers(self.predictions(examples, features, outputs))

    def items_of(self, texts, question, context) -> list:
        if question or context:
            raise ValueError(f"{self.name} takes texts, not --question/--context")
        if self.data.text_pair_column:
            if len(texts) != 2:
                raise ValueError(
                    f"this model reads text pairs ({self.data.text_column}, "
                    f"{self.data.text_pair_column}): give two texts, or --input FILE"
                )
            return [tuple(texts)]
        return list(texts)


# --------------------------------------------------------------------------- shared helpers
def classification_answers(
    logits: np.ndarray, names: Sequence[str], problem: str, thresholds: Any = 0.5
) -> list[dict[str, Any]]:
    """What a classifier answers per example (N, C logits): single-label its `label`, the
    label's probability as `score` and every label's `probabilities`; multi-label every label
    at or over its threshold (`labels`) and the probabilities; regression the `score`."""
    if problem == "regression":
        return [{"score": float(v)} for v in logits[:, 0]]
    if problem == "multi-label":
        probs = sigmoid(logits)
        return [
            {"labels": [n for n, p in zip(names, prob >= thresholds, strict=True) if p],
             "probabilities": {n: float(p) for n, p in zip(names, prob, strict=True)}}
            for prob in probs
        ]  # fmt: skip
    probs = softmax(logits)
    return [
        {"label": names[int(p.argmax())], "score": float(p.max()),
         "probabilities": {n: float(x) for n, x in zip(names, p, strict=True)}}
        for p in probs
    ]  # fmt: skip


def truncate_pair(
    a: list[int], b: list[int] | None, room: int
) -> tuple[list[int], list[int] | None]:
    """Cut a segment (pair) to `room` pieces as the tokenizers library's "longest_first" does:
    only the longer one where that suffices, else both to half.
    truncate_pair([1, 2, 3, 4, 5], [6, 7], 5) -> ([1, 2, 3], [6, 7])"""
    if b is None:
        return a[:room], None
    if len(a) + len(b) <= room:
        return a, b
    n1, n2 = len(a), len(b)
    swap = n1 > n2
    if swap:
        n1, n2 = n2, n1
    n2 = n1 if n1 > room else max(n1, room - n1)
    if n1 + n2 > room:
        n1 = room // 2
        n2 = n1 + room % 2
    if swap:
        n1, n2 = n2, n1
    return a[:n1], b[:n2]


def _feature(a: list[int], b: list[int] | None, tokenizer) -> Feature:
    """A (and B) with the special tokens the model reads (`BertTokenizer.with_specials`)."""
    ids, types = tokenizer.with_specials(a, b)
    return {
        "input_ids": np.asarray(ids, dtype=np.int32),
        "token_type_ids": np.asarray(types, dtype=np.int8),
        "attention_mask": np.ones(len(ids), dtype=np.int8),
    }


def window_starts(length: int, room: int, stride: int) -> list[int]:
    """Where windows of `room` pieces start so that consecutive ones share `stride` pieces and
    the last ends at `length`: window_starts(10, 4, 1) -> [0, 3, 6]"""
    if length <= room:
        return [0]
    step = room - stride
    starts = list(range(0, length - room + 1, step))
    if starts[-1] + room < length:
        starts.append(length - room)
    return starts


def encode_windows(
    a: list[int], b: list[int] | None, max_seq_length: int, stride: int | None, tokenizer
) -> list[Feature]:
    """The features of one text (pair): one cut to fit (with "_cut": pieces dropped), or with a
    `stride`, windows over the longer segment, the shorter kept whole (at most half)."""
    room = max_seq_length - tokenizer.special_tokens_added(b is not None)
    if room < 1:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for text")
    total = len(a) + (len(b) if b is not None else 0)
    if stride is None or total <= room:
        cut_a, cut_b = truncate_pair(a, b, room)
        feature = _feature(cut_a, cut_b, tokenizer)
        dropped = total - len(cut_a) - (len(cut_b) if cut_b is not None else 0)
        if dropped:
            feature["_cut"] = dropped
        return [feature]
    long_first = b is None or len(a) >= len(b)
    longer, shorter = (a, b) if long_first or b is None else (b, a)
    if shorter is not None:
        shorter = shorter[: room // 2] if len(shorter) > room // 2 else shorter
    space = room - (len(shorter) if shorter is not None else 0)
    if stride >= space:
        raise ValueError(
            f"--stride {stride} must be below the window's {space} pieces (max_seq_length "
            f"{max_seq_length} less the special tokens and the other segment)"
        )
    windows = []
    assert longer is not None
    for start in window_starts(len(longer), space, stride):
        part = longer[start : start + space]
        pair = (part, shorter) if long_first else (shorter, part)
        windows.append(_feature(pair[0], pair[1], tokenizer))  # type: ignore[arg-type]
    return windows


def pool_windows(logits: np.ndarray, features: Sequence[Feature], examples: int) -> np.ndarray:
    """Per example, the mean of its features' logits (features hold `_example`)."""
    index = np.fromiter((f["_example"] for f in features), dtype=np.int64, count=len(features))
    sums = np.zeros((examples, logits.shape[1]), dtype=np.float64)
    np.add.at(sums, index, logits)
    counts = np.bincount(index, minlength=examples)
    if (counts == 0).any():
        raise ValueError("an example has no features")
    return (sums / counts[:, None]).astype(np.float32)


def length_summary(features: Sequence[Feature], examples: int) -> dict[str, Any]:
    """How many examples were cut, and by how much, or read as several windows."""
    cuts = [f["_cut"] for f in features if "_cut" in f]
    summary: dict[str, Any] = {}
    if cuts:
        summary["truncated"] = {"examples": len(cuts), "mean_pieces": float(np.mean(cuts)),
                                "max_pieces": int(max(cuts))}  # fmt: skip
    if len(features) > examples:
        per_example = np.bincount([f["_example"] for f in features], minlength=examples)
        long = per_example > 1
        summary["windowed"] = {"examples": int(long.sum()), "windows": int(per_example[long].sum())}
    return summary
