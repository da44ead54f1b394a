"""`question-answering`: extractive QA on your own SQuAD-format JSON under any file name, or
on records (JSON Lines, Parquet, a `datasets` folder) laid out as Hugging Face's `squad`: `id`,
`question`, `context`, `answers` = {"text": [...], "answer_start": [...]} (or a list of
{"text", "answer_start"}). Unanswerable questions (`is_impossible`, or no answers) in the
training file make it a SQuAD 2.0-style task: the model may abstain, with the no-answer
threshold chosen on validation. Everything else is SQuAD's (`bertkit.tasks.squad`): windows of
the context, the official EM and F1.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from bertkit.rows import file_format, read_rows
from bertkit.tasks.base import DataError
from bertkit.tasks.own import OwnTask, text_cell, write_jsonl
from bertkit.tasks.squad import SquadExample, SquadTask, read_squad, squad_layout

COLUMNS = ("id", "question", "context", "answers")


class QuestionAnsweringTask(OwnTask, SquadTask):
    name = "question-answering"
    reading_fields = ("format", "encoding")
    default_epochs, default_batch_size = 3, 32  # SQuAD 1.1's, whatever the version
    default_file_format = "json"

    def __init__(self, data=None) -> None:
        OwnTask.__init__(self, data)
        SquadTask.__init__(self, 1)
        self.name = "question-answering"

    def read(self, data, split: str) -> list[SquadExample]:
        path = self.split_path(data, split)
        labelled = split in ("train", "dev")
        kind = file_format(path, self.data.reading.format, self.default_file_format)
        if kind == "json" and squad_layout(path, self.data.reading.encoding):
            return read_squad(path, require_answers=labelled)
        examples = []
        options = self.data.reading
        for row in read_rows(path, COLUMNS[1:3], options, optional=("id", "answers"), format=kind):
            v, line = row.values, row.line
            question = text_cell(path, line, "question", v["question"])
            context = text_cell(path, line, "context", v["context"])
            answers = _answers(path, line, v.get("answers"), context)
            if labelled and answers is None:
                raise DataError(path, line, "no column 'answers' ({'text': [...], "
                                "'answer_start': [...]}; [] for an unanswerable question)")  # fmt: skip
            qid = str(v.get("id", f"{path.name}:{line}"))
            impossible = answers == ()
            examples.append(SquadExample(qid, question, context, answers or (), impossible))
        if not examples:
            raise DataError(path, None, "no rows")
        return examples

    def labelled(self, examples, split: str) -> bool:
        return bool(examples) and all(e.answers or e.is_impossible for e in examples)

    def fitted(self, train) -> QuestionAnsweringTask:
        task = copy.copy(self)
        if any(e.is_impossible for e in train):
            task.version = 2  # the model may answer "no answer"
        return task

    def data_summary(self, split, examples, features) -> dict[str, Any]:
        impossible = sum(e.is_impossible for e in examples)
        summary: dict[str, Any] = {"file": self.data.file(split) or "", "examples": len(examples)}
        if split == "train":
            summary.update(problem=f"SQuAD {'2.0' if self.version == 2 else '1.1'}-style",
                           why=f"{impossible:,} unanswerable questions")  # fmt: skip
        windows = len(features) - len(examples)
        if windows > 0:
            summary["windowed"] = {"examples": len({f['_example'] for f in features}),
                                   "windows": len(features), "note": " (doc stride 128)"}  # fmt: skip
        return summary

    def settings(self) -> dict[str, Any]:
        return super().settings() | {"version": self.version}

    def with_settings(self, settings) -> QuestionAnsweringTask:
        task = self.restored(settings)
        assert isinstance(task, QuestionAnsweringTask)
        task.version = int(settings.get("version", task.version))
        return SquadTask.with_settings(task, settings)

    def write_predictions(self, examples, predictions, path: Path) -> Path:
        """predictions.jsonl: each question, its gold answers, the answer given with its score
        and the no-answer margin."""
        answers = self.answers(predictions)
        rows = []
        for e, found in zip(examples, predictions["candidates"], strict=True):
            top = found["n_best"][0] if found["n_best"] else None
            row: dict[str, Any] = {"id": e.qid, "question": e.question}
            if e.answers or e.is_impossible:
                row["gold"] = [text for text, _ in e.answers]
            row.update(predicted=answers[e.qid], score=top["score"] if top else None)
            if self.version == 2:
                row["null_odds"] = predictions["null_odds"][e.qid]
            rows.append(row)
        return write_jsonl(path, rows)


def _answers(path: Path, line: int, value: Any, context: str) -> tuple | None:
    """(text, start) pairs of an answers cell; () unanswerable; None: no cell."""
    if value is None:
        return None
    if isinstance(value, dict):
        texts, starts = value.get("text", []), value.get("answer_start", [])
        pairs = list(zip(texts, starts, strict=False)) if len(texts) == len(starts) else None
    elif isinstance(value, list):
        pairs = [(a.get("text"), a.get("answer_start")) for a in value if isinstance(a, dict)]
        pairs = pairs if len(pairs) == len(value) else None
    else:
        pairs = None
    if pairs is None:
        raise DataError(path, line, "column 'answers': expected {'text': [...], "
                        "'answer_start': [...]} or a list of {'text', 'answer_start'}")  # fmt: skip
    found = []
    for text, start in pairs:
        if not isinstance(text, str) or isinstance(start, bool) or not isinstance(start, int):
            raise DataError(path, line, f"column 'answers': ({text!r}, {start!r}) is not "
                            "(text, character start)")  # fmt: skip
        if start < 0 or context[start : start + len(text)] != text:
            raise DataError(path, line, f"column 'answers': {text!r} is not at character "
                            f"{start} of the context")  # fmt: skip
        found.append((text, start))
    return tuple(found)
