"""What a run's checkpoint holds besides its model file: the run's counters (`Progress`) and its
stateful parts, each saved and restored by its own `state_dict` / `load_state_dict`, with the
random generators' states. The trainer's step moves them; `TrainState` alone reads and writes
them (as torchtitan keeps its checkpointer apart from its train step).

>>> import torch
>>> net = torch.nn.Linear(2, 2)
>>> state = TrainState(Progress(step=3), model=net)
>>> saved = state.state_dict(seconds=1.5)
>>> saved["step"], saved["seconds"], sorted(saved["model"])
(3, 1.5, ['bias', 'weight'])
>>> again = TrainState(Progress(), model=torch.nn.Linear(2, 2))
>>> again.load_state_dict(saved, "run/trainer_state.pt")
>>> again.progress.step, again.seconds_before
(3, 1.5)
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

from bertkit.training.run_folder import restore_rng, rng_state


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


@dataclass
class Progress:
    """A run's counters: its step, the time spent in training steps (what a time budget
    counts), the real tokens seen (across ranks), whether an evaluation stopped it early."""

    step: int = 0
    train_seconds: float = 0.0
    tokens_seen: int = 0
    stopped: bool = False


# parts a checkpoint of an earlier version may lack (restored as new where it does)
OPTIONAL = ("divergence",)


class TrainState:
    """A run's counters and stateful parts (model, optimizer, schedule, scaler, data, ...,
    by name), as one checkpoint."""

    def __init__(self, progress: Progress, **parts: Stateful) -> None:
        self.progress, self.parts = progress, parts
        self.seconds_before = 0.0  # wall-clock seconds of the work the loaded state holds

    def state_dict(self, seconds: float, **extra: Any) -> dict[str, Any]:
        """The checkpoint: the step, each part's state, the generators', `extra` (what the
        run was started with), the wall-clock `seconds` of the work it holds and the other
        counters; the optional parts last (the layout of the file as it was before them)."""
        progress = asdict(self.progress)
        state: dict[str, Any] = {"step": progress.pop("step")}
        state |= {name: part.state_dict() for name, part in self.parts.items()
                  if name not in OPTIONAL}  # fmt: skip
        state["rng"] = rng_state()
        state |= extra
        state["seconds"] = seconds
        state |= progress
        state |= {name: part.state_dict() for name, part in self.parts.items() if name in OPTIONAL}
        return state

    def load_state_dict(self, state: dict[str, Any], where: str | os.PathLike) -> None:
        """Every part and counter from `state` (read from `where`, named in errors)."""
        for name, part in self.parts.items():
            if name not in state and name in OPTIONAL:
                continue
            try:
                part.load_state_dict(state[name])
            except RuntimeError as err:
                if name != "model":
                    raise
                raise ValueError(
                    f"{where}: the checkpoint does not fit this model (another config?): {err}"
                ) from None
        restore_rng(state["rng"])
        defaults = Progress()
        for field in fields(Progress):
            kind = type(getattr(defaults, field.name))
            setattr(
                self.progress,
                field.name,
                kind(state.get(field.name, getattr(defaults, field.name))),
            )
        self.seconds_before = float(state.get("seconds", 0.0))
