"""Fine-tuning on your own files: the settings that describe them (`DataConfig`, the flags of
`bertkit finetune text-classification` and its three siblings) and what the four generic tasks
share: reading a split's file, the checks, the summary printed before training.

    bertkit finetune text-classification --model M --train train.csv --validation dev.csv \\
        --text-column headline --label-column topic --out runs/topics

    finetune("text-classification", "M", DataConfig(train="train.csv", validation="dev.csv",
             text_column="headline", label_column="topic"), "runs/topics")
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit.rows import FileConfig
from bertkit.settings import Settings, flat, flat_names, nested, setting
from bertkit.tasks.base import DataError, Task, check_data
from bertkit.tasks.labels import PROBLEMS

TAG_SCHEMES = ("auto", "iob1", "iob2", "iobes", "plain")


@flat_names
@dataclass
class DataConfig(Settings):
    """Your own files and how to read them as a task. The `bertkit finetune` flags of the four
    generic tasks are these fields (`--train`, `--text-column`, ...)."""

    train: str | None = setting(
        None,
        "training file: CSV, TSV, JSON Lines, JSON, Parquet, a datasets.save_to_disk folder; "
        "token-classification: also CoNLL-style columns; question-answering: SQuAD JSON",
    )
    validation: str | None = setting(None, "validation file (scored every epoch), same formats")
    test: str | None = setting(
        None, "test file: predicted (and scored, if labelled) once, by the best epoch's model"
    )
    dataset: str | None = setting(
        None,
        "NAME[:CONFIG]: a dataset in the local datasets cache, as load_dataset(NAME, CONFIG) "
        "caches it (read offline where HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set), instead "
        "of --train and --validation files; its splits by --train-split and --validation-split",
    )
    train_split: str = setting("train", "with --dataset: the split to train on")
    test_split: str | None = setting(
        None, "with --dataset: a split predicted (and scored) once by the best epoch's model"
    )
    reading: FileConfig = nested(FileConfig)
    text_column: str = setting("text", "column of the text (classification)")
    text_pair_column: str | None = setting(
        None, "column of a second text, read as segment B (sentence pairs)"
    )
    label_column: str = setting("label", "column of the label")
    problem: str = setting(
        "auto",
        "single-label, multi-label (a list, or --label-separator), regression (numbers); auto "
        "infers it from the training labels and prints what it found",
        choices=PROBLEMS,
    )
    label_separator: str | None = setting(None, "multi-label: split a label cell on this")
    class_weights: str | None = setting(
        None,
        "balanced: weigh each class's loss by its rarity in the training file (skewed labels)",
        choices=("balanced",),
    )
    stride: int | None = setting(
        None,
        "read over-long inputs whole as overlapping windows sharing this many pieces "
        "(classification: window logits averaged; tagging: each word from the window where it "
        "has the most context); unset: cut (and say how many were)",
        check="non-negative",
    )
    tokens_column: str = setting("tokens", "token classification: the column of word lists")
    tags_column: str = setting(
        "tags", "token classification: the column of tag lists (CoNLL files: the last field)"
    )
    tag_scheme: str = setting(
        "auto",
        "tags as IOB1, IOB2 or IOBES entity chunks, or plain labels per word (POS); auto: "
        "read off the training file",
        choices=TAG_SCHEMES,
    )
    negative_column: str | None = setting(
        None, "sentence embedding: a column of hard negatives (a text unlike the anchor)"
    )
    score_range: str = setting(
        "0,1", "sentence embedding: LOW,HIGH of the label column's scores (scaled to [0, 1])"
    )
    pooling: str = setting(
        "mean",
        "sentence embedding: mean (of every real token's state) or cls",
        choices=("mean", "cls"),
    )
    dims: str | None = setting(
        None,
        "sentence embedding: Matryoshka dimensions, e.g. 384,128,64: the loss summed over these "
        "leading parts of each vector (each at unit length), so a shortened vector still works",
    )
    symmetric_loss: bool = setting(
        False, "sentence embedding: also rank each positive's anchor among the batch's anchors"
    )
    context_column: str = setting("context", "multiple choice: the column of the context")
    question_column: str | None = setting(
        None, "multiple choice: a column of text that starts every choice (SWAG's sent2)"
    )
    choices_column: str = setting(
        "choices", "multiple choice: a column of choice lists, or choice columns a,b,c,d"
    )

    def file(self, split: str) -> str | None:
        return {"train": self.train, "dev": self.validation, "test": self.test}.get(split)

    def given(self) -> dict[str, Any]:
        """The fields set to other than their defaults (what a user asked for), by flat name."""
        defaults = flat(DataConfig())
        return {k: v for k, (v, _) in flat(self).items() if v != defaults[k][0]}


class OwnTask(Task):
    """What the generic tasks share: the files come from a DataConfig (or, for `evaluate` and
    `predict`, any file); the checkpoint records how they were read."""

    data: DataConfig
    reports = True
    # DataConfig fields a checkpoint keeps: how evaluate and predict read a new file
    reading_fields: tuple[str, ...] = ()

    def __init__(self, data: DataConfig | None = None) -> None:
        self.data = data if data is not None else DataConfig()

    def source(self, data: Any) -> None:
        """Nothing: the task reads the files its DataConfig names."""
        check_data(self.name, data, own=True)
        return None

    def data_description(self, data: Any) -> dict[str, Any]:
        return (data if isinstance(data, DataConfig) else self.data).given()

    def split_path(self, data: str | Path | None, split: str) -> Path:
        if data is not None:
            return Path(data)
        path = self.data.file(split)
        if path is None:
            flag = {"dev": "--validation", "train": "--train"}.get(split, f"--{split}")
            raise ValueError(f"{self.name} needs {flag} FILE (DataConfig.{_field(split)})")
        return Path(path)

    def test_splits(self) -> tuple[str, ...]:
        return ("test",) if self.data.test else ()

    def prediction_file(self, split: str) -> str:
        return "predictions.jsonl" if split == "dev" else f"predictions_{split}.jsonl"

    def settings(self) -> dict[str, Any]:
        values = flat(self.data)
        return {"data": {k: values[k][0] for k in self.reading_fields}}

    def restored(self, settings: dict[str, Any]) -> OwnTask:
        """A copy reading files as the checkpoint's spec says."""
        task = copy.copy(self)
        kept = {k: v for k, v in settings.get("data", {}).items() if k in self.reading_fields}
        task.data = dataclasses.replace(self.data, **kept)
        return task


def _field(split: str) -> str:
    return {"dev": "validation"}.get(split, split)


def text_cell(path: Path, line: int, column: str, value: Any, *, required: bool = True) -> str:
    """A cell that must hold text: strings as they are, numbers as written; None, lists and
    objects are refused, and an empty text where `required`."""
    if value is None:
        value = ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DataError(path, line, f"column {column!r}: a {type(value).__name__}, expected a text")
    text = value if isinstance(value, str) else str(value)
    if required and not text.strip():
        raise DataError(path, line, f"column {column!r}: an empty text")
    return text


def describe(task_name: str, split: str, summary: dict[str, Any], max_seq_length: int) -> str:
    """The lines `bertkit finetune` prints of what it read (summary: `Task.data_summary`)."""
    lines = []
    head = f"{task_name}: {split} {summary.get('file', '')}: {summary['examples']:,} examples"
    if "problem" in summary:
        head += f"; {summary['problem']} ({summary['why']})"
    lines.append(head)
    if summary.get("labels"):
        counts = summary["labels"]
        shown = " · ".join(f"{name} {count:,}" for name, count in list(counts.items())[:30])
        more = f" · … ({len(counts) - 30} more)" if len(counts) > 30 else ""
        lines.append(f"  {len(counts)} labels: {shown}{more}")
    if summary.get("entity_types"):
        shown = " · ".join(f"{k} {v:,}" for k, v in summary["entity_types"].items())
        lines.append(f"  tags {summary['scheme'].upper()}, entities: {shown}")
    if summary.get("truncated"):
        cut = summary["truncated"]
        lines.append(
            f"  {cut['examples']:,} of {summary['examples']:,} examples longer than "
            f"{max_seq_length} pieces were cut by {cut['mean_pieces']:.0f} pieces "
            f"on average (at most {cut['max_pieces']:,}); --stride N reads them whole in "
            "overlapping windows"
        )
    if summary.get("windowed"):
        w = summary["windowed"]
        lines.append(
            f"  {w['examples']:,} examples longer than {max_seq_length} pieces read "
            f"as {w['windows']:,} windows{w.get('note', '')}"
        )
    lines += [f"  {note}" for note in summary.get("notes", [])]
    return "\n".join(lines)


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Rows as JSON Lines, atomically."""
    from bertkit._io import atomic_path

    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
