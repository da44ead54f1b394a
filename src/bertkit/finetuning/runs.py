"""Several fine-tuning runs of one task: seeds (`finetune_seeds`: fine-tuning small tasks is
unstable, and one seed hides it; mean, std, min and max of every figure) and the paper's grid
(`finetune_grid`: batch 16/32 x lr 5e-5/3e-5/2e-5 x epochs 2/3/4, the point chosen on dev).
The data is read and featurised once for all of them."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bertkit import stats
from bertkit._io import write_json
from bertkit.core.tokenizer import BertTokenizer
from bertkit.finetuning.train import (
    RESULTS_FILE,
    Data,
    FinetuneConfig,
    Selection,
    TaskData,
    finetune,
    load_task_data,
    resolve_run,
)
from bertkit.settings import replaced
from bertkit.tasks import Task

GRID = {"batch_size": (16, 32), "learning_rate": (5e-5, 3e-5, 2e-5), "epochs": (2, 3, 4)}


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


def _start(task: str | Task, model: str | os.PathLike, data: Data, out: str | os.PathLike,
           config: FinetuneConfig | None, loaded: TaskData | None = None
           ) -> tuple[Task, FinetuneConfig, Path, Any, TaskData]:  # fmt: skip
    """The start of a series of runs: the arguments as objects (`resolve_run`), what the task
    reads of `data`, and the data read and featurised once for every run of the series
    (features depend on max_seq_length only, not on batch, rate, epochs or seed)."""
    task, config, out = resolve_run(task, config, out, data)
    data = task.source(data)
    if loaded is None:
        loaded = load_task_data(task, data, BertTokenizer.from_pretrained(model), config)
    return task, config.resolved(loaded.task), out, data, loaded


def finetune_seeds(task: str | Task, model: str | os.PathLike, data: Data, out: str | os.PathLike,
                   config: FinetuneConfig | None = None, seeds: int = 3,
                   build: Callable[[Task, str | os.PathLike, int], torch.nn.Module] | None = None,
                   *, loaded: TaskData | None = None) -> dict[str, Any]:  # fmt: skip
    """K runs with seeds seed, seed+1, ... in OUT/seed_<s>; OUT/results.json has the mean in
    `"dev"` and `dev_std`, `dev_min`, `dev_max`, every run's figures under `runs`."""
    task, config, out, data, loaded = _start(task, model, data, out, config, loaded)
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
    write_json(out / RESULTS_FILE, results)
    return results


def finetune_grid(task: str | Task, model: str | os.PathLike, data: Data, out: str | os.PathLike,
                  config: FinetuneConfig | None = None, seeds: int = 1,
                  grid: dict[str, tuple] | None = None) -> dict[str, Any]:  # fmt: skip
    """The paper's grid, each point in OUT/b<batch>_lr<lr>_e<epochs> (with `seeds` seeds
    each); the point with the best dev score (`config.metric`'s figure, else the mean of the
    task's metrics; over seeds, their mean) is selected, OUT/results.json reports it."""
    task, config, out, data, loaded = _start(task, model, data, out, config)
    grid = grid or GRID
    chosen = Selection(loaded.task, config.metric)
    points = []
    for batch_size, learning_rate, epochs in itertools.product(
        grid["batch_size"], grid["learning_rate"], grid["epochs"]
    ):
        point = replaced(config, batch_size=batch_size, learning_rate=learning_rate, epochs=epochs)
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
    write_json(out / RESULTS_FILE, results)
    return results
