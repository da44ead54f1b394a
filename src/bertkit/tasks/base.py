"""What every fine-tuning task shares: the task interface, input errors that name the file and
line, padded collation and length-bucketed batches for the one training loop.

A task turns its official files into *examples* (what the file says), examples into *features*
(model inputs, one or more per example: SQuAD windows), a model's raw outputs back into
predictions, and predictions into the official metric. `bertkit.finetune` drives the rest.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

Feature = dict[str, Any]  # model inputs as lists of ints, plus bookkeeping (example index, ...)


class DataError(ValueError):
    """Malformed input, reported as `file:line: what is wrong (what was expected)`."""

    def __init__(self, path: str | os.PathLike, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path, self.line = str(path), line


def read_text(path: str | os.PathLike) -> str:
    """A task file's text, UTF-8 with or without a byte-order mark; bytes that are not UTF-8
    raise DataError naming the file, the line and the byte offset."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DataError(path, line, f"not UTF-8 (byte offset {err.start})") from None


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file ({what})")
    return path


class Task:
    """One task of the paper. Subclasses set the class attributes and implement the methods."""

    # (class defaults; a task family sets some per instance: GLUE's name, SQuAD 2.0's epochs)
    name: str
    head: str  # a name in bertkit.heads.MODEL_CLASSES
    metrics: tuple[str, ...]  # the dev figures; their mean selects checkpoints
    default_max_seq_length: int = 128
    default_learning_rate: float = 5e-5
    default_epochs: int = 3
    default_batch_size: int = 32
    # per-example model inputs that collate pads (with the value given) to the batch's longest
    padded_inputs: ClassVar[dict[str, int]] = {
        "input_ids": 0,
        "token_type_ids": 0,
        "attention_mask": 0,
    }

    def labels(self) -> list[str] | None:
        """The label names, in the order of the classifier's outputs; None: not a classifier."""
        return None

    def read(self, data_dir: str | os.PathLike, split: str) -> list:
        raise NotImplementedError

    def dev_splits(self) -> tuple[str, ...]:
        return ("dev",)

    def featurize(self, examples: Sequence, tokenizer, max_seq_length: int) -> list[Feature]:
        raise NotImplementedError

    def loss(self, model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss summed over the batch's units, number of units) — units are examples, or
        labelled tokens for tagging."""
        raise NotImplementedError

    def units(self, batch: dict[str, torch.Tensor]) -> int:
        return len(batch["input_ids"])

    def outputs(self, model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Raw outputs of an evaluation batch, on the CPU."""
        raise NotImplementedError

    def predictions(self, examples: Sequence, features: list[Feature], outputs: dict) -> Any:
        """Model outputs of every feature (stacked in feature order) -> one prediction per
        example (label, score, span text, tag sequence)."""
        raise NotImplementedError

    def score(self, examples: Sequence, predictions: Any) -> dict[str, float]:
        raise NotImplementedError

    def write_predictions(self, examples: Sequence, predictions: Any, path: Path) -> Path:
        raise NotImplementedError

    # Settings a task tunes on the dev set and a fine-tuned checkpoint keeps in task_info.json
    # (SQuAD 2.0's no-answer threshold); most tasks have none. Values, not hidden state:
    # `score` changes nothing, `with_settings` returns a new task.
    def dev_settings(self, figures: dict[str, float]) -> dict[str, float]:
        return {}

    def with_settings(self, settings: dict[str, Any]) -> Task:
        return self


def head_logits(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The head's logits, in fp32, for a collated batch (every classification-style task)."""
    return model(
        input_ids=batch["input_ids"],
        token_type_ids=batch["token_type_ids"],
        attention_mask=batch["attention_mask"],
    ).logits.float()


def collate(features: Sequence[Feature], padded: dict[str, int]) -> dict[str, torch.Tensor]:
    """Pad the per-token inputs to the longest feature (to a multiple of 8) and stack every
    other numeric field: collate([{"input_ids": [2, 5, 3], "y": 1}], {"input_ids": 0})
    -> {"input_ids": tensor([[2, 5, 3, 0, 0, 0, 0, 0]]), "y": tensor([1])}"""
    batch: dict[str, torch.Tensor] = {}
    first = features[0]
    for key in first:
        if key.startswith("_"):  # bookkeeping, not a model input
            continue
        if key in padded:
            fill = padded[key]
            rows = [f[key] for f in features]
            if rows and isinstance(rows[0][0], list):  # (choices, tokens): multiple choice
                width = _round_up(max(len(r) for row in rows for r in row))
                array = np.full((len(rows), len(rows[0]), width), fill, dtype=np.int64)
                for i, row in enumerate(rows):
                    for j, r in enumerate(row):
                        array[i, j, : len(r)] = r
            else:
                width = _round_up(max(len(r) for r in rows))
                array = np.full((len(rows), width), fill, dtype=np.int64)
                for i, r in enumerate(rows):
                    array[i, : len(r)] = r
            batch[key] = torch.from_numpy(array)
        else:
            batch[key] = torch.tensor([f[key] for f in features])
    return batch


def _round_up(n: int, multiple: int = 8) -> int:
    return max(multiple, math.ceil(n / multiple) * multiple)


def feature_length(feature: Feature) -> int:
    ids = feature["input_ids"]
    return max(len(r) for r in ids) if ids and isinstance(ids[0], list) else len(ids)


class FinetuneData:
    """Training batches for `Trainer`: each epoch shuffles the features with (seed, epoch),
    groups them into buckets of similar length (so a batch pads little) and shuffles the batch
    order. The position (epoch, batch) is the whole state, so a killed run resumes exactly."""

    def __init__(
        self,
        features: Sequence[Any],  # Feature dicts (tasks), or anything `collate_fn` stacks
        batch_size: int,
        collate_fn: Callable[[Sequence[Any]], dict[str, torch.Tensor]],
        *,
        seed: int = 0,
        bucket_batches: int,
        lengths: Sequence[int] | None = None,
    ) -> None:
        """`bucket_batches`: how many batches' worth of features are sorted by length together
        (1: random batches); `lengths`: the features' lengths, where they hold no input_ids."""
        if not features:
            raise ValueError("no training features")
        self.features, self.batch_size, self.collate_fn = features, batch_size, collate_fn
        self.seed, self.bucket = seed, bucket_batches * batch_size
        self.lengths = np.array(
            [feature_length(f) for f in features] if lengths is None else lengths
        )
        self.epoch, self.cursor = 0, 0
        self._plan = self.plan(0)

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(len(self.features) / self.batch_size)

    def plan(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.features))
        batches = []
        for start in range(0, len(order), self.bucket):
            chunk = order[start : start + self.bucket]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches += [
                chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)
            ]
        return [batches[i] for i in rng.permutation(len(batches))]

    def next_batch(self) -> dict[str, torch.Tensor]:
        if self.cursor >= len(self._plan):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._plan = self.plan(self.epoch)
        indices = self._plan[self.cursor]
        self.cursor += 1
        return self.collate_fn([self.features[i] for i in indices])

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._plan = self.plan(self.epoch)


def eval_batches(features: list[Feature], batch_size: int) -> list[np.ndarray]:
    """Indices of evaluation batches, longest first (equal lengths together: little padding;
    the largest batch first: an out-of-memory shows at once)."""
    order = np.argsort([-feature_length(f) for f in features], kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


@torch.no_grad()
def run_outputs(
    task: Task,
    model,
    features: list[Feature],
    batch_size: int,
    device: torch.device,
    progress: bool = False,
) -> dict[str, np.ndarray]:
    """Every feature's raw outputs, stacked in feature order (padded along the token axis).
    `progress`: a progress bar over the batches (on stderr)."""
    was_training = model.training
    model.eval()
    chunks: dict[str, list] = {}
    order = []
    batches = eval_batches(features, batch_size)
    if progress:
        from tqdm import tqdm

        batches = tqdm(list(batches), desc="evaluate", unit="batch")
    for indices in batches:
        batch = collate([features[i] for i in indices], task.padded_inputs)
        batch = {k: v.to(device) for k, v in batch.items()}
        for key, value in task.outputs(model, batch).items():
            chunks.setdefault(key, []).append(value.float().cpu().numpy())
        order.append(indices)
    model.train(was_training)
    positions = np.concatenate(order)
    inverse = np.empty_like(positions)
    inverse[positions] = np.arange(len(positions))
    result = {}
    for key, parts in chunks.items():
        width = max(p.shape[1] for p in parts) if parts[0].ndim > 1 else None
        if width is not None:
            parts = [
                np.pad(
                    p,
                    [(0, 0), (0, width - p.shape[1])] + [(0, 0)] * (p.ndim - 2),
                    constant_values=-1e4,
                )
                for p in parts
            ]
        result[key] = np.concatenate(parts)[inverse]
    return result


# What a fine-tuned checkpoint says of itself: its task, head and settings (finetune writes it).
TASK_FILE = "bertkit_task.json"


def read_task_info(model: str | os.PathLike) -> dict:
    """The `bertkit_task.json` of a fine-tuned checkpoint directory."""
    path = Path(model) / TASK_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: not a fine-tuned bertkit checkpoint (no {TASK_FILE}); pass the task"
        )
    return json.loads(path.read_text())
