"""What stops a run early and cleanly: a signal (`StopSignals`: SIGTERM or Ctrl-C finish the step
and save) and a divergence that never reaches infinity (`Divergence`)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import torch

from bertkit.errors import TrainingDiverged
from bertkit.training import distributed

logger = logging.getLogger("bertkit")


class Divergence:
    """A run that diverges without reaching infinity (`finetune --lr 1000`: the loss went 0.69 ->
    25,296 -> 913,408 and the run ended with exit 0). Read at log steps, on the logged loss (the
    same on every rank): the smoothed loss (an exponential average of the logged losses, weight
    1/2 to the newest) above both 3x the run's first step's loss and 10x its own lowest value,
    or the weights' total norm above 100x the run's first. A healthy run's loss falls from
    where it starts (BERT's first loss is near the entropy of a uniform guess: ln 30522 + ln 2
    pre-training, ln C for C classes), so neither factor is reached by noise: 48 committed
    pre-training curves and every fine-tuning run of the test suite stay below them. The weight
    norm's 100x is a margin chosen, not measured against long runs: how far a BERT-base's norm
    grows from Google's init over a full pre-training was not measured here."""

    LOSS_OVER_START, LOSS_OVER_LOW, NORM_OVER_START = 3.0, 10.0, 100.0

    def __init__(self) -> None:
        self.start: float | None = None  # the first step's loss
        self.smoothed: float | None = None
        self.low: float | None = None
        self.norm: float | None = None  # the weights' norm at the first check

    def state_dict(self) -> dict[str, float | None]:
        return {k: getattr(self, k) for k in ("start", "smoothed", "low", "norm")}

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        for key, value in state.items():
            setattr(self, key, value)

    def check(self, loss: float, norm: float) -> str | None:
        """Why the run diverged, or None; `loss` the newest logged loss, `norm` the weights'."""
        if self.start is None:
            self.start = loss
        self.smoothed = loss if self.smoothed is None else (self.smoothed + loss) / 2
        self.low = self.smoothed if self.low is None else min(self.low, self.smoothed)
        self.norm = norm if self.norm is None else self.norm
        if (
            self.smoothed > self.LOSS_OVER_START * self.start
            and self.smoothed > self.LOSS_OVER_LOW * self.low
        ):
            return (
                f"the loss diverged: {self.smoothed:,.4g} (smoothed) against {self.start:.4g} "
                f"at the first step and {self.low:.4g} at its lowest"
            )
        if norm > self.NORM_OVER_START * self.norm:
            return f"the weights' norm exploded: {norm:,.4g} against {self.norm:.4g} at the start"
        return None


class StopSignals:
    """While training, the first SIGTERM or SIGINT (Ctrl-C) asks the loop to stop after the
    current step, save a checkpoint and raise TrainingInterrupted; a second one stops at once.
    Only in the main thread (signal handlers cannot be set elsewhere)."""

    SIGNALS = ("SIGTERM", "SIGINT")

    def __init__(self) -> None:
        self.name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                number = getattr(signal, name)
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _handle(self, number: int, frame: object) -> None:
        if self.name is not None:  # the second signal: stop now
            raise SystemExit(128 + number)
        self.name = signal.Signals(number).name
        logger.warning(
            "%s: finishing this step and saving; send it again to stop at once", self.name
        )

    def requested(self, dist: distributed.Distributed) -> str | None:
        """The signal's name once any rank got one (every rank stops at the same step)."""
        if not dist.enabled:
            return self.name
        flag = torch.tensor([1.0 if self.name else 0.0], device=dist.device)
        if float(distributed.all_reduce_sum(flag, dist)) > 0:
            return self.name or "a signal to another rank"
        return None


def weight_norm(model: torch.nn.Module) -> float:
    """The weights' total L2 norm (read at log steps: a device sync there only)."""
    with torch.no_grad():
        norms = [p.detach().float().norm() for p in model.parameters()]
        return float(torch.stack(norms).norm()) if norms else 0.0


def check_finite_weights(
    model: torch.nn.Module, out: str | os.PathLike, step: int, lr: float | None, lr_flag: str
) -> None:
    """TrainingDiverged when a weight is NaN or infinite (checked before every save)."""
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise diverged(out, f"weights became NaN or infinite by step {step} (e.g. {bad[:3]})",
                       "not saved", lr_flag, lr)  # fmt: skip


def diverged(out: str | os.PathLike, what: str, done: str, lr_flag: str,
             peak: float | None) -> TrainingDiverged:  # fmt: skip
    """The one message of a run that diverged: where, what, what was done about it (the last
    checkpoint is always kept), and the flag to lower, from what."""
    peak_was = f" (the peak was {peak:g})" if peak is not None else ""
    return TrainingDiverged(
        f"{out}: {what}; {done}, the last checkpoint is kept. Lower {lr_flag}{peak_was}"
    )
