"""Scoring a model on a task's files: one labelled split while fine-tuning (`evaluate_split`,
which also tunes what a task tunes on dev, such as SQuAD 2.0's threshold), the chosen model on
the test files and on a held-out dev set once training is over, and a saved checkpoint on any
split (`evaluate`, `bertkit evaluate`); the confusion pictures of the reports."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit._io import write_json
from bertkit.inference.loader import load
from bertkit.settings import Settings, device_setting, replaced, setting
from bertkit.tasks import Task
from bertkit.tasks.base import read_task_info, run_outputs
from bertkit.viz import plot_confusion


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


def final_evaluation(
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
    for split, tuned, examples, predictions in chosen_model_predictions(
        task, out, splits, config.eval_batch_size, device
    ):
        if tuned.labelled(examples, split):
            if split in tuned.test_splits():
                results[split] = tuned.score(examples, predictions)
            if (found := tuned.report(examples, predictions)) is not None:
                results["report"][split] = found
    if not results["report"]:
        del results["report"]


def score_held_out(task: Task, out: Path, held_out, config, device) -> dict[str, float]:
    """The figures of OUT's model (chosen on the carved validation, with the settings it tuned
    there) on the task's dev splits; their predictions go where the dev predictions go."""
    figures: dict[str, float] = {}
    for split, tuned, examples, predictions in chosen_model_predictions(
        task, out, held_out.items(), config.eval_batch_size, device
    ):
        suffix = "" if split == "dev" else "_" + split.removeprefix("dev_")
        figures |= {f"{k}{suffix}": v for k, v in tuned.score(examples, predictions).items()}
    return figures


def chosen_model_predictions(task: Task, out: Path, splits, batch_size: int, device):
    """OUT's model (the chosen epoch's, with the settings it tuned) on each (split, (examples,
    features)) of `splits`: yields (split, the tuned task, examples, predictions), having
    written the predictions where that split's go."""
    info = read_task_info(out)
    tuned = task.with_settings(info)
    net = load(out, head=info["head"], device=device).model
    for split, (examples, features) in splits:
        outputs = run_outputs(tuned, net, features, batch_size, device)
        predictions = tuned.predictions(examples, features, outputs)
        tuned.write_predictions(examples, predictions, out / task.prediction_file(split))
        yield split, tuned, examples, predictions


def draw_reports(out: Path, task: Task, reports: dict[str, Any]) -> None:
    """confusion.png (and confusion_test.png) from the reports' confusion matrices."""
    for split, report in reports.items():
        confusion = report.get("confusion") if isinstance(report, dict) else None
        if confusion:
            name = "confusion.png" if split == "dev" else f"confusion_{split}.png"
            title = f"{task.name}: {'validation' if split == 'dev' else split}"
            plot_confusion(confusion, out / name, title=title)


# what other tools call the dev split
SPLIT_NAMES = {"validation": "dev", "valid": "dev", "eval": "dev", "development": "dev"}


@dataclass
class EvaluateConfig(Settings):
    """How `evaluate` scores a saved model: the `bertkit evaluate` flags are these fields."""

    task: str | None = setting(None, "default: the model's own task")
    split: str = setting("dev", "dev (or validation), test, dev_mismatched")
    out: str | os.PathLike | None = setting(
        None, "write predictions (test: GLUE submission files) here"
    )
    batch_size: int = setting(64, "sequences per batch", check="positive")
    device: str | None = device_setting()
    progress: bool = setting(False, "a progress bar over the batches")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.split = SPLIT_NAMES.get(self.split.lower(), self.split)


def evaluate(
    model: str | os.PathLike,
    data: str | os.PathLike,
    config: EvaluateConfig | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Score a fine-tuned checkpoint on a split of the task's files (`data`: the paper's
    folder, or for your own data a file read as the training files were), as `config` (or
    EvaluateConfig's fields by name) says; with `out`, write the predictions there (GLUE test
    splits: the official submission layout) and, for your own data, the confusion picture.
    Unlabelled files get predictions only."""
    config = replaced(config or EvaluateConfig(), **settings)
    split, out = config.split, config.out
    # the checkpoint's settings: SQuAD 2.0's threshold, a user's labels and columns
    loaded = load(model, fine_tuned=True, task=config.task, device=config.device)
    assert loaded.task is not None and loaded.max_seq_length is not None
    model, task_obj, tokenizer = loaded.path, loaded.task, loaded.tokenizer
    max_seq_length, net, target = loaded.max_seq_length, loaded.model, loaded.device
    examples = task_obj.read(data, split)
    features = task_obj.featurize(examples, tokenizer, max_seq_length)
    outputs = run_outputs(
        task_obj, net, features, config.batch_size, target, progress=config.progress
    )
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
        write_json(out / f"eval_{split}.json", result)
        if report is not None:
            draw_reports(out, task_obj, {split: report})
    return result
