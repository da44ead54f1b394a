"""Raw text in, labels / spans / tags out, from a checkpoint `bertkit finetune` wrote.

    predictor = Predictor("runs/mrpc")
    predictor([("The cat sat.", "A cat was sitting.")])          # one pair (a pair task)
    Predictor("runs/sst2")(["a gripping, funny film"])          # single sentences
    Predictor("runs/squad1")([{"question": "Who?", "context": "Ann did."}])
    Predictor("runs/conll")(["EU rejects German call"])         # entities with offsets
    Predictor("runs/swag")([{"context": "She opens the door.", "endings": ["...", ...]}])
    Predictor("runs/topics")(["Stocks rally on rate cut"])     # your own labels, by name

Each item gets a dict (JSON-ready), as the task answers (`Task.answer`): a classifier its
`label`, `score` (the label's probability) and `probabilities`; multi-label every `labels` over
its threshold; a tagger per word its tag and score, and `entities` with type, character
offsets and score; SQuAD the answer span. The task, its label names, `max_seq_length` and
what was tuned on validation (SQuAD 2.0's null threshold, multi-label thresholds) come from
the checkpoint (its task record and config.json).

`predict_file` streams a whole file (CSV, TSV, JSON Lines, JSON, Parquet, a paper task's own
files, CoNLL columns for a tagger, or stdin one text a line) to JSON Lines, CSV or (a tagger's)
CoNLL columns, a chunk at a time, with a progress bar.
"""

from __future__ import annotations

import csv
import functools
import itertools
import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertkit._io import atomic_path
from bertkit.inference.loader import OnnxModel, load
from bertkit.rows import FileConfig, file_format, read_jsonl, read_rows
from bertkit.settings import RuntimeConfig, Settings, flat_names, nested, replaced, setting
from bertkit.tasks.base import DataError, Task, run_outputs
from bertkit.tasks.labels import softmax
from bertkit.tasks.saved import HeadConfig, SavedClassifier
from bertkit.tasks.tagging import WordTagger
from bertkit.tasks.text_classification import pool_windows

# the label of a cross-encoder's classes that means "relevant" (`Predictor.rerank` scores it)
RELEVANT = ("1", "relevant", "entailment", "paraphrase", "yes", "true", "positive")


@flat_names
@dataclass
class PredictConfig(Settings):
    """How a model is run (`Predictor`) and how `predict_file` reads a file: the `bertkit
    predict` flags are these fields, and `Predictor(model, batch_size=8)` takes them by name."""

    text_column: str | None = setting(
        None, "with --input: the column the model reads (default: as trained)"
    )
    text_pair_column: str | None = setting(None, "with --input: a second text column")
    # how --input is read: as the model's training files were, unless a flag says otherwise
    reading: FileConfig = nested(
        FileConfig,
        format=None,
        encoding=None,
        max_cell_chars=None,
        helps={
            "format": "of --input (default: as trained, else auto)",
            "columns": "names of a header-less --input file's columns (default: as trained; '': "
            "the first line names them)",
            "encoding": "of --input (default: as trained, else utf-8)",
            "delimiter": "CSV field separator of --input (default: as trained)",
            "escape_char": "CSV: a character escaping quotes in --input (default: as trained)",
            "max_cell_chars": "longest cell of --input (default: as trained, else 1,000,000)",
        },
    )
    rerank: bool = setting(
        False,
        'with --input and a cross-encoder: each row\'s "query" and "texts" (a list) get their '
        '"ranking" (index and score, best first)',
    )
    raw_scores: bool = setting(
        False, "with --rerank: a cross-encoder's raw logits, not its activation's scores"
    )
    heads: HeadConfig = nested(HeadConfig)
    progress: bool = setting(True, "a progress bar over --input's rows")
    batch_size: int = setting(32, "inputs per model call", check="positive")
    runtime: RuntimeConfig = nested(RuntimeConfig)


class Predictor:
    def __init__(
        self, model: str | os.PathLike, config: PredictConfig | None = None, **settings: Any
    ) -> None:
        """A model to predict with, run as `config` (or PredictConfig's fields by name) says:
        `backend="onnx"` runs `model/model.onnx` (written by `bertkit export --onnx`) with
        ONNX Runtime on the CPU instead of PyTorch, everything else the same; `precision` is as
        for training (bertkit.precision): `auto` is bf16 autocast where the device runs it
        natively, fp32 elsewhere; an ONNX export runs as it was exported."""
        self.config = config = replaced(config or PredictConfig(), **settings)
        self.loaded = loaded = load(
            model, fine_tuned=True, task_options=vars(config.heads), **vars(config.runtime)
        )
        assert loaded.task is not None and loaded.max_seq_length is not None
        self.task, self.max_seq_length = loaded.task, loaded.max_seq_length
        self.tokenizer = loaded.tokenizer
        self.model: torch.nn.Module | OnnxModel = loaded.model
        self.device, self.precision = loaded.device, loaded.precision
        self.batch_size = config.batch_size
        labels = loaded.config.id2label
        self.labels = [labels[i] for i in sorted(labels)] if labels else None

    def reading(self, given: FileConfig | None = None) -> FileConfig:
        """How this model reads a file (`Loaded.reading`): the reading settings saved with it,
        each setting `given` (default: this predictor's `reading`) in place of its saved
        value."""
        return self.loaded.reading(given or self.config.reading)

    def items_from(
        self,
        path: str | os.PathLike | None = None,
        texts: Sequence[str] = (),
        question: str | None = None,
        context: str | None = None,
    ) -> list[Any]:
        """What `bertkit predict` reads, as items for this model's task: a JSON-lines file, or
        a question and its context (SQuAD), or two texts (a pair task), or texts."""
        if path is not None:
            return read_jsonl(path)
        return self.task.items_of(texts, question, context)

    def __call__(self, items: Sequence[Any]) -> list[dict[str, Any]]:
        items = [_plain(item) for item in items]
        if not items:
            return []
        examples = [self.task.example_of(item, n) for n, item in enumerate(items)]
        features = self.task.featurize(examples, self.tokenizer, self.max_seq_length)
        return self.task.answer(examples, features, self.outputs(features))

    def answer_rows(self, source: Any, rows: Sequence[tuple[int, dict[str, Any]]],
                    text_column: str | None = None, pair_column: str | None = None,
                    rerank: bool = False) -> list[dict[str, Any]]:  # fmt: skip
        """Each input row (its line in `source`, its columns) with its answer: the row's
        columns followed by the answer's fields (one named like an input column as
        `predicted_<name>`; a tagger's `words`, given as a list, not twice). `text_column` (and
        `pair_column`) name what the model reads (default: the columns it was trained on);
        `rerank`: each row's "query" and "texts" ranked (`ranking`: index and score, best
        first), the pairs of all the rows scored together. A row the task cannot read is a
        DataError naming the source and line. What `predict_file` writes and the corpus jobs
        store."""
        if rerank:
            queries = [_query_and_texts(source, line, values) for line, values in rows]
            scores = self.relevance(
                [(q, text) for q, texts in queries for text in texts], raw=self.config.raw_scores
            )
            answered, start = [], 0
            for (_, values), (_, texts) in zip(rows, queries, strict=True):
                answered.append(values | {"ranking": ranked(scores[start : start + len(texts)])})
                start += len(texts)
            return answered
        examples = []
        for line, values in rows:
            try:
                item = _item(values, text_column, pair_column)
                examples.append(self.task.example_of(item, line - 1))
            except (ValueError, KeyError, TypeError) as err:
                message = str(err).removeprefix(f"item {line - 1}: ")
                raise DataError(source, line, message) from None
        features = self.task.featurize(examples, self.tokenizer, self.max_seq_length)
        answers = self.task.answer(examples, features, self.outputs(features))
        answered = []
        for (_, values), answer in zip(rows, answers, strict=True):
            row = dict(values) if "input" not in values or len(values) > 1 else {}
            for key, value in answer.items():
                if key not in values:
                    row[key] = value
                elif key != "words" or values[key] != value:
                    row[f"predicted_{key}"] = value
            answered.append(row)
        return answered

    def check(self, item: Any, n: int = 0) -> None:
        """Refuse (ValueError, KeyError or TypeError naming item `n`) an input this model's
        task does not read, before it is batched with others."""
        self.task.example_of(_plain(item), n)

    @functools.cached_property
    def rerank_label(self) -> str | None:
        """What `rerank` scores: "score" (a cross-encoder of one output, a regressor of text
        pairs), the relevant class of a pair classifier (by name: RELEVANT; else its last
        label), or None: not a cross-encoder."""
        task = self.task
        if task.head != "BertForSequenceClassification":
            return None
        try:
            task.example_of(("a query", "a text"), 0)
        except (ValueError, TypeError, KeyError, NotImplementedError):
            return None  # does not read pairs
        if isinstance(task, SavedClassifier):
            if len(task.labels()) == 1:
                return "score"
            if task.problem != "single-label":
                return None
        elif getattr(task, "problem", None) == "regression" or getattr(task, "regression", False):
            return "score"
        if not self.labels or getattr(task, "problem", "single-label") != "single-label":
            return None
        return next((n for n in self.labels if str(n).lower() in RELEVANT), self.labels[-1])

    def relevance(self, pairs: Sequence[tuple[str, str]], raw: bool = False) -> list[float]:
        """Each (query, text) pair's relevance, in order: a cross-encoder's score
        (`CrossEncoder.predict`'s: its activation of its one output), a pair classifier's
        probability of its relevant class (`rerank_label`), a regressor's score; `raw`: the
        logit itself."""
        label = self.rerank_label
        if label is None:
            raise ValueError(
                f"{self.task.name}: not a cross-encoder (a model fine-tuned on text pairs), "
                "so it does not rerank"
            )
        if not pairs:
            return []
        examples = [self.task.example_of(_plain(pair), n) for n, pair in enumerate(pairs)]
        features = self.task.featurize(examples, self.tokenizer, self.max_seq_length)
        logits = self.outputs(features)["logits"]
        if len(features) != len(examples):  # windows of over-long pairs: their mean
            logits = pool_windows(logits, features, len(examples))
        if isinstance(self.task, SavedClassifier):
            return self.task.relevance(logits, raw).tolist()
        column = 0 if label == "score" else self.labels.index(label)  # type: ignore[union-attr]
        if label == "score" or raw:
            return logits[:, column].tolist()
        return softmax(logits)[:, column].tolist()

    def rerank(self, query: str, texts: Sequence[str]) -> list[dict[str, Any]]:
        """Each text's relevance to `query` ({"index", "score"}), best first."""
        return ranked(self.relevance([(query, text) for text in texts]))

    def outputs(self, features: list) -> dict:
        """The model's raw outputs of `features` (in batches, at this predictor's precision)."""
        dtype = self.precision.dtype
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
            return run_outputs(self.task, self.model, features, self.batch_size, self.device)


def _plain(item: Any) -> Any:
    """The JSONL shape of `predict --input` ({"text": a[, "text_pair": b]}) as a text or pair."""
    if isinstance(item, dict) and "text" in item and set(item) <= {"text", "text_pair"}:
        return (item["text"], item["text_pair"]) if "text_pair" in item else item["text"]
    return item


# --------------------------------------------------------------------------- files at scale
def predict_file(
    predictor: Predictor,
    source: str | os.PathLike,
    output: str | os.PathLike | None = None,
    *,
    chunk: int = 2048,
    **settings: Any,
) -> int:
    """Predict every row of `source` (CSV, TSV, JSON Lines, JSON, Parquet, a `datasets` folder;
    "-": stdin, one text a line; a file in the task's own layout, `Task.file_rows`: GLUE's
    TSV, SQuAD's JSON, SWAG's CSV, a tagger's CoNLL columns, each sentence a row of its
    "words" and, where the file has them, "tags") into `output` (.jsonl or .csv/.tsv; a
    tagger's also .conll, a word a line with the file's tag, if any, and the predicted one:
    conlleval's input; None or "-": JSON Lines on stdout), streaming `chunk` rows at a time, as
    the predictor's `PredictConfig` says (its fields by name in `settings` replace it here).
    Each output row is the input row's columns followed by the answer's fields (an answer
    field named like an input column is written as `predicted_<name>`; a tagger's `words`, given
    as a list, are not written twice); in CSV, lists and objects are JSON. `text_column` (and
    `text_pair_column`) name the input of the model; by default the model reads the columns it
    was trained on (`text`, `text_pair` for the paper's tasks), and a row of other columns
    without them is an error (a row of `text` alone, or `text` and `text_pair`, is the generic
    input every model reads). The file is read as the model read its training files, each
    reading setting given (`format`, `columns`, ...) in place of its saved value
    (`Predictor.reading`). With `rerank` (a cross-encoder), each row holds a `query` and its
    `texts` (a list; in CSV a JSON list) and gets their `ranking` (`Predictor.rerank`: index
    and score, best first). Returns the rows written."""
    config = replaced(predictor.config, **settings)
    text_column, text_pair_column = config.text_column, config.text_pair_column
    rerank, progress = config.rerank, config.progress
    if rerank and predictor.rerank_label is None:
        raise ValueError(f"{predictor.task.name}: --rerank takes a cross-encoder (a model "
                         "fine-tuned on text pairs)")  # fmt: skip
    rows = _input_rows(source, predictor.reading(config.reading), predictor.task)
    target = None if output is None or str(output) == "-" else Path(output)
    kind = "jsonl" if target is None else file_format(target, "auto", default="jsonl")
    if kind == "conll" and (rerank or not isinstance(predictor.task, WordTagger)):
        raise ValueError(f"{target}: CoNLL columns hold tagged words, and {predictor.task.name} "
                         "answers no tags: write .jsonl, .csv or .tsv")  # fmt: skip
    if kind not in ("jsonl", "csv", "tsv", "conll"):
        raise ValueError(f"{target}: predictions are written as .jsonl, .csv, .tsv or (a "
                         "tagger's) .conll")  # fmt: skip
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(desc="predict", unit=" rows", file=sys.stderr)
    written = 0
    with RowWriter(target, kind) as writer:
        while batch := list(itertools.islice(rows, chunk)):
            for row in predictor.answer_rows(source, batch, text_column, text_pair_column, rerank):
                writer.write(row)
            written += len(batch)
            if bar is not None:
                bar.update(len(batch))
    if bar is not None:
        bar.close()
    return written


def ranked(scores: Sequence[float]) -> list[dict[str, Any]]:
    """{"index", "score"} of each score, best first."""
    return sorted(({"index": i, "score": s} for i, s in enumerate(scores)),
                  key=lambda e: -e["score"])  # fmt: skip


def _query_and_texts(source, line: int, values: dict[str, Any]) -> tuple[str, list[str]]:
    query, texts = values.get("query"), values.get("texts")
    if isinstance(texts, str) and texts.lstrip().startswith("["):  # a CSV cell of JSON
        try:
            texts = json.loads(texts)
        except json.JSONDecodeError:
            pass
    if not isinstance(query, str) or not query.strip():
        raise DataError(source, line, '--rerank: no "query" (a non-empty text) in this row')
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise DataError(source, line, '--rerank: "texts" must be a non-empty list of texts')
    return query, texts


def _input_rows(source, options: FileConfig, task: Task) -> Iterator[tuple[int, dict[str, Any]]]:
    if str(source) == "-":
        for number, line in enumerate(sys.stdin, start=1):
            text = line.rstrip("\r\n")
            if text.strip():
                yield number, {"text": text}
        return
    path = Path(source)
    kind = file_format(path, options.format, task.default_file_format)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    own = task.file_rows(path, kind, options)  # the task's own layout: GLUE TSV, SQuAD, CoNLL
    if own is not None:
        yield from own
        return
    if kind == "conll":
        raise DataError(path, None, f"CoNLL columns hold words to tag; {task.name} reads "
                        "texts: give a CSV, TSV, JSON Lines or Parquet file, or --format")  # fmt: skip
    # a JSON line may be a bare text or a list of words, as `predict --input` takes them
    for row in read_rows(path, (), options, every_column=True, format=kind, bare="input"):
        yield row.line, row.values


def _item(values: dict[str, Any], text_column: str | None, pair_column: str | None) -> Any:
    """What the task reads of an input row: the named text column(s), else the row itself."""
    if "input" in values and len(values) == 1:
        return values["input"]
    for column in (text_column, pair_column):
        if column is not None and column not in values:
            from bertkit.rows import missing_column

            raise ValueError(missing_column(column, list(values), "row's columns are"))
    if text_column is not None:
        return (values[text_column], values[pair_column]) if pair_column else values[text_column]
    return _plain(values)


class RowWriter:
    """JSON Lines or CSV/TSV rows to a file (written under a temporary name and renamed into
    place when all went well: a failed run leaves no half file) or to stdout."""

    def __init__(self, target: Path | None, kind: str) -> None:
        self.target, self.kind = target, kind
        self.header: list[str] | None = None

    def __enter__(self) -> RowWriter:
        if self.target is None:
            self.handle: Any = sys.stdout
            return self
        self._atomic = atomic_path(self.target)
        self.tmp = self._atomic.__enter__()
        self.handle = open(self.tmp, "w", encoding="utf-8", newline="")
        if self.kind in ("csv", "tsv"):
            self.csv = csv.writer(self.handle, delimiter="\t" if self.kind == "tsv" else ",")
        return self

    def write(self, row: dict[str, Any]) -> None:
        if self.kind == "conll":  # a word a line: the file's tag (if any), then the predicted
            gold = row["tags"] if "predicted_tags" in row else None
            predicted = row["predicted_tags"] if gold is not None else row["tags"]
            for i, word in enumerate(row["words"]):
                fields = [word, *([gold[i]] if gold is not None else []), predicted[i]]
                self.handle.write(" ".join(fields) + "\n")
            self.handle.write("\n")
            return
        if self.kind not in ("csv", "tsv"):
            self.handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            return
        if self.header is None:
            self.header = list(row)
            self.csv.writerow(self.header)
        self.csv.writerow([_cell(row.get(k)) for k in self.header])

    def __exit__(self, kind, error, traceback) -> None:
        if self.target is None:
            sys.stdout.flush()
            return
        self.handle.close()
        self._atomic.__exit__(kind, error, traceback)


def _cell(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else value
