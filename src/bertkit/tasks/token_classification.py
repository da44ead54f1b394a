"""`token-classification`: your own tagged words — entities of your own types in IOB1, IOB2 or
IOBES, or plain labels per word — from CoNLL-style column files (token … tag per line, blank
line between sentences, `-DOCSTART-` skipped) or from records holding a list of tokens and a
list of tags (JSON Lines, JSON, Parquet, a `datasets` folder: `--tokens-column`,
`--tags-column`).

The scheme is read off the training file (`--tag-scheme` says it instead) and every file is
checked against it: a tag sequence that breaks it (an `I-LOC` after `B-PER` in IOB2) is an
error naming the line. Entity schemes are learnt as IOB2 and scored with conlleval's
entity-level precision, recall and F1, per type too; plain tags by accuracy and macro F1.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.rows import (
    ColumnSentence,
    FileConfig,
    file_format,
    read_conll_columns,
    read_rows,
)
from bertkit.tasks.base import DataError
from bertkit.tasks.labels import per_class, sorted_names
from bertkit.tasks.own import OwnTask, write_jsonl
from bertkit.tasks.tagging import (
    TaggedSentence,
    WordTagger,
    check_scheme,
    detect_scheme,
    entity_types,
    iob_labels,
    to_iob2,
)

logger = logging.getLogger("bertkit")


class TokenClassificationTask(OwnTask, WordTagger):
    name = "token-classification"
    reading_fields = ("tokens_column", "tags_column", "format", "columns", "encoding",
                      "delimiter", "escape_char", "stride")  # fmt: skip

    def __init__(self, data=None) -> None:
        OwnTask.__init__(self, data)
        self.stride = self.data.stride
        self.tag_names: list[str] | None = None
        self.scheme = "iob2"
        self.type_counts: dict[str, int] = {}

    @property
    def metrics(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("accuracy", "macro_f1") if self.scheme == "plain" else ("f1",)

    def labels(self) -> list[str]:
        if self.tag_names is None:
            raise ValueError(f"{self.name}: no tag set yet (fitted(train) first)")
        return self.tag_names

    # ----------------------------------------------------------------- reading
    def read(self, data, split: str) -> list[TaggedSentence]:
        path = self.split_path(data, split)
        labelled = split in ("train", "dev")
        options = self.data.reading
        kind = file_format(path, options.format, self.default_file_format)
        if kind == "conll":
            return self._read_columns(path, labelled)
        d = self.data
        needed = [d.tokens_column] + ([d.tags_column] if labelled else [])
        optional = () if labelled else (d.tags_column,)
        sentences = []
        for row in read_rows(path, needed, options, optional=optional, format=kind):
            words = row.values[d.tokens_column]
            if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
                raise DataError(
                    path, row.line, f"column {d.tokens_column!r}: expected a list of words"
                )
            tags = row.values.get(d.tags_column)
            if tags is None:
                tags = []
            if not isinstance(tags, list) or any(isinstance(t, (list, dict)) for t in tags):
                raise DataError(
                    path, row.line, f"column {d.tags_column!r}: expected a list of tags"
                )
            if tags and len(tags) != len(words):
                raise DataError(
                    path, row.line,
                    f"column {d.tags_column!r}: {len(tags)} tags for {len(words)} tokens",
                )  # fmt: skip
            if not words:
                raise DataError(path, row.line, f"column {d.tokens_column!r}: no tokens")
            sentences.append(
                TaggedSentence(f"{path}:{row.line}", tuple(words), tuple(str(t) for t in tags))
            )
        if not sentences:
            raise DataError(path, None, "no rows")
        return sentences

    def _read_columns(self, path: Path, labelled: bool) -> list[TaggedSentence]:
        options = self.data.reading
        found, width = read_conll_columns(path, options, min_fields=2 if labelled else 1)
        token_at, tag_at = self.conll_columns(path, found, width, options)
        return [
            TaggedSentence(
                f"{path}:{s.line}",
                tuple(r[token_at] for r in s.rows),
                tuple(r[tag_at] for r in s.rows) if tag_at is not None else (),
                lines=tuple(s.lines),
            )
            for s in found
        ]

    def conll_columns(
        self, path: Path, found: Sequence[ColumnSentence], width: int, options: FileConfig
    ) -> tuple[int, int | None]:
        """The first field and the last, or the fields `--columns` names as the tokens and
        tags columns."""
        names = options.columns
        token_at, tag_at = 0, width - 1
        if names is not None:
            if len(names) != width:
                raise DataError(path, found[0].line,
                                f"{width} fields a line, --columns names {len(names)}")  # fmt: skip
            token_at = (
                names.index(self.data.tokens_column) if self.data.tokens_column in names else 0
            )
            tag_at = (
                names.index(self.data.tags_column) if self.data.tags_column in names else width - 1
            )
        return token_at, (tag_at if width > 1 and tag_at != token_at else None)

    def labelled(self, examples, split: str) -> bool:
        return bool(examples) and all(e.tags for e in examples)

    def item_keys(self) -> tuple[str, ...]:
        # the trained column first: a row's `text` must not shadow the words it was read from
        return tuple(dict.fromkeys((self.data.tokens_column, "text", "words", "tokens")))

    # ----------------------------------------------------------------- the tag set
    def fitted(self, train: Sequence[TaggedSentence]) -> TokenClassificationTask:
        if not train or not any(s.tags for s in train):
            raise ValueError(f"{self.data.train}: no tagged sentences")
        task = copy.copy(self)
        task.scheme = detect_scheme(train, self.data.tag_scheme)
        for sentence in train:
            check_scheme(sentence, task.scheme)
        if task.scheme == "plain":
            counts: dict[str, int] = {}
            for s in train:
                for t in s.tags:
                    counts[t] = counts.get(t, 0) + 1
            task.tag_names = sorted_names(counts)
            task.type_counts = {t: counts[t] for t in task.tag_names}
        else:
            types = entity_types(train)
            task.type_counts = dict(sorted(types.items()))
            task.tag_names = iob_labels(sorted(types))
        if self.data.class_weights == "balanced":
            words: dict[str, int] = {}
            for s in train:
                for t in task.gold(s):
                    words[t] = words.get(t, 0) + 1
            total = sum(words.values())
            task.weights = [total / (len(task.tag_names) * max(words.get(n, 0), 1))
                            for n in task.tag_names]  # fmt: skip
        return task

    def check_labels(self, sentence: TaggedSentence, tags: list[str], index: dict) -> None:
        check_scheme(sentence, self.scheme)
        for i, tag in enumerate(tags):
            if tag not in index:
                path, _, first = sentence.guid.rpartition(":")
                line = sentence.lines[i] if sentence.lines else int(first)
                raise DataError(
                    path, line, f"tag {sentence.tags[i]!r} never occurs in the training file "
                    f"(its tags: {', '.join(self.labels()[:20])})"
                )  # fmt: skip

    def data_summary(self, split, examples, features) -> dict[str, Any]:
        summary: dict[str, Any] = {"file": examples[0].guid.rpartition(":")[0],
                                   "examples": len(examples)}  # fmt: skip
        if split == "train":
            if self.scheme == "plain":
                summary["labels"] = dict(self.type_counts)
            else:
                summary.update(scheme=self.scheme, entity_types=dict(self.type_counts))
        per_example = np.bincount([f["_example"] for f in features], minlength=len(examples))
        long = per_example > 1
        if long.any():
            note = "" if self.stride else " one after another (--stride N overlaps them)"
            summary["windowed"] = {"examples": int(long.sum()),
                                   "windows": int(per_example[long].sum()), "note": note}  # fmt: skip
        return summary

    # ----------------------------------------------------------------- figures
    def score(self, examples, predictions) -> dict[str, float]:
        figures = self.tag_figures(examples, predictions)
        if self.scheme == "plain":
            figures["macro_f1"] = self._plain_report(examples, predictions)["macro_f1"]
        else:
            types = [k[3:] for k in figures if k.startswith("f1_")]
            figures["macro_f1"] = (
                float(np.mean([figures[f"f1_{t}"] for t in types])) if types else 0.0
            )
        return figures

    def _types(self, tags: Sequence[str]) -> list[str]:
        return [t if self.scheme == "plain" else ("O" if t == "O" else t[2:]) for t in tags]

    def _plain_report(self, examples, predictions) -> dict[str, Any]:
        names = self.labels()
        index = {n: i for i, n in enumerate(names)}
        gold = np.array([index[t] for e in examples for t in e.tags])
        guessed = np.array([index[t] for p in predictions for t in p])
        return per_class(gold, guessed, names)

    def report(self, examples, predictions) -> dict[str, Any]:
        if self.scheme == "plain":
            found = self._plain_report(examples, predictions)
            names = self.labels()
        else:
            figures = self.tag_figures(examples, predictions)
            support = entity_types([TaggedSentence("", e.words, tuple(to_iob2(e.tags)))
                                    for e in examples])  # fmt: skip
            kinds = sorted(set(self.type_counts) | set(support))
            found = {
                "per_class": {
                    k: {"precision": figures.get(f"precision_{k}", 0.0),
                        "recall": figures.get(f"recall_{k}", 0.0),
                        "f1": figures.get(f"f1_{k}", 0.0), "support": int(support.get(k, 0))}
                    for k in kinds
                },
                "micro_f1": figures["f1"],
                "macro_f1": self.score(examples, predictions)["macro_f1"],
            }  # fmt: skip
            names = ["O", *sorted(self.type_counts)]
            index = {n: i for i, n in enumerate(names)}
            gold = np.array(
                [index.get(t, 0) for e in examples for t in self._types(to_iob2(e.tags))]
            )
            guessed = np.array([index.get(t, 0) for p in predictions for t in self._types(p)])
            confusion = np.zeros((len(names), len(names)), dtype=np.int64)
            np.add.at(confusion, (gold, guessed), 1)
            found["confusion"] = confusion.tolist()
        found["confusion"] = {"labels": names, "matrix": found["confusion"],
                              "rows": "gold (per word)", "columns": "predicted"}  # fmt: skip
        return found

    def settings(self) -> dict[str, Any]:
        base = super().settings()
        if self.tag_names is not None:
            base.update(scheme=self.scheme, labels=self.tag_names)
        return base

    def with_settings(self, settings) -> TokenClassificationTask:
        task = self.restored(settings)
        assert isinstance(task, TokenClassificationTask)
        task.stride = task.data.stride
        if "labels" in settings:
            task.tag_names, task.scheme = list(settings["labels"]), settings.get("scheme", "iob2")
        return task

    def write_predictions(self, examples, predictions, path: Path) -> Path:
        """predictions.jsonl: each sentence's line, tokens, gold and predicted tags (IOB2 for
        entity schemes) and whether they agree."""
        rows = []
        for example, tags in zip(examples, predictions, strict=True):
            row: dict[str, Any] = {"line": int(example.guid.rpartition(":")[2] or 0),
                                   "tokens": list(example.words)}  # fmt: skip
            if example.tags:
                row["gold"] = self.gold(example)
            row["predicted"] = tags
            if example.tags:
                row["correct"] = row["gold"] == tags
            rows.append(row)
        return write_jsonl(path, rows)
