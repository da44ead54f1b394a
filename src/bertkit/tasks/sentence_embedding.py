"""`sentence-embedding`: a bi-encoder (bertkit.core.embedding) trained on your own text pairs.

    bertkit finetune sentence-embedding --model M --train pairs.csv --validation dev.csv \\
        --text-column anchor --text-pair-column positive [--negative-column hard_negative] \\
        [--label-column score --score-range 0,5] --out runs/emb

Pairs (an anchor and its positive, optionally a hard negative) train with in-batch negatives:
each anchor's positive against every other positive and negative of the batch, softmax
cross-entropy over the scaled cosines (scale 20: sentence-transformers'
MultipleNegativesRankingLoss; `--symmetric-loss` adds the positives' side). Pairs with a score
(a label column the training file has, scaled from `--score-range` to [0, 1]) train with the
cosine-similarity objective: the squared error of the pair's cosine to its score. Validation:
each anchor's positive ranked among all validation positives (recall@1, recall@10, MRR@10), or
the Spearman and Pearson correlations of cosine and score; before training too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from bertkit.rows import read_rows
from bertkit.tasks import metrics
from bertkit.tasks.base import DataError, Feature
from bertkit.tasks.own import OwnTask, text_cell, write_jsonl

SCALE = 20.0  # in-batch negatives: the cosines' scale before the softmax (sentence-transformers')
SIDES = ("", "positive_", "negative_")  # feature key prefixes: anchor, positive, hard negative


@dataclass(frozen=True, slots=True)
class PairExample:
    source: str
    line: int
    anchor: str
    positive: str | None = None
    negative: str | None = None
    score: float | None = None  # scaled to [0, 1]


class SentenceEmbeddingTask(OwnTask):
    name = "sentence-embedding"
    head = "BertForSentenceEmbedding"
    reports = False
    default_learning_rate = 2e-5
    default_epochs = 1
    default_bucket_batches = 1  # random batches: length-sorted ones make easy in-batch negatives
    padded_inputs: ClassVar[dict[str, int]] = {
        f"{side}{key}": 0 for side in SIDES for key in ("input_ids", "attention_mask")
    }
    reading_fields = ("text_column", "text_pair_column", "negative_column", "label_column",
                      "score_range", "pooling", "dims", "format", "columns", "encoding",
                      "delimiter", "escape_char")  # fmt: skip

    def __init__(self, data=None) -> None:
        super().__init__(data)
        self.scored: bool | None = None  # decided by the training file: a score column or not

    @property
    def metrics(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("spearman",) if self.scored else ("mrr@10",)

    scores_before_training = True  # a retrieval baseline: the model before any step

    def model_config(self, config):
        return config

    def configure(self, model, max_seq_length: int) -> None:
        model.pooling = self.data.pooling
        model.max_seq_length = max_seq_length

    # ----------------------------------------------------------------- reading
    def read(self, data, split: str) -> list[PairExample]:
        path = self.split_path(data, split)
        d = self.data
        labelled = split in ("train", "dev")
        needed = [d.text_column] + ([d.text_pair_column] if labelled and d.text_pair_column else [])
        if labelled and not d.text_pair_column:
            raise ValueError(
                f"{self.name} trains on pairs: --text-pair-column names the positive's column "
                f"(--text-column {d.text_column} names the anchor's)"
            )
        optional = [c for c in (d.negative_column, d.label_column) if c]
        low, high = self.score_range()
        examples = []
        for row in read_rows(path, needed, d.reading, optional=optional):
            v = row.values
            anchor = text_cell(path, row.line, d.text_column, v[d.text_column])
            positive = negative = score = None
            if labelled:
                assert d.text_pair_column is not None
                positive = text_cell(path, row.line, d.text_pair_column, v[d.text_pair_column])
                if d.negative_column and v.get(d.negative_column) is not None:
                    negative = text_cell(path, row.line, d.negative_column, v[d.negative_column])
                if v.get(d.label_column) not in (None, ""):
                    score = _score(path, row.line, d.label_column, v[d.label_column], low, high)
            examples.append(PairExample(str(path), row.line, anchor, positive, negative, score))
        if not examples:
            raise DataError(path, None, "no rows")
        scored = [e.score is not None for e in examples]
        if labelled and any(scored) and not all(scored):
            missing = next(e for e in examples if e.score is None)
            raise DataError(path, missing.line, f"column {d.label_column!r}: no score (other "
                            "rows have one: every pair needs one, or none)")  # fmt: skip
        return examples

    def score_range(self) -> tuple[float, float]:
        text = self.data.score_range
        try:
            low, high = (float(x) for x in text.split(","))
        except ValueError:
            raise ValueError(f"--score-range {text!r}: expected LOW,HIGH (e.g. 0,5)") from None
        if not low < high:
            raise ValueError(f"--score-range {text!r}: LOW must be below HIGH")
        return low, high

    def fitted(self, train: Sequence[PairExample]) -> SentenceEmbeddingTask:
        import copy

        self.dims()  # a wrong --dims fails before any work
        task = copy.copy(self)
        task.scored = bool(train) and train[0].score is not None
        return task

    def data_summary(self, split, examples, features) -> dict[str, Any]:
        summary: dict[str, Any] = {"file": examples[0].source if examples else "",
                                   "examples": len(examples)}  # fmt: skip
        if split == "train":
            negatives = sum(e.negative is not None for e in examples)
            summary["problem"] = "scored pairs" if self.scored else "pairs"
            summary["why"] = (
                f"column {self.data.label_column!r}: cosine-similarity objective"
                if self.scored
                else f"in-batch negatives (scale {SCALE:g})"
                + (f", {negatives:,} hard negatives" if negatives else "")
            )
        if not self.scored:  # rows whose anchor (positive) another row has too
            for side, column in (("anchor", self.data.text_column),
                                 ("positive", self.data.text_pair_column)):  # fmt: skip
                counts = Counter(getattr(e, side) for e in examples)
                shared = sum(n for n in counts.values() if n > 1)
                if not shared:
                    continue
                summary[f"rows_sharing_{side}"] = shared
                texts = sum(n > 1 for n in counts.values())
                summary.setdefault("notes", []).append(
                    f"{shared:,} rows share their {column!r} with another row ({texts:,} texts): "
                    + ("every row trains, in batches that never hold a text twice"
                       if split == "train" else "ranks count the other anchors' texts only")
                )  # fmt: skip
        return summary

    def distinct_texts(self, examples, features) -> list[frozenset[str]] | None:
        """In-batch negatives: no anchor, positive or hard negative twice in one batch (one
        row's text among another's negatives would be a false one)."""
        if self.scored:
            return None
        rows = (examples[f["_example"]] for f in features)
        return [frozenset(t for t in (e.anchor, e.positive, e.negative) if t is not None)
                for e in rows]  # fmt: skip

    # ----------------------------------------------------------------- features
    def featurize(self, examples, tokenizer, max_seq_length: int) -> list[Feature]:
        columns = {"": [e.anchor for e in examples], "positive_": [e.positive for e in examples],
                   "negative_": [e.negative for e in examples]}  # fmt: skip
        encoded = {
            side: tokenizer.encode_ids([t or "" for t in texts]) if any(texts) else None
            for side, texts in columns.items()
        }
        cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        features = []
        for n, example in enumerate(examples):
            feature: Feature = {"_example": n}
            for side, ids in encoded.items():
                if ids is None or columns[side][n] is None:
                    continue
                pieces = [cls_id, *ids[n][: max_seq_length - 2], sep_id]
                feature[f"{side}input_ids"] = pieces
                feature[f"{side}attention_mask"] = [1] * len(pieces)
            if example.score is not None:
                feature["labels"] = example.score
            features.append(feature)
        return features

    # ----------------------------------------------------------------- training
    def dims(self) -> list[int]:
        """The Matryoshka dimensions (`--dims`), largest first; [] without."""
        if not self.data.dims:
            return []
        try:
            dims = sorted({int(d) for d in self.data.dims.split(",")}, reverse=True)
        except ValueError:
            raise ValueError(
                f"--dims {self.data.dims!r}: whole numbers such as 384,128,64"
            ) from None
        if dims[-1] < 1:
            raise ValueError(f"--dims {self.data.dims!r}: each dimension must be 1 or more")
        return dims

    def _encode(self, model, batch, side: str, normalize: bool = True) -> torch.Tensor | None:
        if f"{side}input_ids" not in batch:
            return None
        return model(batch[f"{side}input_ids"], None, batch[f"{side}attention_mask"],
                     normalize=normalize)  # fmt: skip

    def loss(self, model, batch):
        vectors = {side: self._encode(model, batch, side, normalize=False) for side in SIDES}
        total = None
        # the whole vector at unit length; with --dims, each of those leading parts instead
        # (sentence-transformers' MatryoshkaLoss: the parts' losses summed)
        for d in self.dims() or [None]:
            cut = {
                s: None if v is None else F.normalize(v[:, :d], dim=-1) for s, v in vectors.items()
            }
            part, units = self._loss(batch, cut)
            total = part if total is None else total + part
        return total, units

    def _loss(self, batch, vectors: dict[str, torch.Tensor | None]):
        anchors, positives = vectors[""], vectors["positive_"]
        assert anchors is not None and positives is not None
        if self.scored:
            cosine = (anchors * positives).sum(-1)
            return F.mse_loss(cosine, batch["labels"].float(), reduction="sum"), len(anchors)
        negatives = vectors["negative_"]
        candidates = positives if negatives is None else torch.cat([positives, negatives])
        targets = torch.arange(len(anchors), device=anchors.device)
        total = F.cross_entropy(SCALE * anchors @ candidates.T, targets, reduction="sum")
        if self.data.symmetric_loss:  # and each positive's anchor among the batch's anchors
            total = (total + F.cross_entropy(SCALE * positives @ anchors.T, targets,
                                             reduction="sum")) / 2  # fmt: skip
        return total, len(anchors)

    def outputs(self, model, batch):
        return {
            side.rstrip("_") or "anchor": vectors
            for side in ("", "positive_")
            if (vectors := self._encode(model, batch, side)) is not None
        }

    # ----------------------------------------------------------------- evaluation
    def predictions(self, examples, features, outputs) -> dict[str, np.ndarray]:
        return outputs  # one feature per example: the vectors in example order

    def score(self, examples, predictions) -> dict[str, float]:
        anchors, positives = predictions["anchor"], predictions["positive"]
        figures = self._score(examples, anchors, positives)
        for d in self.dims():  # the leading parts too, at unit length
            if d < anchors.shape[1]:
                cut = [v[:, :d] / np.linalg.norm(v[:, :d], axis=1, keepdims=True).clip(1e-12)
                       for v in (anchors, positives)]  # fmt: skip
                figures |= {f"{k}_{d}": v for k, v in self._score(examples, *cut).items()}
        return figures

    def _score(self, examples, anchors, positives) -> dict[str, float]:
        if self.scored:
            cosine = (anchors * positives).sum(-1)
            gold = np.array([e.score for e in examples])
            return {"spearman": metrics.spearman(list(cosine), list(gold)),
                    "pearson": metrics.pearson(cosine, gold)}  # fmt: skip
        ranks = retrieval_ranks(anchors, positives, _same_rows(examples))
        return {
            "recall@1": float(np.mean(ranks == 0)),
            "recall@10": float(np.mean(ranks < 10)),
            "mrr@10": float(np.mean(np.where(ranks < 10, 1.0 / (ranks + 1), 0.0))),
        }

    def prediction_file(self, split: str) -> str:
        return "predictions.jsonl" if split == "dev" else f"predictions_{split}.jsonl"

    def write_predictions(self, examples, predictions, path: Path) -> Path:
        """Each pair's line, texts and cosine; for retrieval, the rank of its positive among
        all positives (0: found first)."""
        anchors, positives = predictions["anchor"], predictions["positive"]
        cosine = (anchors * positives).sum(-1)
        ranks = None if self.scored else retrieval_ranks(anchors, positives, _same_rows(examples))
        rows = []
        for i, e in enumerate(examples):
            row: dict[str, Any] = {"line": e.line, "anchor": e.anchor, "positive": e.positive,
                                   "cosine": round(float(cosine[i]), 6)}  # fmt: skip
            if e.score is not None:
                row["score"] = e.score
            if ranks is not None:
                row["rank"] = int(ranks[i])
            rows.append(row)
        return write_jsonl(path, rows)

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "scored": self.scored}

    def with_settings(self, settings) -> SentenceEmbeddingTask:
        task = self.restored(settings)
        assert isinstance(task, SentenceEmbeddingTask)
        task.scored = settings.get("scored")
        return task

    # ----------------------------------------------------------------- raw inputs
    def example_of(self, item: Any, n: int) -> PairExample:
        if isinstance(item, dict):
            if self.data.text_column not in item:
                from bertkit.rows import missing_column

                raise ValueError(f"item {n}: " + missing_column(self.data.text_column,
                                                                 list(item), "item's keys are"))  # fmt: skip
            item = item[self.data.text_column]
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"item {n}: a non-empty text expected")
        return PairExample("<input>", n + 1, item)

    def answer(self, examples, features, outputs) -> list[dict[str, Any]]:
        return [{"embedding": [float(x) for x in row]} for row in outputs["anchor"]]


def retrieval_ranks(
    anchors: np.ndarray, positives: np.ndarray, same: np.ndarray | None = None
) -> np.ndarray:
    """Each anchor's positive's rank among all positives by cosine (0: first; ties count
    against it). `same` (N, N): pairs of rows whose positives are as right for either anchor
    (the same anchor, or the same positive text): those do not count against.

    >>> retrieval_ranks(np.eye(2), np.array([[1.0, 0.0], [1.0, 0.1]])).tolist()
    [1, 0]
    >>> retrieval_ranks(np.eye(2), np.array([[1.0, 0.0], [1.0, 0.1]]), np.ones((2, 2), bool)).tolist()
    [0, 0]
    """
    similarity = anchors @ positives.T
    own = np.diag(similarity)[:, None]
    others = similarity >= own
    if same is not None:
        others &= ~same
    np.fill_diagonal(others, False)
    return others.sum(1)


def _same_rows(examples: Sequence[PairExample]) -> np.ndarray | None:
    """Which rows share their anchor or their positive (N, N); None where no row does."""
    matrices = []
    for side in ("anchor", "positive"):
        ids: dict[str | None, int] = {}
        codes = np.array([ids.setdefault(getattr(e, side), len(ids)) for e in examples])
        if len(ids) < len(examples):
            matrices.append(codes[:, None] == codes[None, :])
    return np.logical_or.reduce(matrices) if matrices else None


def _score(path, line: int, column: str, value: Any, low: float, high: float) -> float:
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise DataError(path, line, f"column {column!r}: {value!r} is not a number") from None
    if not low <= score <= high:
        raise DataError(
            path, line, f"column {column!r}: {score:g} is outside --score-range {low:g},{high:g}"
        )
    return (score - low) / (high - low)
