"""What every fine-tuning task shares: the task interface, input errors that name the file and
line, padded collation and length-bucketed batches for the one training loop.

A task turns its official files into *examples* (what the file says), examples into *features*
(model inputs, one or more per example: SQuAD windows), a model's raw outputs back into
predictions, and predictions into the official metric. `bertkit.finetuning.train` drives the rest.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from bertkit._io import TASK_FILE
from bertkit.errors import DataError

Feature = dict[str, Any]  # model inputs as lists of ints, plus bookkeeping (example index, ...)
# Table 5's feature-style heads: the encoder's states through a BiLSTM (token-level heads only)
BILSTM_HEADS = {
    "BertForTokenClassification": "BertBiLSTMForTokenClassification",
    "BertForQuestionAnswering": "BertBiLSTMForQuestionAnswering",
}


PAPER_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "squad1",
               "squad2", "conll2003", "conll2003-pos", "conll2003-chunk", "swag")  # fmt: skip
OWN_TASKS = ("text-classification", "token-classification", "question-answering", "multiple-choice",
             "sentence-embedding")  # fmt: skip


def check_data(name: str, data: Any, *, own: bool | None = None, required: bool = False) -> Any:
    """The one rule of what a fine-tuning run of task `name` reads, whichever way it comes (the
    command line, `finetune` from Python, `get_task`, `Task.source`): your own tasks (`own`;
    default: `name` in OWN_TASKS) read the files a DataConfig names (--train, --validation,
    --test), the paper's tasks the folder of their official files (--data DIR). `required`:
    the files or the folder must be given (the command line). Returns `data`."""
    own = name in OWN_TASKS if own is None else own
    files = hasattr(data, "given")  # a DataConfig (tasks.own), named here without its import
    if own:
        if data is not None and not files:
            raise ValueError(
                f"{name} reads your files: --train FILE --validation FILE [--test FILE], not "
                f"--data DIR ({data})"
            )
        named = data is not None and getattr(data, "dataset", None) is not None
        if required and not named and (data is None or data.train is None
                                       or data.validation is None):  # fmt: skip
            raise ValueError(f"{name} needs --train FILE and --validation FILE (or --dataset NAME)")
        return data
    if files:
        flags = ", ".join("--" + k.replace("_", "-") for k in data.given())
        raise ValueError(
            f"{flags or 'a DataConfig'}: for your own data ({', '.join(OWN_TASKS)}); {name} "
            "reads its official files from --data DIR"
        )
    if data is not None and not isinstance(data, (str, os.PathLike)):
        raise ValueError(
            f"{name} reads its official files from a folder (--data DIR), not {data!r}"
        )
    if required and data is None:
        raise ValueError(f"{name} needs --data DIR (the folder of its official files)")
    return data


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
    """One fine-tuning task. Subclasses set the class attributes and implement the methods;
    everything `finetune`, `evaluate` and `Predictor` need of a task goes through them, so
    those stay free of task names."""

    # (class defaults; a task family sets some per instance: GLUE's name, SQuAD 2.0's epochs)
    name: str
    head: str  # a name in bertkit.core.heads.MODEL_CLASSES
    metrics: tuple[str, ...]  # the dev figures; their mean selects checkpoints
    problem_type: str | None = None  # config.json's, where the label count does not say it
    reports: ClassVar[bool] = False  # whether `report` has per-class figures to give
    default_max_seq_length: int = 128
    default_learning_rate: float = 5e-5
    default_epochs: int = 3
    default_batch_size: int = 32
    # batches' worth of training features sorted by length together (FinetuneConfig's)
    default_bucket_batches: int = 50
    # how a file of an extension no format claims (.txt, .dat) is read, in training and predict
    default_file_format: str = "csv"
    # per-example model inputs that collate pads (with the value given) to the batch's longest
    padded_inputs: ClassVar[dict[str, int]] = {
        "input_ids": 0,
        "token_type_ids": 0,
        "attention_mask": 0,
    }

    def labels(self) -> list[str] | None:
        """The label names, in the order of the classifier's outputs; None: not a classifier."""
        return None

    def file_rows(
        self, path: Path, kind: str, options: Any
    ) -> Iterator[tuple[int, dict[str, Any]]] | None:
        """A file of format `kind` in this task's own layout (a tagger's CoNLL columns, GLUE's
        TSV, SQuAD's JSON) as the rows `predict --input` answers: (line, values the task reads,
        with the file's gold answers where it has them); None where it is not (`options`, a
        FileConfig: how the model's training files were read)."""
        return None

    def head_class(self, bilstm: bool = False) -> str:
        """The head's class name: `head`, or with `bilstm` its Table 5 `+ BiLSTM` variant."""
        if not bilstm:
            return self.head
        if self.head not in BILSTM_HEADS:
            raise ValueError(f"--bilstm is for span and tagging tasks, not {self.name}")
        return BILSTM_HEADS[self.head]

    scores_before_training: ClassVar[bool] = False  # dev figures of the model as it starts too

    def configure(self, model, max_seq_length: int) -> None:
        """Set what the task decides on a freshly built model (nothing, for most tasks)."""

    def model_config(self, config):
        """A checkpoint's BertConfig for this task's head: its label names, and the problem type
        where the label count does not say it (so transformers' pipeline reads the outputs)."""
        labels = self.labels()
        if labels is not None:
            config = config.with_labels(labels)
        if self.problem_type is not None:
            config = dataclasses.replace(config, problem_type=self.problem_type)
        return config

    # ----------------------------------------------------------------- data
    def source(self, data: Any) -> str | os.PathLike | None:
        """What `read` takes of the `data` a fine-tuning run was given: the paper's tasks, the
        folder of their official files."""
        return check_data(self.name, data, own=False)

    def data_description(self, data: Any) -> Any:
        """What results.json says was read."""
        return None if data is None else str(data)

    def read(self, data: str | os.PathLike | None, split: str) -> list:
        """The examples of a split: `data` is the folder of the task's official files, or
        (your own data) a file, or None for the files the task was given."""
        raise NotImplementedError

    def dev_splits(self) -> tuple[str, ...]:
        return ("dev",)

    def test_splits(self) -> tuple[str, ...]:
        """Splits scored (when labelled) and predicted once, by the final model, after
        training: your own data's --test file."""
        return ()

    def fitted(self, train: Sequence) -> Task:
        """The task with what it learns from the training examples (the label set of a user's
        file); the paper's tasks know theirs and return themselves."""
        return self

    def data_summary(self, split: str, examples: Sequence, features: list) -> dict | None:
        """What the reading found, for results.json and the console (labels with counts, texts
        cut or windowed); None: nothing to say."""
        return None

    def featurize(self, examples: Sequence, tokenizer, max_seq_length: int) -> list[Feature]:
        raise NotImplementedError

    # ----------------------------------------------------------------- training
    def distinct_texts(self, examples: Sequence, features: list) -> list[frozenset[str]] | None:
        """Each training feature's texts, none of which a batch may hold twice (in-batch
        negatives: `FinetuneData`); None: batches as they fall."""
        return None

    def loss(self, model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss summed over the batch's units, number of units) — units are examples, or
        labelled tokens for tagging."""
        raise NotImplementedError

    def units(self, batch: dict[str, torch.Tensor]) -> int:
        return len(batch["input_ids"])

    def outputs(self, model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Raw outputs of an evaluation batch, on the CPU."""
        raise NotImplementedError

    # ----------------------------------------------------------------- evaluation
    def predictions(self, examples: Sequence, features: list[Feature], outputs: dict) -> Any:
        """Model outputs of every feature (stacked in feature order) -> one prediction per
        example (label, score, span text, tag sequence)."""
        raise NotImplementedError

    def labelled(self, examples: Sequence, split: str) -> bool:
        """Whether these examples carry gold labels to score against."""
        return not split.startswith("test")

    def score(self, examples: Sequence, predictions: Any) -> dict[str, float]:
        raise NotImplementedError

    def report(self, examples: Sequence, predictions: Any) -> dict[str, Any] | None:
        """Figures beyond the headline ones (per class, the confusion matrix as
        {"labels": [...], "matrix": [[...]]}); None: none."""
        return None

    def prediction_file(self, split: str) -> str:
        """The name `write_predictions` gives a split's predictions."""
        return f"predictions_{split}.txt"

    def write_predictions(self, examples: Sequence, predictions: Any, path: Path) -> Path:
        raise NotImplementedError

    # What a fine-tuned checkpoint keeps of its task in its task record (TASK_FILE): the `settings` it
    # learnt from the training file or was given (a label set, how files are read) and those it
    # tunes on the dev set (SQuAD 2.0's no-answer threshold, multi-label thresholds). Values,
    # not hidden state: `score` changes nothing, `with_settings` returns a new task.
    def dev_settings(self, examples: Sequence, predictions: Any, figures: dict) -> dict[str, Any]:
        return {}

    def settings(self) -> dict[str, Any]:
        return {}

    def with_settings(self, settings: dict[str, Any]) -> Task:
        return self

    # ----------------------------------------------------------------- raw inputs (Predictor)
    def example_of(self, item: Any, n: int) -> Any:
        """An unlabelled example of one input `Predictor` is given (a text, a pair, a dict)."""
        raise NotImplementedError(f"{self.name}: no raw-input prediction")

    def answer(self, examples: Sequence, features: list[Feature], outputs: dict) -> list[dict]:
        """One JSON-ready answer per example (label and score, tags and entities, a span)."""
        raise NotImplementedError(f"{self.name}: no raw-input prediction")

    def items_of(self, texts: Sequence[str], question: str | None, context: str | None) -> list:
        """The inputs `bertkit predict` takes on its command line, as items for `answer`."""
        if question or context:
            raise ValueError(f"{self.name} takes texts, not --question/--context")
        return list(texts)


def run_model(model, batch: dict[str, Any]):
    """The model on a collated batch's inputs, with the token layouts the training loop worked
    out on the host when it did (`Objective.layouts`)."""
    extra = {"layouts": batch["layouts"]} if "layouts" in batch else {}
    return model(
        input_ids=batch["input_ids"],
        token_type_ids=batch["token_type_ids"],
        attention_mask=batch["attention_mask"],
        **extra,
    )


def head_logits(model, batch: dict[str, Any]) -> torch.Tensor:
    """The head's logits, in fp32, for a collated batch (every classification-style task)."""
    return run_model(model, batch).logits.float()


def collate(features: Sequence[Feature], padded: dict[str, int],
            most: int | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """Pad the per-token inputs to the longest feature (to a multiple of 8) and stack every
    other numeric field: collate([{"input_ids": [2, 5, 3], "y": 1}], {"input_ids": 0})
    -> {"input_ids": tensor([[2, 5, 3, 0, 0, 0, 0, 0]]), "y": tensor([1])}. Multiple choice
    ((choices, tokens) per feature): features with fewer choices repeat their last one, and
    `choice_mask` (B, choices) marks the real ones. `most`: the model's positions, which the
    padding never passes."""
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
                choices = max(len(row) for row in rows)
                array = np.full((len(rows), choices, width), fill, dtype=np.int64)
                for i, row in enumerate(rows):
                    for j in range(choices):
                        r = row[min(j, len(row) - 1)]
                        array[i, j, : len(r)] = r
                if "choice_mask" not in batch:
                    mask = np.zeros((len(rows), choices), dtype=bool)
                    for i, row in enumerate(rows):
                        mask[i, : len(row)] = True
                    batch["choice_mask"] = torch.from_numpy(mask)
            else:
                longest = max(len(r) for r in rows)
                width = max(min(_round_up(longest), most or longest), longest)
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
    return max(len(r) for r in ids) if len(ids) and isinstance(ids[0], list) else len(ids)


class FinetuneData:
    """Training batches for `Trainer`: each epoch shuffles the features with (seed, epoch),
    groups them into buckets of similar length (so a batch pads little) and shuffles the batch
    order. With `distinct` (each feature's texts), no text is in one batch twice: in-batch
    negatives would otherwise score a text against itself (sentence-transformers'
    no-duplicates batch sampler). The position (epoch, batch) is the whole state, so a killed
    run resumes exactly."""

    def __init__(
        self,
        features: Sequence[Any],  # Feature dicts (tasks), or anything `collate_fn` stacks
        batch_size: int,
        collate_fn: Callable[[Sequence[Any]], dict[str, torch.Tensor]],
        *,
        seed: int = 0,
        bucket_batches: int,
        lengths: Sequence[int] | None = None,
        distinct: Sequence[frozenset[str]] | None = None,
    ) -> None:
        """`bucket_batches`: how many batches' worth of features are sorted by length together
        (1: random batches); `lengths`: the features' lengths, where they hold no input_ids;
        `distinct`: each feature's texts, none of which may be in a batch twice (`plan`)."""
        if not features:
            raise ValueError("no training features")
        self.features, self.batch_size, self.collate_fn = features, batch_size, collate_fn
        self.seed, self.bucket = seed, bucket_batches * batch_size
        self.distinct = distinct
        self.lengths = np.array(
            [feature_length(f) for f in features] if lengths is None else lengths
        )
        self.epoch, self.cursor = 0, 0
        self._plan = self.plan(0)

    @property
    def batches_per_epoch(self) -> int:
        """The first epoch's batches (with `distinct`, a later epoch may hold a few more or
        fewer: its texts meet in other ways)."""
        if self.distinct is not None:
            return len(self.plan(0))
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
        if self.distinct is not None:  # the same batches where no text repeats
            batches = [
                batch[np.argsort(self.lengths[batch], kind="stable")]
                for batch in distinct_batches(
                    np.concatenate(batches), self.distinct, self.batch_size
                )  # fmt: skip
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


def distinct_batches(order: Iterable[int], texts: Sequence[frozenset[str]],
                     size: int) -> list[np.ndarray]:  # fmt: skip
    """`order` cut into batches of `size` in which no text occurs twice: an item whose texts
    meet the batch's waits for the next batch (first in line there), so where nothing repeats
    the batches are `order`'s slices.

    >>> [b.tolist() for b in distinct_batches([0, 1, 2, 3], [{"a"}, {"a"}, {"b"}, {"c"}], 2)]
    [[0, 2], [1, 3]]
    """
    fresh = iter(order)
    waiting: deque[int] = deque()
    batches: list[np.ndarray] = []
    while True:
        batch: list[int] = []
        seen: set[str] = set()
        passed: deque[int] = deque()
        while waiting and len(batch) < size:
            item = waiting.popleft()
            if seen.isdisjoint(texts[item]):
                batch.append(item)
                seen.update(texts[item])
            else:
                passed.append(item)
        for item in fresh if len(batch) < size else ():
            if seen.isdisjoint(texts[item]):
                batch.append(item)
                seen.update(texts[item])
            else:
                passed.append(item)
            if len(batch) == size:
                break
        if not batch:
            return batches
        batches.append(np.asarray(batch, dtype=np.int64))
        passed.extend(waiting)
        waiting = passed


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
    if was_training:  # eval() walks every module: 0.6 ms a call on MiniLM, a tenth of a
        model.eval()  # one-sentence prediction, so only when there is something to switch
    chunks: dict[str, list] = {}
    order = []
    batches = eval_batches(features, batch_size)
    if progress:
        from tqdm import tqdm

        batches = tqdm(list(batches), desc="evaluate", unit="batch")
    plan = getattr(model, "host_layouts", None)  # a bertkit head's: see Trainer.fit
    most = getattr(getattr(model, "config", None), "max_length", None)
    for indices in batches:
        batch = collate([features[i] for i in indices], task.padded_inputs, most)
        layouts = plan(batch, device) if plan is not None else None
        batch = {k: v.to(device) for k, v in batch.items()}
        if layouts is not None:  # worked out on the host: the forward need not count tokens
            batch["layouts"] = layouts
        for key, value in task.outputs(model, batch).items():
            chunks.setdefault(key, []).append(value.float().cpu().numpy())
        order.append(indices)
    if was_training:
        model.train()
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


def read_task_info(model: str | os.PathLike) -> dict:
    """The task record (`TASK_FILE`) of a fine-tuned checkpoint directory."""
    from bertkit.core.hub import model_dir

    folder = model_dir(model)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (a model `bertkit finetune` wrote)")
    path = folder / TASK_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: not a fine-tuned model: no {TASK_FILE}, and its config.json names no "
            "task head (a classifier, a tagger, an extractive reader); an encoder embeds texts "
            "(bertkit embed), or fine-tune it for a task (bertkit finetune)"
        )
    return json.loads(path.read_text())
