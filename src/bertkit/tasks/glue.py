"""The nine GLUE tasks, read from their TSV files as the GLUE download script lays them out.

Each file is split on tabs only — no CSV quoting: MRPC and SST-2 sentences hold bare `"`
characters. A header line is checked, not just skipped, so a file from another task (or a
re-export with other columns) is caught. MRPC's header starts with a UTF-8 BOM.

| task | train/dev columns (0-based) | label | test (no labels) |
|---|---|---|---|
| CoLA | no header; 1 label, 3 sentence (4 columns) | 0/1 | `index sentence` |
| SST-2 | `sentence label` | 0/1 | `index sentence` |
| MRPC | `Quality #1 ID #2 ID #1 String #2 String` | 0/1 | `index #1 ID #2 ID #1 String #2 String` |
| STS-B | 10 columns; 7, 8 sentences, 9 score | 0–5 | 9 columns |
| QQP | `id qid1 qid2 question1 question2 is_duplicate` | 0/1 | `id question1 question2` |
| MNLI | 12 (train) or 16 (dev) columns; 8, 9 sentences, last gold_label | 3 classes | 10 |
| QNLI | `index question sentence label` | (not_)entailment | 3 |
| RTE | `index sentence1 sentence2 label` | (not_)entailment | 3 |
| WNLI | `index sentence1 sentence2 label` | 0/1 | 3 |

Test-set predictions go out in the GLUE submission format: `index<TAB>prediction` under the
file name the GLUE server expects (`CoLA.tsv`, `MNLI-m.tsv`, ...).
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertkit.core.losses import sequence_loss
from bertkit.tasks import metrics
from bertkit.tasks.base import DataError, Feature, Task, head_logits, read_text, require_file
from bertkit.tasks.text_classification import classification_answers

logger = logging.getLogger("bertkit")


@dataclass(frozen=True)
class SentenceExample:
    guid: str  # "file:line"
    text_a: str
    text_b: str | None
    label: str | float | None  # None on test files
    index: str | None = None  # the test file's own index, for the submission file


@dataclass(frozen=True)
class Layout:
    """Where a split's fields are: column indices (negative counts from the end)."""

    header: tuple[str, ...] | None  # the first columns of the header line; None: no header
    min_columns: int
    text_a: int
    text_b: int | None
    label: int | None
    index: int | None = None


@dataclass(frozen=True)
class GlueSpec:
    name: str
    folder: str  # the official folder name, e.g. "MRPC"
    labels: tuple[str, ...] | None  # None: regression
    metrics: tuple[str, ...]
    train: Layout
    test: Layout
    dev_files: tuple[tuple[str, str], ...] = (("dev", "dev.tsv"),)  # (split, file)
    test_files: tuple[tuple[str, str], ...] = (("test", "test.tsv"),)  # (split, file)
    submission: dict[str, str] | None = None  # test split -> submission file name


_PAIR_TEST = Layout(("index",), 3, 1, 2, None, index=0)
_NLI = ("entailment", "not_entailment")

_BINARY = ("0", "1")

# name, folder, labels (None: regression), metrics, the train and dev files' layout, the test
# files' layout (and MNLI's two dev and test sets)
GLUE: dict[str, GlueSpec] = {spec.name: spec for spec in (
    GlueSpec("cola", "CoLA", _BINARY, ("mcc", "accuracy"), Layout(None, 4, 3, None, 1),
             Layout(("index", "sentence"), 2, 1, None, None, index=0)),
    GlueSpec("sst2", "SST-2", _BINARY, ("accuracy",), Layout(("sentence", "label"), 2, 0, None, 1),
             Layout(("index", "sentence"), 2, 1, None, None, index=0)),
    GlueSpec("mrpc", "MRPC", _BINARY, ("f1", "accuracy"),
             Layout(("Quality", "#1 ID", "#2 ID"), 5, 3, 4, 0),
             Layout(("index", "#1 ID", "#2 ID"), 5, 3, 4, None, index=0)),
    GlueSpec("stsb", "STS-B", None, ("pearson", "spearman"),
             Layout(("index", "genre", "filename"), 10, 7, 8, 9),
             Layout(("index", "genre", "filename"), 9, 7, 8, None, index=0)),
    GlueSpec("qqp", "QQP", _BINARY, ("f1", "accuracy"), Layout(("id", "qid1", "qid2"), 6, 3, 4, 5),
             Layout(("id", "question1", "question2"), 3, 1, 2, None, index=0)),
    GlueSpec("mnli", "MNLI", ("contradiction", "entailment", "neutral"), ("accuracy",),
             Layout(("index", "promptID", "pairID"), 12, 8, 9, -1),
             Layout(("index", "promptID", "pairID"), 10, 8, 9, None, index=0),
             dev_files=(("dev", "dev_matched.tsv"), ("dev_mismatched", "dev_mismatched.tsv")),
             test_files=(("test", "test_matched.tsv"), ("test_mismatched", "test_mismatched.tsv")),
             submission={"test": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}),
    GlueSpec("qnli", "QNLI", _NLI, ("accuracy",),
             Layout(("index", "question", "sentence"), 4, 1, 2, 3), _PAIR_TEST),
    GlueSpec("rte", "RTE", _NLI, ("accuracy",),
             Layout(("index", "sentence1", "sentence2"), 4, 1, 2, 3), _PAIR_TEST),
    GlueSpec("wnli", "WNLI", _BINARY, ("accuracy",),
             Layout(("index", "sentence1", "sentence2"), 4, 1, 2, 3), _PAIR_TEST),
)}  # fmt: skip
_SUBMISSION = {"sst2": "SST-2", "stsb": "STS-B"}


def read_tsv(
    path: str | os.PathLike,
    layout: Layout,
    labels: Sequence[str] | None,
    *,
    regression: bool = False,
    on_error: str = "fail",
) -> list[SentenceExample]:
    """Examples of one GLUE TSV file. A malformed row raises `DataError` naming the file and
    line; with `on_error="skip"` it is logged and left out."""
    path = Path(path)
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', got {on_error!r}")
    examples: list[SentenceExample] = []
    skipped = 0
    width = None if layout.header is not None else layout.min_columns  # columns every row has
    with io.StringIO(read_text(path), newline="") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.rstrip("\r\n")
            if number == 1 and layout.header is not None:
                width = len(line.split("\t"))
                fields = tuple(line.split("\t")[: len(layout.header)])
                if fields != layout.header:
                    raise DataError(
                        path,
                        1,
                        f"header starts {fields!r}, expected {layout.header!r} (another task's "
                        "file, or not the GLUE layout?)",
                    )
                continue
            if not line.strip():
                continue
            try:
                examples.append(_row(line, layout, labels, regression, path, number, width))
            except DataError:
                if on_error == "fail":
                    raise
                skipped += 1
                if skipped <= 5:
                    logger.warning("skipped a malformed row", exc_info=True)
    if skipped:
        logger.warning("%s: skipped %d malformed rows", path, skipped)
    if not examples:
        raise DataError(path, None, "no examples")
    return examples


def _row(line, layout: Layout, labels, regression, path, number, width=None) -> SentenceExample:
    columns = line.split("\t")
    if len(columns) < layout.min_columns:
        raise DataError(
            path, number, f"{len(columns)} tab-separated columns, expected {layout.min_columns}"
        )
    if width is not None and len(columns) > width:  # reading on would cut a sentence short
        raise DataError(
            path,
            number,
            f"{len(columns)} tab-separated columns, the file's rows have {width}: "
            "a tab inside a sentence?",
        )
    text_a = columns[layout.text_a].strip()
    text_b = columns[layout.text_b].strip() if layout.text_b is not None else None
    if not text_a or (layout.text_b is not None and not text_b):
        raise DataError(path, number, "an empty sentence")
    label: str | float | None = None
    if layout.label is not None:
        raw = columns[layout.label].strip()
        if regression:
            try:
                label = float(raw)
            except ValueError:
                raise DataError(path, number, f"score {raw!r} is not a number") from None
            if not 0.0 <= label <= 5.0:
                raise DataError(path, number, f"score {label} is outside 0-5")
        else:
            if raw not in labels:
                raise DataError(path, number, f"label {raw!r} is not one of {list(labels)}")
            label = raw
    index = columns[layout.index].strip() if layout.index is not None else None
    return SentenceExample(f"{path.name}:{number}", text_a, text_b, label, index)


class GlueTask(Task):
    """A GLUE task: `[CLS] A [SEP] (B [SEP])`, a classifier (or regressor) on the pooled [CLS]."""

    head = "BertForSequenceClassification"

    def __init__(self, spec: GlueSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.metrics = spec.metrics
        if self.regression:
            # random batches: STS-B's length goes with its genre and score, and length-sorted
            # batches cost one epoch 4.1 points over 8 seeds (docs/results, "the head's
            # initialisation was the gap")
            self.default_bucket_batches = 1

    @property
    def regression(self) -> bool:
        return self.spec.labels is None

    def labels(self) -> list[str]:
        return list(self.spec.labels) if self.spec.labels is not None else ["score"]

    def dev_splits(self) -> tuple[str, ...]:
        return tuple(split for split, _ in self.spec.dev_files)

    def split_file(self, split: str) -> str:
        files = dict((("train", "train.tsv"), *self.spec.dev_files, *self.spec.test_files))
        if split not in files:
            raise ValueError(f"{self.name} has no split {split!r}; it has {sorted(files)}")
        return files[split]

    def read(self, data_dir, split: str, on_error: str = "fail") -> list[SentenceExample]:
        path = require_file(Path(data_dir) / self.split_file(split), f"GLUE {self.spec.folder}")
        test = split.startswith("test")
        return read_tsv(
            path,
            self.spec.test if test else self.spec.train,
            self.spec.labels,
            regression=self.regression,
            on_error=on_error,
        )

    def featurize(self, examples, tokenizer, max_seq_length: int) -> list[Feature]:
        pairs = examples[0].text_b is not None
        encoded = tokenizer(
            [e.text_a for e in examples],
            [e.text_b for e in examples] if pairs else None,
            max_length=max_seq_length,
            truncation="longest_first",
        )
        label_ids = {name: i for i, name in enumerate(self.labels())}
        features = []
        for i, example in enumerate(examples):
            feature = {
                "input_ids": encoded["input_ids"][i],
                "token_type_ids": encoded["token_type_ids"][i],
                "attention_mask": encoded["attention_mask"][i],
            }
            if example.label is not None:
                feature["labels"] = (
                    float(example.label) if self.regression else label_ids[example.label]
                )
            features.append(feature)
        return features

    def loss(self, model, batch):
        logits = head_logits(model, batch)
        problem = "regression" if self.regression else "single_label_classification"
        total = sequence_loss(logits, batch["labels"], problem, reduction="sum")
        return total, torch.tensor(len(logits))

    def outputs(self, model, batch):
        return {"logits": head_logits(model, batch)}

    def predictions(self, examples, features, outputs) -> list:
        logits = outputs["logits"]
        if self.regression:
            return [float(v) for v in logits[:, 0]]
        names = self.labels()
        return [names[i] for i in logits.argmax(-1)]

    def score(self, examples, predictions) -> dict[str, float]:
        gold = [e.label for e in examples]
        if self.regression:
            return {
                "pearson": metrics.pearson(predictions, gold),
                "spearman": metrics.spearman(predictions, gold),
            }
        result = {"accuracy": metrics.accuracy(predictions, gold)}
        if "f1" in self.metrics:
            result["f1"] = metrics.f1_binary(predictions, gold, positive="1")
        if "mcc" in self.metrics:
            result["mcc"] = metrics.matthews_corrcoef(predictions, gold)
        return result

    def submission_name(self, split: str) -> str:
        if self.spec.submission and split in self.spec.submission:
            return self.spec.submission[split]
        return f"{_SUBMISSION.get(self.name, self.spec.folder)}.tsv"

    def prediction_file(self, split: str) -> str:
        """Test splits: the file name the GLUE server expects; dev: predictions_<split>.tsv."""
        return (
            self.submission_name(split) if split.startswith("test") else f"predictions_{split}.tsv"
        )

    # ----------------------------------------------------------------- raw inputs
    def file_rows(self, path, kind, options) -> Iterator[tuple[int, dict[str, Any]]] | None:
        """A TSV file in this task's GLUE layout (its train/dev or its test header; CoLA's
        header-less rows by their label column) as rows: the test file's `index`, `text` (and
        `text_pair`), the gold `label` where the file has one."""
        if kind != "tsv":
            return None
        with open(path, encoding="utf-8-sig", errors="replace") as handle:
            first = handle.readline().rstrip("\r\n").split("\t")
        layout = next(
            (lay for lay in (self.spec.train, self.spec.test)  # (QNLI's share a header)
             if lay.header is not None and tuple(first[: len(lay.header)]) == lay.header
             and len(first) >= lay.min_columns),
            None,
        )  # fmt: skip
        train = self.spec.train
        if layout is None and train.header is None and len(first) == train.min_columns:
            assert train.label is not None
            if first[train.label].strip() in self.labels():
                layout = train
        if layout is None:
            return None
        return self._tsv_rows(path, layout)

    def _tsv_rows(self, path: Path, layout: Layout) -> Iterator[tuple[int, dict[str, Any]]]:
        regression = self.regression
        for example in read_tsv(path, layout, self.spec.labels, regression=regression):
            values: dict[str, Any] = {} if example.index is None else {"index": example.index}
            values["text"] = example.text_a
            if example.text_b is not None:
                values["text_pair"] = example.text_b
            if example.label is not None:
                values["label"] = example.label
            yield int(example.guid.rsplit(":", 1)[1]), values

    def example_of(self, item, n: int) -> SentenceExample:
        pair = self.spec.train.text_b is not None
        if isinstance(item, dict):
            item = (item["text"], item["text_pair"]) if "text_pair" in item else item.get("text")
        if pair and (
            isinstance(item, str) or not isinstance(item, (list, tuple)) or len(item) != 2
        ):
            raise ValueError(f"item {n}: {self.name} takes sentence pairs (a, b)")
        if not pair and not isinstance(item, str):
            raise ValueError(f"item {n}: {self.name} takes single sentences")
        text_a, text_b = item if pair else (item, None)
        return SentenceExample(str(n), text_a, text_b, None)

    def answer(self, examples, features, outputs) -> list[dict]:
        problem = "regression" if self.regression else "single-label"
        return classification_answers(outputs["logits"], self.labels(), problem)

    def items_of(self, texts, question, context) -> list:
        if question or context:
            raise ValueError(f"{self.name} takes texts, not --question/--context")
        if self.spec.train.text_b is not None:
            if len(texts) != 2:
                raise ValueError(
                    f"{self.name} takes two texts: bertkit predict --model DIR 'A' 'B'"
                )
            return [tuple(texts)]
        return list(texts)

    def write_predictions(self, examples, predictions, path: Path) -> Path:
        """`index<TAB>prediction`, the GLUE submission layout (the dev rows get their line
        numbers as index)."""
        lines = ["index\tprediction"]
        for n, (example, prediction) in enumerate(zip(examples, predictions, strict=True)):
            index = example.index if example.index is not None else str(n)
            value = f"{prediction:.3f}" if self.regression else prediction
            lines.append(f"{index}\t{value}")
        path.write_text("\n".join(lines) + "\n")
        return path
