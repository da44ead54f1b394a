"""SWAG: pick the most plausible of four endings.

The released CSVs (`train.csv`, `val.csv`, `test.csv`) have a header naming `video-id`,
`fold-ind`, `startphrase`, `sent1`, `sent2`, `gold-source`, `ending0` … `ending3` and (not in
test) `label`; fields are CSV-quoted. Each choice is `[CLS] sent1 [SEP] sent2 ending_i [SEP]`
(`startphrase` is sent1 + sent2, the ending completes sent2); a score from the pooled [CLS] of
each, a softmax over the four (the paper, Sec. 4.4: 3 epochs, lr 2e-5, batch 16).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertkit.tasks.base import DataError, read_text, require_file
from bertkit.tasks.multiple_choice import ChoiceExample, ChoiceTask

SPLIT_FILES = {"train": "train.csv", "dev": "val.csv", "test": "test.csv"}
CHOICES = 4
REQUIRED = ("sent1", "sent2", *(f"ending{i}" for i in range(CHOICES)))


def read_swag(path: str | os.PathLike) -> list[ChoiceExample]:
    path = Path(path)
    examples = []
    with io.StringIO(read_text(path), newline="") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise DataError(
                path, 1, f"header lacks {missing}; expected the SWAG columns {REQUIRED}"
            )
        labelled = "label" in header
        try:
            for row in reader:
                line = reader.line_num
                if None in row or any(row[c] is None for c in REQUIRED):
                    raise DataError(path, line, f"{len(header)} columns expected")
                label = None
                if labelled:
                    try:
                        label = int(row["label"])
                    except ValueError:
                        raise DataError(path, line, f"label {row['label']!r} is not 0-3") from None
                    if not 0 <= label < CHOICES:
                        raise DataError(path, line, f"label {label} is not 0-3")
                if not row["sent1"].strip():
                    raise DataError(path, line, "empty sent1")
                examples.append(
                    ChoiceExample(
                        f"{path.name}:{line}",
                        row["sent1"],
                        row["sent2"],
                        tuple(row[f"ending{i}"] for i in range(CHOICES)),
                        label,
                    )
                )
        except csv.Error as err:
            raise DataError(path, reader.line_num, f"malformed CSV: {err}") from None
    if not examples:
        raise DataError(path, None, "no examples")
    return examples


class SwagTask(ChoiceTask):
    name = "swag"
    default_learning_rate = 2e-5
    default_batch_size = 16

    def read(self, data_dir, split: str) -> list[ChoiceExample]:
        if split not in SPLIT_FILES:
            raise ValueError(f"swag has no split {split!r}; it has {sorted(SPLIT_FILES)}")
        return read_swag(require_file(Path(data_dir) / SPLIT_FILES[split], "SWAG"))

    def file_rows(self, path, kind, options) -> Iterator[tuple[int, dict[str, Any]]] | None:
        """A CSV with SWAG's columns as rows: `context` (sent1), `start` (sent2), the four
        `endings`, the gold `label` where the file has one."""
        if kind != "csv":
            return None
        with open(path, encoding="utf-8-sig", errors="replace", newline="") as handle:
            header = next(csv.reader(handle), [])
        if not all(column in header for column in REQUIRED):
            return None
        return (
            (int(e.guid.rsplit(":", 1)[1]),
             {"context": e.context, "start": e.start, "endings": list(e.endings)}
             | ({} if e.label is None else {"label": e.label}))
            for e in read_swag(path)
        )  # fmt: skip

    def prediction_file(self, split: str) -> str:
        return f"predictions_{split}.csv"

    def write_predictions(self, examples, predictions, path: Path) -> Path:
        lines = ["guid,prediction"] + [
            f"{e.guid},{p}" for e, p in zip(examples, predictions, strict=True)
        ]
        path.write_text("\n".join(lines) + "\n")
        return path
