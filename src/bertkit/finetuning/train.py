"""Fine-tuning on the paper's tasks, on the one training loop (`training.loop.Trainer`).

    finetune("mrpc", model="all-MiniLM-L6-v2/", data="glue/MRPC", out="runs/mrpc")

The paper's recipe (Sec. 4 and A.3): the pre-trained encoder plus one output layer, all weights
trained; AdamW (weight decay 0.01, not on biases and LayerNorm), linear warmup over the first 10%
of the steps then linear decay, dropout 0.1, 3 epochs, batch 32, lr 5e-5 (the task's own where
the paper gives one). Batches group features of similar length. After every epoch the dev set is
scored with the task's official metric; the best epoch's model is kept in OUT (config.json,
model.safetensors, vocab.txt and its task record) with its dev predictions, and OUT holds
`results.json` (`"dev"`: metric -> value), `log.jsonl` and `curves.png`.

Your own files go through the same loop with the generic tasks (`text-classification`,
`token-classification`, `question-answering`, `multiple-choice`) and a `DataConfig` naming the
files and columns; their OUT also holds `predictions.jsonl` (and `predictions_test.jsonl`), the
per-class `report` in results.json and `confusion.png`.

Several runs of one task (seeds, the paper's grid): `bertkit.finetuning.runs`; scoring a split
or a saved model: `bertkit.finetuning.evaluation`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import torch

from bertkit._device import as_float64
from bertkit._io import (
    DIGEST_FILE,
    LOCK_FILE,
    MODEL_FILE,
    STATE_FILE,
    TASK_FILE,
    record_model_digest,
    write_json,
)
from bertkit.core.checkpoint import read_config
from bertkit.core.heads import MODEL_CLASSES
from bertkit.core.hub import model_dir
from bertkit.core.model import set_activation_checkpointing, set_dropout_parity, set_static_shapes
from bertkit.core.tokenizer import BertTokenizer
from bertkit.finetuning.config import FinetuneConfig
from bertkit.finetuning.evaluation import (
    draw_reports,
    evaluate_split,
    final_evaluation,
    score_held_out,
)
from bertkit.finetuning.model_card import write_model_card
from bertkit.settings import flat
from bertkit.tasks import Task, get_task
from bertkit.tasks.base import FinetuneData, collate
from bertkit.tasks.own import DataConfig, describe
from bertkit.training import distributed
from bertkit.training.config import TrainingConfig
from bertkit.training.loop import Trainer
from bertkit.training.run_folder import LOG_FILE
from bertkit.viz import plot_log, read_log

logger = logging.getLogger("bertkit")

# what a run reads: the paper's folder, your own files (a DataConfig), or None (a task that
# holds its DataConfig)
Data: TypeAlias = "str | os.PathLike | DataConfig | None"
RESULTS_FILE = "results.json"


class TaskObjective:
    """The loop's Objective for a task: the task's summed loss over the step's global units."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def counts(self, batch):
        return torch.tensor([float(self.task.units(batch))], dtype=torch.float64)

    def loss(self, model, batch, totals):
        total, units = self.task.loss(model, batch)
        stats = torch.stack([total.detach().double(), as_float64(units, total)])
        return total / totals[0].clamp(min=1), stats

    def log_entry(self, sums):
        loss, units = sums.tolist()
        return {"loss": round(loss / max(units, 1), 6)}


def main_score(task: Task, figures: dict[str, float]) -> float:
    """What selects epochs, seeds and grid points: the mean of the task's dev metrics (as the
    GLUE leaderboard averages F1 and accuracy, Pearson and Spearman)."""
    return statistics.fmean(figures[m] for m in task.metrics)


class Selection:
    """What picks the best evaluation: the mean of the task's main metrics, or the dev figure
    `metric` names (one ending in loss or mse is lowered, the rest raised)."""

    LOWER = ("loss", "mse")

    def __init__(self, task: Task, metric: str | None) -> None:
        self.task, self.metric = task, metric
        self.name = metric or "mean of " + ", ".join(task.metrics)
        self.lower = metric is not None and metric.endswith(self.LOWER)

    def score(self, figures: dict[str, float]) -> float:
        if self.metric is None:
            return main_score(self.task, figures)
        if self.metric not in figures:
            raise ValueError(
                f"--metric {self.metric}: not a figure of {self.task.name}'s evaluation; its "
                f"figures are {', '.join(sorted(figures))}"
            )
        return float(figures[self.metric])

    def better(self, score: float, than: float | None) -> bool:
        if than is None:
            return True
        return score < than if self.lower else score > than


class TaskData(NamedTuple):
    """A task's examples and features, read once (seeds and grid points share them); `task`
    is the task fitted on its training file (a user's label set)."""

    task: Task
    train: list
    train_features: list
    devs: dict[str, tuple[list, list]]  # split -> (examples, features): what picks the epoch
    summaries: dict[str, dict]  # split -> what reading found (Task.data_summary)
    # with a validation split carved from train: the task's dev splits, scored once at the end
    held_out: dict[str, tuple[list, list]] = {}


def load_task_data(
    task: Task, data: str | os.PathLike | None, tokenizer, config: FinetuneConfig,
    model: str | os.PathLike | None = None,
) -> TaskData:  # fmt: skip
    """Read and featurise the training and dev splits; the summary of each is printed (on
    stderr) when `config.progress`. `config` as given: its length, else the task's (fitting a
    task to its training file keeps its length). `model`: the checkpoint, whose classifier
    the task continues where it was trained on the same labels (`continued_head`)."""
    max_seq_length = config.max_seq_length or task.default_max_seq_length
    train = task.read(data, "train")[: config.max_train_examples]
    carved = None
    if config.validation_split:
        assert not isinstance(config.validation_split, str)  # a split's name: resolve_run's
        train, carved = carve_validation(train, config.validation_split)
    task = task.fitted(train)
    if model is not None:  # the checkpoint's own classifier, where its labels are these
        task, note = continued_head(task, model)
        if note and config.progress:
            print(f"{task.name}: {note}", file=sys.stderr)
    train_features = task.featurize(train, tokenizer, max_seq_length)
    summaries = {}
    if (summary := task.data_summary("train", train, train_features)) is not None:
        summaries["train"] = summary
    devs: dict[str, tuple[list, list]] = {}
    held_out: dict[str, tuple[list, list]] = {}
    for split in task.dev_splits():
        examples = task.read(data, split)[: config.max_eval_examples]
        features = task.featurize(examples, tokenizer, max_seq_length)
        (held_out if carved is not None else devs)[split] = (examples, features)
        if carved is None and (summary := task.data_summary(split, examples, features)):
            summaries[split] = summary
    if carved is not None:
        devs["dev"] = (carved, task.featurize(carved, tokenizer, max_seq_length))
    if config.progress:
        for split, summary in summaries.items():
            print(describe(task.name, split, summary, max_seq_length), file=sys.stderr)
    return TaskData(task, train, train_features, devs, summaries, held_out)


def carve_validation(train: list, fraction: float) -> tuple[list, list]:
    """(the training examples kept, the validation examples carved out): a fixed shuffle (seed 0,
    not the run's) so every seed, rate and row is chosen on the same examples; both keep the
    file's order.

    >>> carve_validation(list(range(10)), 0.2)
    ([0, 1, 2, 3, 5, 7, 8, 9], [4, 6])
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"--validation-split {fraction} is not in (0, 1)")
    order = np.random.default_rng(0).permutation(len(train))
    count = max(1, round(fraction * len(train)))
    if count >= len(train):
        raise ValueError(
            f"--validation-split {fraction} of {len(train)} training examples leaves none to train on"
        )
    chosen = set(order[:count].tolist())
    kept = [example for i, example in enumerate(train) if i not in chosen]
    return kept, [example for i, example in enumerate(train) if i in chosen]


def head_labels(task: Task, model_dir: str | os.PathLike) -> list[str] | None:
    """The labels of the checkpoint's head of `task`'s class, in its output order (its
    config.json's id2label, as transformers and bertkit save them); None where it has no such
    head."""
    from bertkit.core.family import family_of_folder

    file = Path(model_dir) / "config.json"
    if not file.exists():
        return None
    written = json.loads(file.read_text(encoding="utf-8"))
    architectures = written.get("architectures") or []
    if not architectures or family_of_folder(model_dir).bert_class(architectures[0]) != task.head:
        return None
    labels = written.get("id2label") or {}
    return [str(labels[k]) for k in sorted(labels, key=int)] or None


def continued_head(task: Task, model_dir: str | os.PathLike) -> tuple[Task, str | None]:
    """The task fitted to its training file, continuing the checkpoint's classifier where that
    was trained on the same labels (a classifier transformers saved, a bertkit model): the
    labels in the classifier's order. Returns the task and what was done (None: the
    checkpoint has no classifier)."""
    from bertkit.tasks.labels import LabelSet
    from bertkit.tasks.text_classification import TextClassificationTask

    saved = head_labels(task, model_dir)
    if saved is None or not isinstance(task, TextClassificationTask) or task.label_set is None:
        return task, None
    mine = task.labels()
    if task.problem == "regression":
        same = len(saved) == 1
    else:
        same = sorted(saved) == sorted(mine)
    if not same:
        return task, (f"a new classifier: {model_dir}'s classifier was trained on the labels "
                      f"{saved}, the training file has {mine}")  # fmt: skip
    if task.problem != "regression":
        counts = task.label_set.counts
        weights = dict(zip(mine, task.weights or [], strict=False))
        task = copy.copy(task)
        task.label_set = LabelSet(task.problem, tuple(saved), counts)
        if task.weights is not None:  # each label's weight, in the classifier's order
            task.weights = [weights[name] for name in saved]
    return task, f"continues {model_dir}'s classifier (its labels {saved})"


def build_model(
    task: Task,
    model_dir: str | os.PathLike,
    seed: int,
    bilstm: bool = False,
    random_init: bool = False,
    dropout: float | None = None,
    head_init: str = "normal",
):
    """The task's head on the checkpoint's encoder; a fresh head (seeded, drawn as `head_init`
    says) where the checkpoint has none or one of another size. With `random_init`, no weight is
    read: the whole model is initialised from `seed` as BERT initialises (the paper's "no
    pre-training" comparison). `dropout` (if given) replaces the config's hidden and attention
    dropout."""
    config = task.model_config(read_config(Path(model_dir)))
    if dropout is not None:
        config = dataclasses.replace(
            config, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout
        )
    torch.manual_seed(seed)
    if random_init:
        return MODEL_CLASSES[task.head_class(bilstm)](config)
    net = MODEL_CLASSES[task.head_class(bilstm)].from_pretrained(
        model_dir, config=config, ignore_mismatched_sizes=True, new_weights=head_init
    )
    saved = head_labels(task, model_dir)
    if saved is not None and task.labels() is not None and saved != task.labels():
        # a classifier of other labels (or of these in another order): drawn anew, not read
        torch.manual_seed(seed)
        prefix = net.base_model_prefix
        for name, module in net.named_children():
            if name != prefix:
                module.apply(lambda m: net.init_module(m, head_init))
    return net


def resolve_run(
    task: str | Task,
    config: FinetuneConfig | None,
    out: str | os.PathLike,
    data: Data = None,
) -> tuple[Task, FinetuneConfig, Path]:
    """The arguments every entry point takes, as objects: the task (the generic ones with the
    DataConfig given as `data`), the settings as given (a named dataset's validation split
    filled in; the task's defaults are filled in once its training file is read:
    `FinetuneConfig.resolved(fitted task)`), the output folder."""
    if isinstance(data, DataConfig) and data.dataset is not None:  # a dataset by its name
        from bertkit.tasks.named import dataset_files

        data, split = dataset_files(data, (config or FinetuneConfig()).validation_split)
        config = dataclasses.replace(config or FinetuneConfig(), validation_split=split)
    elif config is not None and isinstance(config.validation_split, str):
        raise ValueError(
            f"--validation-split {config.validation_split}: a split's name needs --dataset; "
            "without one, give a fraction of the training examples (e.g. 0.1)"
        )
    if isinstance(task, str):
        task = get_task(task, data if isinstance(data, DataConfig) else None)
    elif isinstance(data, DataConfig):
        raise ValueError("give the DataConfig to the task or as data, not both")
    task.source(data)  # data the task cannot read fails before any work
    return task, config or FinetuneConfig(), Path(out)


def finetune(
    task: str | Task,
    model: str | os.PathLike,
    data: Data,
    out: str | os.PathLike,
    config: FinetuneConfig | None = None,
    *,
    loaded: TaskData | None = None,
    build: Callable[[Task, str | os.PathLike, int], torch.nn.Module] | None = None,
) -> dict[str, Any]:
    """Fine-tune `model` (a checkpoint directory: ours, Hugging Face or Google) on `task`: a
    task of the paper with its official files in the folder `data`, or a generic task on your
    own files (`data` a DataConfig); write the best epoch's model and results to `out`. Returns
    the results dict (also `out/results.json`). `loaded` reuses data read by an earlier run;
    `build(task, model, seed)` replaces `build_model` (another implementation, for
    benchmarks)."""
    return FinetuneRun(task, model, data, out, config, loaded=loaded, build=build).run()


class FinetuneRun:
    """One fine-tuning run, read top to bottom. Making it reads and checks everything before
    OUT is touched (bad input leaves nothing behind) and settles the settings once, with the
    task fitted to its training file; `run()` claims OUT, trains on the one loop (scoring the
    dev set at each evaluation: `_Evaluation`) and writes what a finished run leaves."""

    def __init__(self, task: str | Task, model: str | os.PathLike, data: Data,
                 out: str | os.PathLike, config: FinetuneConfig | None = None, *,
                 loaded: TaskData | None = None,
                 build: Callable[[Task, str | os.PathLike, int], torch.nn.Module] | None = None,
                 ) -> None:  # fmt: skip
        self.started = time.perf_counter()
        task, given, self.out = resolve_run(task, config, out, data)
        self.model = model_dir(model)  # a folder, or a Hub name resolved once
        task.head_class(given.bilstm)  # a head this task cannot have fails before any work
        _check_out(self.out, given)
        self.data, self.source, self.build = data, task.source(data), build
        if given.validation_split and task.test_splits():
            raise ValueError(
                f"--validation-split: {task.name} has its own test file; carve the validation "
                "set or give --test, not both"
            )
        self.tokenizer = BertTokenizer.from_pretrained(self.model)
        self.loaded = loaded or load_task_data(task, self.source, self.tokenizer, given,
                                               self.model)  # fmt: skip
        self.task = self.loaded.task  # fitted to its training file (a user's labels)
        self.config = given.resolved(self.task)  # the task's defaults where none was given
        self.sizes = self.config.sizes()
        self.tokenizer.model_max_length = self.sizes.max_seq_length

    def run(self) -> dict[str, Any]:
        task, config, out, loaded = self.task, self.config, self.out, self.loaded
        if config.resume and (finished := self._finished()) is not None:
            logger.info("%s: finished already (results.json), not run again", out)
            return finished
        _claim(out, config)
        net = self._network()
        dist = distributed.setup(config.compute.device)
        if dist.enabled:
            raise NotImplementedError("fine-tuning runs in one process (torchrun is for pretrain)")
        self.device = dist.device
        batches = FinetuneData(
            loaded.train_features,
            self.sizes.batch_size,
            functools.partial(collate, padded=task.padded_inputs),
            seed=config.seed,
            bucket_batches=self.sizes.bucket_batches,
            distinct=task.distinct_texts(loaded.train, loaded.train_features),
        )
        self.steps_per_epoch = batches.batches_per_epoch
        self.max_steps = self.steps_per_epoch * self.sizes.epochs
        self.evaluation = _Evaluation(self)
        trainer = Trainer(
            net, TaskObjective(task), batches, self._training(), dist_info=dist,
            evaluate=self.evaluation, flags={k: f for k, (_, f) in flat(config).items()},
        )  # fmt: skip
        before = self._score_before(trainer)
        trainer.train()
        results = self._results(trainer, before)
        self._score_chosen_model(results)
        # a resumed run also counts the time its checkpoint holds
        results["seconds"] = round(time.perf_counter() - self.started + trainer.seconds_before, 1)
        self._write(results)
        return results

    def _finished(self) -> dict[str, Any] | None:
        """The results of this run if OUT holds it finished (`_results_of_finished_run`)."""
        return _results_of_finished_run(self.out, self.task, self.config, len(self.loaded.train))

    def _network(self) -> torch.nn.Module:
        """The model the run trains: the task's head on the checkpoint (or `build`'s),
        configured for the task, checked against the vocabulary."""
        task, config, model = self.task, self.config, self.model
        if self.build is None:
            net = build_model(
                task, model, config.seed, config.bilstm, config.random_init, config.dropout,
                config.head_init,
            )  # fmt: skip
        else:
            net = self.build(task, model, config.seed)
        set_dropout_parity(net, config.compute.parity)
        set_activation_checkpointing(net, config.compute.activation_checkpointing)
        set_static_shapes(net, config.compute.compile == "graphs")
        task.configure(net, self.sizes.max_seq_length)
        self.tokenizer.check_model(net.config, model)
        return net

    def _training(self) -> TrainingConfig:
        """The loop's settings: an evaluation (and a checkpoint) each epoch or `eval_every`
        steps, a log line about four times an epoch."""
        config, out = self.config, self.out
        return TrainingConfig(
            out_dir=str(out),
            max_steps=self.max_steps,
            optim=config.optim_for(self.max_steps),
            precision=config.compute.precision,
            compile=config.compute.compile,
            log_every=max(1, min(50, self.steps_per_epoch // 4)),
            eval_every=config.eval_every or self.steps_per_epoch,
            save_every=config.eval_every or self.steps_per_epoch,
            seed=config.seed,
            resume=config.resume and (out / STATE_FILE).exists(),  # a fresh seed starts quietly
            progress=config.progress,
            extra={"task": self.task.name, "finetune": dataclasses.asdict(config)},
        )

    def _score_before(self, trainer: Trainer) -> dict[str, float] | None:
        """The dev figures of the untrained model, for the tasks that report them (not on a
        resumed run)."""
        if not self.task.scores_before_training or (self.out / STATE_FILE).exists():
            return None
        examples, features = self.loaded.devs["dev"]
        before = evaluate_split(self.task, trainer.model, examples, features,
                                self.config.eval_batch_size, self.device)[0]  # fmt: skip
        logger.info("before training: dev %s", _brief(before))
        return before

    def _results(self, trainer: Trainer, before: dict[str, float] | None) -> dict[str, Any]:
        """results.json of a run whose training is over, but for the test and held-out
        figures."""
        task, config, loaded, evaluation = self.task, self.config, self.loaded, self.evaluation
        best = evaluation.best
        if not best:
            best.update(_best_so_far(self.out, evaluation.chosen))
        results = {
            "task": task.name,
            "model": str(self.model),
            "data": task.data_description(self.data),
            "dev": best.get("dev", {}),
            "best_epoch": best.get("epoch"),
            "selected_by": evaluation.chosen.name,
            **({"before_training": before} if before is not None else {}),
            "epochs": [e for e in read_log(self.out / LOG_FILE) if e.get("split") == "eval"],
            "hyperparameters": _hyperparameters(config),
            "precision": trainer.precision.as_dict(),  # what auto chose here, and why
            "train_examples": len(loaded.train),
            "train_features": len(loaded.train_features),
            "steps": self.max_steps,
        }
        if trainer.stopped:  # early stopping: the steps run, the evaluations without a gain
            results["stopped_early"] = {"step": trainer.step, "patience": config.patience}
        if loaded.summaries:
            results["read"] = loaded.summaries
        return results

    def _score_chosen_model(self, results: dict[str, Any]) -> None:
        """The chosen model's figures beside the dev ones: on the carved-out dev set as a
        test, on the test files, and its report (from the best evaluation, else computed
        again)."""
        task, out, config, loaded = self.task, self.out, self.config, self.loaded
        if loaded.held_out:  # the dev set as a test: the model chosen on the carved validation
            results["validation_split"] = config.validation_split
            results["test"] = score_held_out(task, out, loaded.held_out, config, self.device)
        report = self.evaluation.best.get("report")
        if task.test_splits() or (report is None and task.reports):
            # the best epoch's model (a resumed run kept it in OUT) on the test files, and on
            # dev again where a resumed run lost the best epoch's report
            final_evaluation(task, out, self.source, self.tokenizer, config, self.device,
                             results, report)  # fmt: skip
        elif report:
            results["report"] = report

    def _write(self, results: dict[str, Any]) -> None:
        """What a finished run leaves in OUT beside its model: results.json, the model card,
        the pictures; the trainer state goes unless kept; the model's digest is recorded."""
        task, out, config, model = self.task, self.out, self.config, self.model
        write_json(out / RESULTS_FILE, results)
        data = self.data if self.data is not None else getattr(task, "data", None)
        write_model_card(out, task, model, data, config, results)
        draw_reports(out, task, results.get("report", {}))
        plot_log(out / LOG_FILE, out / "curves.png", title=f"{task.name}: {Path(model).name}")
        if not config.keep_state:
            (out / STATE_FILE).unlink(missing_ok=True)
            (out / DIGEST_FILE).unlink(missing_ok=True)
        if (out / MODEL_FILE).exists():
            record_model_digest(out)  # checked by everything that loads it


class _Evaluation:
    """What the loop calls at each evaluation: score every dev split; keep the best
    evaluation's model and predictions in OUT; ask the loop to stop after `patience`
    evaluations without a better score. `best` is the best so far (on a resumed run, from its
    log.jsonl first)."""

    def __init__(self, run: FinetuneRun) -> None:
        self.task, self.devs, self.out, self.config = run.task, run.loaded.devs, run.out, run.config
        self.tokenizer, self.steps_per_epoch, self.device = (
            run.tokenizer,
            run.steps_per_epoch,
            run.device,
        )
        self.chosen = Selection(run.task, run.config.metric)
        self.best: dict[str, Any] = {}

    def __call__(self, wrapped, step: int) -> dict[str, Any]:
        task, config, best, out = self.task, self.config, self.best, self.out
        model_ = distributed.unwrap(wrapped)
        if not best:
            best.update(_best_so_far(out, self.chosen))
        epoch = round(step / self.steps_per_epoch, 3)
        figures, predictions, settings = {}, {}, {}
        for split, (examples, features) in self.devs.items():
            scores, predictions[split], _, tuned = evaluate_split(
                task, model_, examples, features, config.eval_batch_size, self.device
            )
            if split == "dev":
                settings = tuned
            suffix = "" if split == "dev" else "_" + split.removeprefix("dev_")
            figures.update({f"{k}{suffix}": v for k, v in scores.items()})
        score = self.chosen.score(figures)
        entry: dict[str, Any] = {"split": "eval", "epoch": epoch, **figures, "score": score}
        if self.chosen.better(score, best.get("score")):
            best.update(score=score, epoch=epoch, dev=figures, report={}, since=0)
            save_finetuned(model_, self.tokenizer, out, task, config, settings)
            tuned_task = task.with_settings(settings)
            for split, (examples, _) in self.devs.items():
                tuned_task.write_predictions(
                    examples, predictions[split], out / task.prediction_file(split)
                )
                if (report := tuned_task.report(examples, predictions[split])) is not None:
                    best["report"][split] = report
            logger.info("epoch %s: dev %s (best so far)", epoch, _brief(figures))
        else:
            best["since"] = best.get("since", 0) + 1
            logger.info("epoch %s: dev %s", epoch, _brief(figures))
        if config.patience and best["since"] >= config.patience:
            logger.info(
                "epoch %s: %d evaluations without a better %s: stopping (the best, epoch %s, "
                "is what %s holds)", epoch, best["since"], self.chosen.name, best["epoch"], out,
            )  # fmt: skip
            entry["stop"] = True
        return entry


# the settings results.json records, and a resumed run must match to count as finished
HYPERPARAMETERS = ("epochs", "learning_rate", "batch_size", "max_seq_length", "seed",
                   "warmup_fraction", "warmup_steps", "weight_decay", "optimizer", "random_init",
                   "bucket_batches", "dropout", "validation_split", "parity", "metric", "patience",
                   "eval_every", "head_init")  # fmt: skip


def _hyperparameters(config: FinetuneConfig) -> dict[str, Any]:
    values = flat(config)
    return {k: values[k][0] for k in HYPERPARAMETERS}


def _check_out(out: Path, config: FinetuneConfig) -> None:
    """Refuse an output folder that holds something else unless resuming (the same run) or
    overwriting; nothing is created yet."""
    own = {LOCK_FILE} | ({"init"} if config.random_init else set())  # random_init_dir's folder
    held = sorted(p.name for p in out.iterdir() if p.name not in own) if out.is_dir() else []
    if held and not (config.resume or config.overwrite):
        raise FileExistsError(
            f"{out}: not empty ({', '.join(held[:4])}{', ...' if len(held) > 4 else ''}): it "
            "holds another run or checkpoint. Pass --overwrite to replace it, --resume to "
            "continue the run it holds, or pick another --out"
        )


def _claim(out: Path, config: FinetuneConfig) -> None:
    """Make `out` this run's (checked by `_check_out`); with overwrite, drop the old run's
    state so nothing resumes it."""
    _check_out(out, config)
    out.mkdir(parents=True, exist_ok=True)
    if config.overwrite and not config.resume:
        for name in (STATE_FILE, DIGEST_FILE, RESULTS_FILE):
            (out / name).unlink(missing_ok=True)


def _results_of_finished_run(out: Path, task: Task, config: FinetuneConfig, train_examples: int):
    """The results of a run that completed in OUT with these settings, else None: `resume`
    then returns them instead of training again (a killed `--seeds` or `--grid` run redoes
    only what was not finished)."""
    try:
        results = json.loads((out / RESULTS_FILE).read_text())
        info = json.loads((out / TASK_FILE).read_text())
    except (OSError, ValueError):
        return None
    recorded = dict(results.get("hyperparameters", {}))
    if "warmup_proportion" in recorded:  # the warm-up's name before it was pre-training's
        recorded["warmup_fraction"] = recorded.pop("warmup_proportion")
    same = (
        results.get("task") == task.name
        # runs written before `bucket_batches` was a setting sorted 50 batches' worth together;
        # before `dropout` and `validation_split`, they kept the checkpoint's and carved none;
        # before `parity`, every run drew its dropout masks as transformers does; before early
        # stopping, the mean of the main metrics chose among epochs; before the optimiser's
        # settings were nested, the warm-up was a fraction and the optimiser AdamW; before
        # `head_init`, a new head was drawn from Google's truncated normal
        and {
            "bucket_batches": 50,
            "dropout": None,
            "validation_split": None,
            "parity": True,
            "metric": None,
            "patience": None,
            "eval_every": None,
            "warmup_steps": None,
            "optimizer": "adamw",
            "head_init": "truncated-normal",
        }
        | recorded
        == _hyperparameters(config)
        and results.get("train_examples") == train_examples
        and info.get("head") == task.head_class(config.bilstm)
    )
    return results if same else None


def random_init_dir(
    config: str | os.PathLike, vocab: str | os.PathLike, out: str | os.PathLike
) -> Path:
    """A model directory without weights for `random_init` fine-tuning: `config` (a preset name
    such as "mini", or a config JSON) sized to the vocabulary in `vocab` (a directory with
    vocab.txt, or the file), written as OUT/config.json + vocab.txt."""
    from bertkit.core.config import BertConfig

    tokenizer = BertTokenizer.from_pretrained(vocab)
    model_config = BertConfig.resolve(config, tokenizer.vocab_size)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model_config.to_json_file(out / "config.json")
    tokenizer.save_pretrained(out)
    return out


def save_finetuned(
    model, tokenizer, out: Path, task: Task, config: FinetuneConfig, settings: dict | None = None
) -> None:
    """The model, its vocabulary and its task record (TASK_FILE): the task, its head, what
    it learnt from the training file (`Task.settings`) and tuned on dev (`settings`)."""
    model.save_pretrained(out, tokenizer=tokenizer)
    if _scores_pairs(task):  # CrossEncoder(out) then scores as bertkit reranks: the raw output
        written = json.loads((out / "config.json").read_text(encoding="utf-8"))
        written["sentence_transformers"] = {"activation_fn": "torch.nn.modules.linear.Identity"}
        write_json(out / "config.json", written)
    info = {
        "task": task.name,
        "head": task.head_class(config.bilstm),
        "max_seq_length": config.max_seq_length,
        **task.settings(),
        **(settings or {}),
    }
    write_json(out / TASK_FILE, info)


def _scores_pairs(task: Task) -> bool:
    """Whether the task is a regressor of text pairs: a cross-encoder's score."""
    if task.head != "BertForSequenceClassification":
        return False
    regression = getattr(task, "regression", False) or (
        getattr(task, "label_set", None) is not None
        and getattr(task, "problem", "") == "regression"
    )
    if not regression:
        return False
    try:
        task.example_of(("a query", "a text"), 0)
    except (ValueError, TypeError, KeyError, NotImplementedError):
        return False
    return True


def _brief(figures: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in figures.items() if not k.endswith("total"))


# what the loop adds to an evaluation entry beside the task's figures
_NOT_FIGURES = ("step", "split", "epoch", "score", "tokens", "seconds")


def _best_so_far(out: Path, chosen: Selection) -> dict[str, Any]:
    """The best evaluation already in log.jsonl (a resumed run keeps its best epoch), and how
    many evaluations came after it (`since`: patience goes on counting)."""
    best: dict[str, Any] = {}
    for entry in read_log(out / LOG_FILE) if (out / LOG_FILE).exists() else []:
        if entry.get("split") != "eval" or "score" not in entry:
            continue
        if chosen.better(entry["score"], best.get("score")):
            figures = {k: v for k, v in entry.items() if k not in _NOT_FIGURES}
            best = {"score": entry["score"], "epoch": entry["epoch"], "dev": figures, "since": 0}
        else:
            best["since"] = best.get("since", 0) + 1
    return best
