"""Fine-tuning on the paper's tasks, on the one training loop (`training.loop.Trainer`).

    finetune("mrpc", model="all-MiniLM-L6-v2/", data="glue/MRPC", out="runs/mrpc")

The paper's recipe (Sec. 4 and A.3): the pre-trained encoder plus one output layer, all weights
trained; AdamW (weight decay 0.01, not on biases and LayerNorm), linear warmup over the first 10%
of the steps then linear decay, dropout 0.1, 3 epochs, batch 32, lr 5e-5 (the task's own where
the paper gives one). Batches group features of similar length. After every epoch the dev set is
scored with the task's official metric; the best epoch's model is kept in OUT (config.json,
model.safetensors, vocab.txt, `bertkit_task.json`) with its dev predictions, and OUT holds
`results.json` (`"dev"`: metric -> value), `log.jsonl` and `curves.png`.

Your own files go through the same loop with the generic tasks (`text-classification`,
`token-classification`, `question-answering`, `multiple-choice`) and a `DataConfig` naming the
files and columns; their OUT also holds `predictions.jsonl` (and `predictions_test.jsonl`), the
per-class `report` in results.json and `confusion.png`.

`finetune_seeds` repeats a run with K seeds and reports mean, std, min and max (fine-tuning
small tasks is unstable, and one seed hides it); `finetune_grid` runs the paper's grid (batch
16/32 x lr 5e-5/3e-5/2e-5 x epochs 2/3/4) and selects on dev.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from bertkit import stats
from bertkit._io import (
    DIGEST_FILE,
    LOCK_FILE,
    MODEL_FILE,
    STATE_FILE,
    atomic_path,
    record_model_digest,
)
from bertkit.checkpoint import read_config
from bertkit.heads import MODEL_CLASSES
from bertkit.hub import model_dir
from bertkit.model import set_dropout_parity
from bertkit.model_card import write_model_card
from bertkit.settings import (
    Settings,
    compile_setting,
    device_setting,
    parity_setting,
    precision_setting,
    setting,
)
from bertkit.tasks import Task, get_task
from bertkit.tasks.base import (
    TASK_FILE,
    FinetuneData,
    collate,
    read_task_info,
    run_outputs,
    task_of_checkpoint,
)
from bertkit.tasks.own import DataConfig, describe
from bertkit.tokenizer import BertTokenizer
from bertkit.training import distributed
from bertkit.training.loop import LOG_FILE, Trainer, TrainingConfig
from bertkit.training.optim import OptimConfig
from bertkit.viz import plot_confusion, plot_log, read_log

logger = logging.getLogger("bertkit")
RESULTS_FILE = "results.json"
_OPTIM_FIELDS = {f.name: f for f in dataclasses.fields(OptimConfig)}
GRID = {"batch_size": (16, 32), "learning_rate": (5e-5, 3e-5, 2e-5), "epochs": (2, 3, 4)}


class Sizes(NamedTuple):
    epochs: int
    learning_rate: float
    batch_size: int
    max_seq_length: int
    bucket_batches: int


@dataclass
class FinetuneConfig(Settings):
    """Hyperparameters of a fine-tuning run; None takes the task's default (the paper's value).
    The `bertkit finetune` flags are these fields (`--learning-rate`, ...)."""

    epochs: int | None = setting(None, "epochs (the paper's: 3; SQuAD 2.0: 2)", check="positive")
    metric: str | None = setting(
        None,
        "the dev figure that picks the best evaluation, whose model OUT keeps: any key of the "
        "task's figures (accuracy, f1, mcc, pearson, macro_f1, ...; one ending in loss or mse is "
        "lowered, the rest raised); default: the mean of the task's main metrics",
    )
    patience: int | None = setting(
        None, "stop after this many evaluations without a better --metric", check="positive"
    )
    eval_every: int | None = setting(
        None, "training steps between evaluations (default: one each epoch)", check="positive"
    )
    learning_rate: float | None = setting(
        None, "peak learning rate (5e-5; SWAG: 2e-5)", check="positive", flags=("--lr",)
    )
    batch_size: int | None = setting(
        None, "sequences per step (32; SQuAD 2.0: 48, SWAG: 16)", check="positive"
    )
    max_seq_length: int | None = setting(
        None, "pieces per sequence (128; SQuAD: 384)", check="positive"
    )
    warmup_proportion: float = setting(
        0.1, "linear warm-up, a fraction of the steps", check="fraction", flags=("--warmup",)
    )
    weight_decay: float = setting(
        OptimConfig.weight_decay, "decoupled weight decay (not on biases, LayerNorm)"
    )
    seed: int = setting(42, "seed of the head's init, dropout and batch order")
    eval_batch_size: int = setting(64, "sequences per evaluation batch", check="positive")
    bucket_batches: int | None = setting(
        None,
        "batches' worth of training examples sorted by length together, so a batch pads little "
        "(50; token tagging: 1, random batches, as transformers' Trainer draws them)",
        check="positive",
    )
    precision: str = precision_setting()
    parity: bool = parity_setting()
    compile: str = compile_setting()
    device: str | None = device_setting()
    resume: bool = setting(False, "continue a killed run in the output folder")
    keep_state: bool = setting(False, "keep trainer_state.pt (the optimiser too: 3x the model)")
    max_train_examples: int | None = setting(
        None, "the first N training examples", check="positive"
    )
    max_eval_examples: int | None = setting(None, "the first N dev examples", check="positive")
    progress: bool = setting(True, "a progress bar")
    dropout: float | None = setting(
        0.1,
        "hidden and attention dropout while fine-tuning: the paper's 0.1 whatever the checkpoint's "
        "config says (a pre-training recipe's dropout, e.g. the laptop recipe's 0, does not carry "
        "over); None from Python keeps the checkpoint's",
        check="fraction",
    )
    validation_split: float | None = setting(
        None,
        "carve this fraction of the training examples out (the same ones for every seed and run) "
        "as the validation set that picks the epoch and any threshold; the task's dev set is then "
        "scored once, by the chosen model, and reported as 'test' (nothing is chosen on it)",
        check="fraction",
    )
    bilstm: bool = setting(False, "Table 5's + BiLSTM between encoder and output (QA, tagging)")
    random_init: bool = setting(
        False,
        "the no-pre-training baseline: the model's config and vocabulary only, every weight "
        "drawn afresh from the seed",
    )
    overwrite: bool = setting(
        False, "replace what a non-empty output folder holds (another run or checkpoint)"
    )
    optimizer: str = setting(
        OptimConfig.optimizer, _OPTIM_FIELDS["optimizer"].metadata["help"],
        choices=_OPTIM_FIELDS["optimizer"].metadata["choices"],
    )  # fmt: skip

    def sizes(self) -> Sizes:
        """The five settings a task fills in, of a `resolved` config."""
        values = (self.epochs, self.learning_rate, self.batch_size, self.max_seq_length,
                  self.bucket_batches)  # fmt: skip
        if any(v is None for v in values):
            raise ValueError("FinetuneConfig.resolved(task) first: the task's defaults are unset")
        return Sizes(*values)  # type: ignore[arg-type]

    def optim(self, max_steps: int) -> OptimConfig:
        """The optimiser and schedule of a run of `max_steps` steps (of a `resolved` config):
        the warm-up is int(warmup_proportion x steps), as transformers rounds it."""
        return OptimConfig(
            learning_rate=self.sizes().learning_rate,
            warmup_steps=int(self.warmup_proportion * max_steps),
            weight_decay=self.weight_decay,
            optimizer=self.optimizer,
        )

    def resolved(self, task: Task) -> FinetuneConfig:
        return dataclasses.replace(
            self,
            epochs=self.epochs or task.default_epochs,
            learning_rate=self.learning_rate or task.default_learning_rate,
            batch_size=self.batch_size or task.default_batch_size,
            max_seq_length=self.max_seq_length or task.default_max_seq_length,
            bucket_batches=self.bucket_batches or task.default_bucket_batches,
        )


class TaskObjective:
    """The loop's Objective for a task: the task's summed loss over the step's global units."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def counts(self, batch):
        return torch.tensor([float(self.task.units(batch))], dtype=torch.float64)

    def loss(self, model, batch, totals):
        total, units = self.task.loss(model, batch)
        stats = torch.stack([total.detach().double(), torch.as_tensor(units).double().to(total)])
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
    task: Task, data: str | os.PathLike | None, tokenizer, config: FinetuneConfig
) -> TaskData:
    """Read and featurise the training and dev splits; the summary of each is printed (on
    stderr) when `config.progress`."""
    max_seq_length = config.sizes().max_seq_length
    train = task.read(data, "train")[: config.max_train_examples]
    carved = None
    if config.validation_split:
        train, carved = carve_validation(train, config.validation_split)
    task = task.fitted(train)
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


def build_model(
    task: Task,
    model_dir: str | os.PathLike,
    seed: int,
    bilstm: bool = False,
    random_init: bool = False,
    dropout: float | None = None,
):
    """The task's head on the checkpoint's encoder; a fresh head (seeded) where the checkpoint
    has none or one of another size. With `random_init`, no weight is read: the whole model is
    initialised from `seed` as BERT initialises (the paper's "no pre-training" comparison).
    `dropout` (if given) replaces the config's hidden and attention dropout."""
    config = task.model_config(read_config(Path(model_dir)))
    if dropout is not None:
        config = dataclasses.replace(
            config, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout
        )
    torch.manual_seed(seed)
    if random_init:
        return MODEL_CLASSES[task.head_class(bilstm)](config)
    return MODEL_CLASSES[task.head_class(bilstm)].from_pretrained(
        model_dir, config=config, ignore_mismatched_sizes=True
    )


def evaluate_split(
    task: Task, model, examples, features, batch_size, device
) -> tuple[dict, Any, Task, dict]:
    """(figures, predictions, the task with its dev-tuned settings, those settings) of one
    labelled split: settings a task tunes (thresholds) are chosen here and the figures are
    those at the chosen settings."""
    outputs = run_outputs(task, model, features, batch_size, device)
    predictions = task.predictions(examples, features, outputs)
    figures = task.score(examples, predictions)
    settings = task.dev_settings(examples, predictions, figures)
    tuned = task.with_settings(settings) if settings else task
    if settings:
        figures = tuned.score(examples, predictions)
    return figures, predictions, tuned, settings


def _resolve(
    task: str | Task,
    config: FinetuneConfig | None,
    out: str | os.PathLike,
    data: str | os.PathLike | DataConfig | None = None,
) -> tuple[Task, FinetuneConfig, Path]:
    """The arguments every entry point takes, as objects: the task (the generic ones with the
    DataConfig given as `data`), the settings with the task's defaults filled in, the output
    folder."""
    if isinstance(task, str):
        task = get_task(task, data if isinstance(data, DataConfig) else None)
    elif isinstance(data, DataConfig):
        raise ValueError("give the DataConfig to the task or as data, not both")
    task.source(data)  # data the task cannot read fails before any work
    return task, (config or FinetuneConfig()).resolved(task), Path(out)


def finetune(
    task: str | Task,
    model: str | os.PathLike,
    data: str | os.PathLike | DataConfig | None,
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
    task, config, out = _resolve(task, config, out, data)
    model = model_dir(model)  # a folder, or a Hub name resolved once
    task.head_class(config.bilstm)  # a head this task cannot have fails before any work
    _check_out(out, config)
    started = time.perf_counter()
    sizes = config.sizes()
    tokenizer = BertTokenizer.from_pretrained(model)
    tokenizer.model_max_length = sizes.max_seq_length
    source = task.source(data)
    # every file is read and checked before OUT is touched: bad input leaves nothing behind
    if config.validation_split and task.test_splits():
        raise ValueError(
            f"--validation-split: {task.name} has its own test file; carve the validation set "
            "or give --test, not both"
        )
    task, train, train_features, devs, summaries, held_out = loaded or load_task_data(
        task, source, tokenizer, config
    )
    if (
        config.resume
        and (finished := _results_of_finished_run(out, task, config, len(train))) is not None
    ):
        logger.info("%s: finished already (results.json), not run again", out)
        return finished
    _claim(out, config)
    if build is None:
        net = build_model(
            task, model, config.seed, config.bilstm, config.random_init, config.dropout
        )
    else:
        net = build(task, model, config.seed)
    set_dropout_parity(net, config.parity)
    task.configure(net, sizes.max_seq_length)
    if tokenizer.vocab_size > net.config.vocab_size:
        raise ValueError(
            f"{model}: vocab.txt has {tokenizer.vocab_size} tokens, the model embeds "
            f"{net.config.vocab_size}: not this model's vocabulary"
        )
    dist = distributed.setup(config.device)
    if dist.enabled:
        raise NotImplementedError("fine-tuning runs in one process (torchrun is for pretrain)")

    batches = FinetuneData(
        train_features,
        sizes.batch_size,
        functools.partial(collate, padded=task.padded_inputs),
        seed=config.seed,
        bucket_batches=sizes.bucket_batches,
    )
    steps_per_epoch = batches.batches_per_epoch
    max_steps = steps_per_epoch * sizes.epochs
    best: dict[str, Any] = {}
    chosen = Selection(task, config.metric)

    def evaluate(wrapped, step: int) -> dict[str, Any]:
        """Score every dev split; keep the best evaluation's model and predictions; ask the
        loop to stop after `patience` evaluations without a better score."""
        model_ = distributed.unwrap(wrapped)
        if not best:
            best.update(_best_so_far(out, chosen))
        epoch = round(step / steps_per_epoch, 3)
        figures, predictions, tuned_tasks, settings = {}, {}, {}, {}
        for split, (examples, features) in devs.items():
            scores, predictions[split], tuned_tasks[split], tuned = evaluate_split(
                task, model_, examples, features, config.eval_batch_size, dist.device
            )
            if split == "dev":
                settings = tuned
            suffix = "" if split == "dev" else "_" + split.removeprefix("dev_")
            figures.update({f"{k}{suffix}": v for k, v in scores.items()})
        score = chosen.score(figures)
        entry: dict[str, Any] = {"split": "eval", "epoch": epoch, **figures, "score": score}
        if chosen.better(score, best.get("score")):
            best.update(score=score, epoch=epoch, dev=figures, report={}, since=0)
            save_finetuned(model_, tokenizer, out, task, config, settings)
            tuned_task = task.with_settings(settings)
            for split, (examples, _) in devs.items():
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
                "is what %s holds)", epoch, best["since"], chosen.name, best["epoch"], out,
            )  # fmt: skip
            entry["stop"] = True
        return entry

    trainer = Trainer(
        net,
        TaskObjective(task),
        batches,
        TrainingConfig(
            out_dir=str(out),
            max_steps=max_steps,
            optim=config.optim(max_steps),
            precision=config.precision,
            compile=config.compile,
            log_every=max(1, min(50, steps_per_epoch // 4)),
            eval_every=config.eval_every or steps_per_epoch,
            save_every=config.eval_every or steps_per_epoch,
            seed=config.seed,
            resume=config.resume and (out / STATE_FILE).exists(),  # a fresh seed starts quietly
            progress=config.progress,
            extra={"task": task.name, "finetune": dataclasses.asdict(config)},
        ),
        dist_info=dist,
        evaluate=evaluate,
    )
    before = None
    if task.scores_before_training and not (out / STATE_FILE).exists():  # (not when resumed)
        examples, features = devs["dev"]
        before = evaluate_split(
            task, trainer.model, examples, features, config.eval_batch_size, dist.device
        )[0]
        logger.info("before training: dev %s", _brief(before))
    trainer.train()
    if not best:
        best.update(_best_so_far(out, chosen))
    results = {
        "task": task.name,
        "model": str(model),
        "data": task.data_description(data),
        "dev": best.get("dev", {}),
        "best_epoch": best.get("epoch"),
        "selected_by": chosen.name,
        **({"before_training": before} if before is not None else {}),
        "epochs": [e for e in read_log(out / LOG_FILE) if e.get("split") == "eval"],
        "hyperparameters": _hyperparameters(config),
        "precision": trainer.precision.as_dict(),  # what auto chose here, and why
        "train_examples": len(train),
        "train_features": len(train_features),
        "steps": max_steps,
    }
    if trainer.stopped:  # early stopping: the steps run, the evaluations without a gain
        results["stopped_early"] = {"step": trainer.step, "patience": config.patience}
    if summaries:
        results["read"] = summaries
    if held_out:  # the dev set as a test: the model chosen on the carved validation, once
        results["validation_split"] = config.validation_split
        results["test"] = _score_held_out(task, out, held_out, config, dist.device)
    report = best.get("report")
    tests = task.test_splits()
    if tests or (report is None and task.reports):
        # the best epoch's model (a resumed run kept it in OUT) on the test files, and on dev
        # again where a resumed run lost the best epoch's report
        _final_evaluation(task, out, source, tokenizer, config, dist.device, results, report)
    elif report:
        results["report"] = report
    # a resumed run also counts the time its checkpoint holds
    results["seconds"] = round(time.perf_counter() - started + trainer.seconds_before, 1)
    _write_json(out / RESULTS_FILE, results)
    write_model_card(out, task, model, data if data is not None else getattr(task, "data", None),
                     config, results)  # fmt: skip
    _draw_reports(out, task, results.get("report", {}))
    plot_log(out / LOG_FILE, out / "curves.png", title=f"{task.name}: {Path(model).name}")
    if not config.keep_state:
        (out / STATE_FILE).unlink(missing_ok=True)
        (out / DIGEST_FILE).unlink(missing_ok=True)
    if (out / MODEL_FILE).exists():
        record_model_digest(out)  # checked by everything that loads it
    return results


def _final_evaluation(
    task: Task, out: Path, source, tokenizer, config, device, results, report
) -> None:
    """Evaluate OUT's model (the best epoch's, with the settings it tuned on dev) on the task's
    test files, and on the dev files when the best epoch's report is not at hand (a resumed
    run): figures, report, predictions."""
    max_seq_length = config.sizes().max_seq_length
    names = list(task.test_splits())
    if report is None:
        names = [*task.dev_splits(), *names]

    def read(split: str):
        examples = task.read(source, split)
        return split, (examples, task.featurize(examples, tokenizer, max_seq_length))

    results["report"] = dict(report or {})
    splits = (read(split) for split in names)
    for split, tuned, examples, predictions in _chosen_model_predictions(
        task, out, splits, config.eval_batch_size, device
    ):
        if tuned.labelled(examples, split):
            if split in tuned.test_splits():
                results[split] = tuned.score(examples, predictions)
            if (found := tuned.report(examples, predictions)) is not None:
                results["report"][split] = found
    if not results["report"]:
        del results["report"]


def _score_held_out(task: Task, out: Path, held_out, config, device) -> dict[str, float]:
    """The figures of OUT's model (chosen on the carved validation, with the settings it tuned
    there) on the task's dev splits; their predictions go where the dev predictions go."""
    figures: dict[str, float] = {}
    for split, tuned, examples, predictions in _chosen_model_predictions(
        task, out, held_out.items(), config.eval_batch_size, device
    ):
        suffix = "" if split == "dev" else "_" + split.removeprefix("dev_")
        figures |= {f"{k}{suffix}": v for k, v in tuned.score(examples, predictions).items()}
    return figures


def _chosen_model_predictions(task: Task, out: Path, splits, batch_size: int, device):
    """OUT's model (the chosen epoch's, with the settings it tuned) on each (split, (examples,
    features)) of `splits`: yields (split, the tuned task, examples, predictions), having
    written the predictions where that split's go."""
    info = read_task_info(out)
    tuned = task.with_settings(info)
    net = MODEL_CLASSES[info["head"]].from_pretrained(out).to(device).eval()
    for split, (examples, features) in splits:
        outputs = run_outputs(tuned, net, features, batch_size, device)
        predictions = tuned.predictions(examples, features, outputs)
        tuned.write_predictions(examples, predictions, out / task.prediction_file(split))
        yield split, tuned, examples, predictions


def _draw_reports(out: Path, task: Task, reports: dict[str, Any]) -> None:
    """confusion.png (and confusion_test.png) from the reports' confusion matrices."""
    for split, report in reports.items():
        confusion = report.get("confusion") if isinstance(report, dict) else None
        if confusion:
            name = "confusion.png" if split == "dev" else f"confusion_{split}.png"
            title = f"{task.name}: {'validation' if split == 'dev' else split}"
            plot_confusion(confusion, out / name, title=title)


def _hyperparameters(config: FinetuneConfig) -> dict[str, Any]:
    return {
        k: getattr(config, k)
        for k in (
            "epochs",
            "learning_rate",
            "batch_size",
            "max_seq_length",
            "seed",
            "warmup_proportion",
            "weight_decay",
            "random_init",
            "bucket_batches",
            "dropout",
            "validation_split",
            "parity",
            "metric",
            "patience",
            "eval_every",
        )
    }


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
    same = (
        results.get("task") == task.name
        # runs written before `bucket_batches` was a setting sorted 50 batches' worth together;
        # before `dropout` and `validation_split`, they kept the checkpoint's and carved none;
        # before `parity`, every run drew its dropout masks as transformers does; before early
        # stopping, the mean of the main metrics chose among epochs
        and {
            "bucket_batches": 50,
            "dropout": None,
            "validation_split": None,
            "parity": True,
            "metric": None,
            "patience": None,
            "eval_every": None,
        }
        | results.get("hyperparameters", {})
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
    from bertkit.config import BertConfig

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
    """The model, its vocabulary and bertkit_task.json: the task, its head, what it learnt
    from the training file (`Task.settings`) and tuned on dev (`settings`)."""
    model.save_pretrained(out, tokenizer=tokenizer)
    info = {
        "task": task.name,
        "head": task.head_class(config.bilstm),
        "max_seq_length": config.max_seq_length,
        **task.settings(),
        **(settings or {}),
    }
    _write_json(out / TASK_FILE, info)


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


def _write_json(path: Path, value: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(value, indent=2) + "\n")


# --------------------------------------------------------------------------- seeds and grid
def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean, std (sample), min and max of every dev figure over runs."""
    summary: dict[str, dict[str, float]] = {}
    for split in ("dev", "test"):
        if not all(split in r for r in runs):
            continue
        keys = [k for k in runs[0][split] if all(k in r[split] for r in runs)]
        figures = {k: stats.summary([r[split][k] for r in runs]) for k in keys}
        for name, field in (("", "mean"), ("_std", "std"), ("_min", "min"), ("_max", "max")):
            summary[split + name] = {k: f[field] for k, f in figures.items()}
    return summary


def _load_once(task: Task, model, data, config: FinetuneConfig) -> TaskData:
    tokenizer = BertTokenizer.from_pretrained(model)
    tokenizer.model_max_length = config.sizes().max_seq_length
    return load_task_data(task, task.source(data), tokenizer, config)


def finetune_seeds(
    task: str | Task,
    model: str | os.PathLike,
    data: str | os.PathLike | DataConfig | None,
    out: str | os.PathLike,
    config: FinetuneConfig | None = None,
    seeds: int = 3,
    build: Callable[[Task, str | os.PathLike, int], torch.nn.Module] | None = None,
    *,
    loaded: TaskData | None = None,
) -> dict[str, Any]:
    """K runs with seeds seed, seed+1, ... in OUT/seed_<s>; OUT/results.json has the mean in
    `"dev"` and `dev_std`, `dev_min`, `dev_max`, every run's figures under `runs`."""
    task, config, out = _resolve(task, config, out, data)
    data = task.source(data)
    loaded = loaded or _load_once(task, model, data, config)  # read and featurised once
    runs = []
    for seed in range(config.seed, config.seed + seeds):
        run_config = dataclasses.replace(config, seed=seed)
        result = finetune(
            task, model, data, out / f"seed_{seed}", run_config, loaded=loaded, build=build
        )
        runs.append(result)
    results = {
        "task": task.name,
        "model": str(model),
        "seeds": [r["hyperparameters"]["seed"] for r in runs],
        **summarize(runs),
        "hyperparameters": runs[0]["hyperparameters"] | {"seed": None},
        "runs": [
            {"seed": r["hyperparameters"]["seed"], "dev": r["dev"], "seconds": r["seconds"]}
            | ({"test": r["test"]} if "test" in r else {})
            for r in runs
        ],
        "seconds": round(sum(r["seconds"] for r in runs), 1),
    }
    _write_json(out / RESULTS_FILE, results)
    return results


def finetune_grid(
    task: str | Task,
    model: str | os.PathLike,
    data: str | os.PathLike | DataConfig | None,
    out: str | os.PathLike,
    config: FinetuneConfig | None = None,
    seeds: int = 1,
    grid: dict[str, tuple] | None = None,
) -> dict[str, Any]:
    """The paper's grid, each point in OUT/b<batch>_lr<lr>_e<epochs> (with `seeds` seeds
    each); the point with the best dev score (`config.metric`'s figure, else the mean of the
    task's metrics; over seeds, their mean) is selected, OUT/results.json reports it."""
    task, config, out = _resolve(task, config, out, data)
    data = task.source(data)
    grid = grid or GRID
    # features depend on max_seq_length only, not on batch, lr or epochs: read them once
    loaded = _load_once(task, model, data, config)
    chosen = Selection(loaded.task, config.metric)
    points = []
    for batch_size, learning_rate, epochs in itertools.product(
        grid["batch_size"], grid["learning_rate"], grid["epochs"]
    ):
        point = dataclasses.replace(
            config, batch_size=batch_size, learning_rate=learning_rate, epochs=epochs
        )
        where = out / f"b{batch_size}_lr{learning_rate:g}_e{epochs}"
        if seeds > 1:
            result = finetune_seeds(task, model, data, where, point, seeds, loaded=loaded)
        else:
            result = finetune(task, model, data, where, point, loaded=loaded)
        points.append(
            {
                "batch_size": batch_size,
                "learning_rate": learning_rate,
                "epochs": epochs,
                "dir": where.name,
                "dev": result["dev"],
                "score": chosen.score(result["dev"]),
            }
            | ({"test": result["test"]} if "test" in result else {})
        )
    selected = (min if chosen.lower else max)(points, key=lambda p: p["score"])
    results = {
        "task": task.name,
        "model": str(model),
        "selected_by": chosen.name,
        "dev": selected["dev"],
        **({"test": selected["test"]} if "test" in selected else {}),
        "selected": {k: selected[k] for k in ("batch_size", "learning_rate", "epochs", "dir")},
        "grid": points,
    }
    _write_json(out / RESULTS_FILE, results)
    return results


# --------------------------------------------------------------------------- evaluation
def evaluate(
    model: str | os.PathLike,
    data: str | os.PathLike,
    *,
    task: str | None = None,
    split: str = "dev",
    out: str | os.PathLike | None = None,
    batch_size: int = 64,
    device: str | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Score a fine-tuned checkpoint on a split of the task's files (`data`: the paper's
    folder, or for your own data a file read as the training files were); with `out`, write
    the predictions there (GLUE test splits: the official submission layout) and, for your own
    data, the confusion picture. Unlabelled files get predictions only. `progress`: a progress
    bar over the batches."""
    # the checkpoint's settings: SQuAD 2.0's threshold, a user's labels and columns
    model = model_dir(model)
    task_obj, info = task_of_checkpoint(model, task)
    tokenizer = BertTokenizer.from_pretrained(model)
    max_seq_length = info.get("max_seq_length", task_obj.default_max_seq_length)
    net = MODEL_CLASSES[info.get("head", task_obj.head)].from_pretrained(model)
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    net.to(target).eval()
    examples = task_obj.read(data, split)
    features = task_obj.featurize(examples, tokenizer, max_seq_length)
    outputs = run_outputs(task_obj, net, features, batch_size, target, progress=progress)
    predictions = task_obj.predictions(examples, features, outputs)
    labelled = task_obj.labelled(examples, split)
    figures = task_obj.score(examples, predictions) if labelled else {}
    result = {"task": task_obj.name, "model": str(model), "split": split, split: figures}
    report = task_obj.report(examples, predictions) if labelled else None
    if report is not None:
        result["report"] = report
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / task_obj.prediction_file(split)
        result["predictions"] = str(task_obj.write_predictions(examples, predictions, path))
        _write_json(out / f"eval_{split}.json", result)
        if report is not None:
            _draw_reports(out, task_obj, {split: report})
    return result
