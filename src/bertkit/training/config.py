"""How the training loop runs (`TrainingConfig`): for how long, with which optimiser and
schedule, at which precision and compile setting, and its cadence; and how a run computes
(`ComputeConfig`), declared once for pre-training and fine-tuning, whose settings nest it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from bertkit.settings import (
    Settings,
    checkpointing_setting,
    compile_setting,
    device_setting,
    parity_setting,
    precision_setting,
)
from bertkit.training.optim import OptimConfig


@dataclass
class ComputeConfig(Settings):
    """How a run computes, the same for pre-training and fine-tuning (both nest it: their
    flags and Python names are these fields', `--precision`, `FinetuneConfig(precision=...)`)."""

    precision: str = precision_setting()
    parity: bool = parity_setting()
    compile: str = compile_setting()
    activation_checkpointing: bool = checkpointing_setting()
    device: str | None = device_setting()


@dataclass
class TrainingConfig:
    """How the loop runs: for how long (`max_steps` optimiser steps, or a wall-clock
    `budget_seconds` of training, evaluations and checkpoints not charged; whichever ends first
    when both are given), the optimiser and schedule (`optim`, used as given), and the loop's
    own cadence."""

    out_dir: str
    max_steps: int | None  # None: until the time budget is spent
    budget_seconds: float | None = None
    optim: OptimConfig = field(default_factory=OptimConfig)
    accumulation: int = 1  # micro-batches per optimiser step
    precision: str = "auto"  # see bertkit.precision.resolve_precision
    compile: str = "off"  # on, off, auto (on with CUDA): `compiles`
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    save_every: int = 1000
    seed: int = 0
    resume: bool = False
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # recorded in the checkpoint
    # The settings that make the run what it is ({name: JSON value}), recorded in OUT/run.json
    # before its first step: `claim_folder` knows the run's own folder by it.
    identity: dict[str, Any] | None = None

    def schedule_values(self) -> dict[str, Any]:
        """What fixes the learning-rate schedule, resolved (a resumed run must match)."""
        optim = self.optim
        return {
            "max_steps": self.max_steps,
            "budget_seconds": self.budget_seconds,
            "learning_rate": optim.learning_rate,
            "warmup_steps": optim.warmup_steps_for(self.max_steps, self.budget_seconds),
            "warmup_fraction": optim.budget_warmup(),
            "schedule": optim.schedule,
        }


def compiles(choice: str, device: torch.device) -> bool:
    """`compile` resolved: "auto" is on with CUDA, off on the CPU, where inductor's code was
    slower than eager on every step measured: fine-tuning all-MiniLM-L6-v2 on MRPC under bf16
    autocast 0.70x (747 against 523 ms a step after compiling, 2 threads of a Zen 4 with
    AVX512-BF16: docs/results/matrix_units), pre-training BERT-tiny 0.68x, 61 s to compile
    (an AMX CPU not measured)."""
    if choice not in ("auto", "on", "off", "graphs"):
        raise ValueError(f"compile must be auto, on, off or graphs, not {choice!r}")
    return choice in ("on", "graphs") or (choice == "auto" and device.type == "cuda")


def compile_seconds() -> float:
    """Wall time torch.compile has spent in this process so far (dynamo's own account)."""
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent().get("total_wall_time", 0.0))
