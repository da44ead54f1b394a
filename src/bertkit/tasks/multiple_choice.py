"""Multiple choice, shared by SWAG and `multiple-choice` (your own files): each choice is
`[CLS] context [SEP] start choice [SEP]` (`start`: text every choice continues, SWAG's sent2,
or a question), scored from its pooled [CLS]; a softmax over the choices (the paper, Sec. 4.4).

`multiple-choice` reads records (JSON Lines, JSON, CSV, Parquet, a `datasets` folder) with a
context column, the choices as one list column or as several columns (`--choices-column
ending0,ending1,ending2,ending3`), an optional `--question-column` and a label: the index of
the right choice (from 0) or its text. Rows may have different numbers of choices: a batch
pads the shorter ones with choices that get no probability.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.core.losses import PAD_LOGIT, sequence_loss
from bertkit.rows import read_rows
from bertkit.tasks import metrics
from bertkit.tasks.base import DataError, Feature, Task, head_logits
from bertkit.tasks.labels import kind_of, per_class, softmax
from bertkit.tasks.own import OwnTask, text_cell, write_jsonl


@dataclass(frozen=True)
class ChoiceExample:
    guid: str  # "file:line"
    context: str
    start: str  # the text every choice continues (SWAG's sent2; a question), may be ""
    endings: tuple[str, ...]
    label: int | None


class ChoiceTask(Task):
    head = "BertForMultipleChoice"
    metrics = ("accuracy",)

    def featurize(self, examples, tokenizer, max_seq_length: int) -> list[Feature]:
        firsts = [e.context for e in examples for _ in e.endings]
        seconds = [f"{e.start} {ending}".strip() for e in examples for ending in e.endings]
        encoded = tokenizer(firsts, seconds, max_length=max_seq_length)
        features, at = [], 0
        for example in examples:
            rows = slice(at, at + len(example.endings))
            at += len(example.endings)
            feature = {key: encoded[key][rows] for key in self.padded_inputs}
            if example.label is not None:
                feature["labels"] = example.label
            features.append(feature)
        return features

    def _logits(self, model, batch) -> torch.Tensor:
        """(B, choices); where a feature has fewer choices than the batch, the padding choices
        score PAD_LOGIT (no probability)."""
        logits = head_logits(model, batch)
        if "choice_mask" in batch:
            logits = logits.masked_fill(~batch["choice_mask"], PAD_LOGIT)
        return logits

    def loss(self, model, batch):
        logits = self._logits(model, batch)
        total = sequence_loss(
            logits, batch["labels"], "single_label_classification", reduction="sum"
        )
        return total, torch.tensor(len(logits))

    def outputs(self, model, batch):
        return {"logits": self._logits(model, batch)}

    def predictions(self, examples, features, outputs) -> list[int]:
        return [int(i) for i in outputs["logits"].argmax(-1)]

    def score(self, examples, predictions) -> dict[str, float]:
        return {"accuracy": metrics.accuracy(predictions, [e.label for e in examples])}

    def example_of(self, item: Any, n: int) -> ChoiceExample:
        """{"context": ..., "choices" (or "endings"): [...], "question" (or "start"): ...}"""
        if not isinstance(item, dict) or "context" not in item:
            raise ValueError(f'item {n}: {{"context": ..., "choices": [...]}} expected')
        endings = item.get("choices", item.get("endings"))
        if not isinstance(endings, (list, tuple)) or len(endings) < 2:
            raise ValueError(f"item {n}: at least two choices expected")
        start = item.get("question", item.get("start", "")) or ""
        return ChoiceExample(str(n), item["context"], start, tuple(endings), None)

    def answer(self, examples, features, outputs) -> list[dict[str, Any]]:
        answers = []
        for e, logits in zip(examples, outputs["logits"], strict=True):
            p = softmax(logits[: len(e.endings)])
            answers.append({"choice": int(p.argmax()), "text": e.endings[int(p.argmax())],
                            "probabilities": [float(x) for x in p]})  # fmt: skip
        return answers

    def items_of(self, texts, question, context) -> list:
        raise ValueError(f'{self.name} takes --input FILE.jsonl of {{"context", "choices"}}')


class MultipleChoiceTask(OwnTask, ChoiceTask):
    name = "multiple-choice"
    reading_fields = ("context_column", "question_column", "choices_column", "label_column",
                      "format", "columns", "encoding", "delimiter", "escape_char")  # fmt: skip

    def __init__(self, data=None) -> None:
        OwnTask.__init__(self, data)
        self.choices: int | None = None

    def _choice_columns(self) -> list[str]:
        return [c.strip() for c in self.data.choices_column.split(",")]

    def read(self, data, split: str) -> list[ChoiceExample]:
        path = self.split_path(data, split)
        d = self.data
        choice_columns = self._choice_columns()
        needed = [d.context_column, *choice_columns]
        if d.question_column:
            needed.append(d.question_column)
        labelled = split in ("train", "dev")
        if labelled:
            needed.append(d.label_column)
        optional = () if labelled else (d.label_column,)
        examples = []
        for row in read_rows(path, needed, d.reading, optional=optional):
            v, line = row.values, row.line
            context = text_cell(path, line, d.context_column, v[d.context_column])
            if len(choice_columns) == 1:
                endings = v[choice_columns[0]]
                if not isinstance(endings, list) or len(endings) < 2:
                    raise DataError(path, line, f"column {choice_columns[0]!r}: expected a list "
                                    "of two or more choices (or name several choice columns)")  # fmt: skip
                endings = [text_cell(path, line, choice_columns[0], e) for e in endings]
            else:
                endings = [text_cell(path, line, c, v[c]) for c in choice_columns]
            start = ""
            if d.question_column:
                start = text_cell(
                    path, line, d.question_column, v[d.question_column], required=False
                )
            label = self._label(path, line, v.get(d.label_column), endings)
            examples.append(ChoiceExample(f"{path}:{line}", context, start, tuple(endings), label))
        if not examples:
            raise DataError(path, None, "no rows")
        return examples

    def _label(self, path, line, value, endings) -> int | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if kind_of(value) == "int":
            index = int(value)
            if 0 <= index < len(endings):
                return index
        elif isinstance(value, str) and value in endings:
            return endings.index(value)
        raise DataError(
            path, line, f"column {self.data.label_column!r}: {value!r} is neither a choice index "
            f"(0-{len(endings) - 1}) nor the text of a choice"
        )  # fmt: skip

    def labelled(self, examples, split: str) -> bool:
        return bool(examples) and all(e.label is not None for e in examples)

    def fitted(self, train) -> MultipleChoiceTask:
        task = copy.copy(self)
        task.choices = max(len(e.endings) for e in train)
        if any(e.label is None for e in train):
            bad = next(e for e in train if e.label is None)
            raise DataError(*_where(bad), f"column {self.data.label_column!r}: an empty label")
        return task

    def data_summary(self, split, examples, features) -> dict[str, Any]:
        summary: dict[str, Any] = {"file": examples[0].guid.rpartition(":")[0],
                                   "examples": len(examples)}  # fmt: skip
        if split == "train" and self.labelled(examples, split):
            counts = np.bincount([e.label for e in examples], minlength=self.choices or 0)
            summary["labels"] = {f"choice {i}": int(c) for i, c in enumerate(counts)}
        return summary

    def report(self, examples, predictions) -> dict[str, Any]:
        count = max([self.choices or 0] + [len(e.endings) for e in examples])
        names = [f"choice {i}" for i in range(count)]
        found = per_class(np.array([e.label for e in examples]), np.array(predictions), names)
        found["confusion"] = {"labels": names, "matrix": found["confusion"],
                              "rows": "right choice", "columns": "predicted"}  # fmt: skip
        return found

    def settings(self) -> dict[str, Any]:
        return super().settings() | ({"choices": self.choices} if self.choices else {})

    def with_settings(self, settings) -> MultipleChoiceTask:
        task = self.restored(settings)
        assert isinstance(task, MultipleChoiceTask)
        task.choices = settings.get("choices", task.choices)
        return task

    def write_predictions(self, examples, predictions, path: Path) -> Path:
        rows = []
        for e, p in zip(examples, predictions, strict=True):
            row: dict[str, Any] = {"line": int(e.guid.rpartition(":")[2]), "context": e.context}
            if e.start:
                row["question"] = e.start
            row.update(choices=list(e.endings), predicted=p)
            if e.label is not None:
                row.update(gold=e.label, correct=e.label == p)
            rows.append(row)
        return write_jsonl(path, rows)


def _where(example: ChoiceExample) -> tuple[str, int]:
    path, _, line = example.guid.rpartition(":")
    return path, int(line)
