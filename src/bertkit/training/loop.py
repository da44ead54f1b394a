"""The one training loop, for pre-training and fine-tuning alike.

What a task brings is an `Objective`: how many units (masked tokens, sequences) a step's loss
averages over, and the loss of a micro-batch as a *sum* over those units. The loop divides by the
step's global count (all micro-batches, all ranks), so gradient accumulation and any number of
DDP processes give exactly the gradients of one process with the whole batch.

Each optimiser step: micro-batches (gradient sync on the last one only), clipping, AdamW, the
schedule; logs to `log.jsonl` (rank 0); evaluation and checkpoints every N steps. A checkpoint is
one file, `trainer_state.pt` (model, optimiser, schedule, RNG states, data position, step), written
to a temporary name and renamed, so a run killed at any moment resumes from the last one and
follows the same trajectory; the model is saved in the Hugging Face layout *before* it, and the
state's and the model file's SHA-256 beside it (`trainer_state.sha256`, checked on resume: a
corrupt state is refused, a model file that is not the state's is written again).

Nothing is lost and nothing is silent: one process writes a run folder (an OS lock); SIGTERM and
Ctrl-C finish the step, save and raise `TrainingInterrupted`; a NaN or infinite loss, gradient or
weight raises `TrainingDiverged` before anything is written, and so does a finite divergence
(`Divergence`: a loss far above where it started, or weights whose norm exploded).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from bertkit._device import to_device
from bertkit._io import (
    DIGEST_FILE,
    MODEL_FILE,
    STATE_FILE,
    atomic_path,
    atomic_write_text,
    read_digests,
    run_lock,
    sha256_of,
)
from bertkit.errors import TrainingDiverged, TrainingInterrupted
from bertkit.precision import resolve_precision
from bertkit.training import distributed
from bertkit.training.host_memory import heap_kept
from bertkit.training.optim import BudgetSchedule, OptimConfig, build_optimizer, build_schedule

logger = logging.getLogger("bertkit")
LOG_FILE = "log.jsonl"
RUN_FILE = "run.json"  # what the run is (TrainingConfig.identity), written before its first step


# What fixes a run's learning-rate schedule: a resumed run must bring the same values.
SCHEDULE_FIELDS = (
    "max_steps",
    "budget_seconds",
    "learning_rate",
    "warmup_steps",
    "warmup_fraction",
    "schedule",
)
_FLAGS = {"learning_rate": "--lr", "budget_seconds": "--budget"}


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


def claim_folder(
    out: Path, identity: dict[str, Any], *, resume: bool, flags: dict[str, str] | None = None
) -> None:
    """Refuse, before any work, an output folder that a run (`identity`: TrainingConfig's)
    must not write to. Without `resume`, a folder holding a run in progress. With it: a folder
    whose run.json records other settings (another run's: the differences are named, with
    their `flags`), and a model without a trainer state unless run.json says it is this run's
    and that no checkpoint was written yet. That is a run killed during its first save: it
    starts again from step 0, which reaches the uninterrupted run's result. A model with no
    record is someone's, and a recorded checkpoint that is gone was deleted: never overwritten."""
    state = (out / STATE_FILE).exists()
    if not resume:
        if state:
            raise FileExistsError(
                f"{out}: holds a run in progress; pass --resume to continue it or pick another "
                "--out"
            )
        return
    record = read_run_record(out)
    recorded = record["identity"] if record is not None else None
    if recorded is not None and recorded != identity:
        flags, before, now = flags or {}, _leaves(recorded), _leaves(identity)
        changed = [
            f"{key} = {before.get(key)}, not {now.get(key)}"
            + (f" ({flags[key]})" if key in flags else "")
            for key in sorted(set(before) | set(now))
            if before.get(key) != now.get(key)
        ]
        raise ValueError(
            f"{out}: holds a run started with other settings ({'; '.join(changed)}), so this "
            f"would not continue it (a changed step count, rate or warm-up would also bend its "
            f"learning-rate schedule mid-run). Resume with the settings it was started with, "
            f"start a new run from its weights with a fresh schedule (bertkit pretrain "
            f"--init-from {out} --out NEW), or pick another --out"
        )
    if not state and (out / MODEL_FILE).exists():
        if record is None:
            why = f"no {RUN_FILE} says this run wrote it"
        elif record.get("checkpoint_step") is not None:
            why = f"its checkpoint of step {record['checkpoint_step']} is gone (deleted?)"
        else:  # this run's own, killed during its first save
            return
        raise FileExistsError(
            f"{out}: holds a model but no {STATE_FILE} ({why}), so there is nothing to resume, "
            f"and starting afresh would overwrite the model. Continue from its weights with a "
            f"fresh schedule (--init-from {out} --out NEW), or pick another --out"
        )


def compiles(choice: str, device: torch.device) -> bool:
    """`compile` resolved: "auto" is on with CUDA, off on the CPU (unpadded batches change
    shape every step, and inductor compiles each new one: tens of seconds on two cores for a
    tiny model, measured; the same losses within 1e-7)."""
    if choice not in ("auto", "on", "off", "graphs"):
        raise ValueError(f"compile must be auto, on, off or graphs, not {choice!r}")
    return choice in ("on", "graphs") or (choice == "auto" and device.type == "cuda")


def compile_seconds() -> float:
    """Wall time torch.compile has spent in this process so far (dynamo's own account)."""
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent().get("total_wall_time", 0.0))


def _leaves(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested values by dotted name: _leaves({"a": 1, "b": {"c": 2}}) -> {"a": 1, "b.c": 2}"""
    leaves: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            leaves.update(_leaves(value, f"{prefix}{key}."))
        else:
            leaves[prefix + key] = value
    return leaves


def read_run_record(out: Path) -> dict[str, Any] | None:
    """OUT/run.json: the run's `identity` and `checkpoint_step`, the step of the last state
    written (None: none yet); None where there is no record. A record that cannot be read
    names the file (it is written atomically: only a hand edit breaks it)."""
    path = out / RUN_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a run record ({err}); delete it to resume anyway") from None
    if not isinstance(record, dict) or not isinstance(record.get("identity"), dict):
        raise ValueError(f'{path}: not a run record (expected {{"identity": {{...}}}})')
    return record


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


class Objective(Protocol):
    """What a run minimises. A bertkit head's batch reaches `loss` with batch["layouts"]: where
    its token rows sit, worked out by the loop while the batch was still on the host
    (`_Head.host_layouts`), so that a GPU never stops to tell the host how many tokens are
    real; `loss` passes it to the model."""

    def counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Units each loss term averages over in this micro-batch, e.g. [masked tokens, pairs]."""

    def loss(
        self, model: torch.nn.Module, batch: dict[str, torch.Tensor], totals: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss divided by the step's global `totals`, statistics to sum for logging)."""

    def log_entry(self, sums: torch.Tensor) -> dict[str, float]:
        """Turn summed statistics into logged numbers."""


class Data(Protocol):
    def next_batch(self) -> dict[str, torch.Tensor]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@contextlib.contextmanager
def _onednn_off(off: bool) -> Iterator[None]:
    """oneDNN switched off within it (`off`). On CPU in fp32, oneDNN compiles and caches a
    primitive for every new shape; with batches padded to their longest sequence and packed to
    their real tokens, shapes change every step and that cache grew resident memory by ~13 MB a
    step (2.9 GB after 300 steps of BERT-tiny) while buying no speed (measured: the same s/step
    without it)."""
    previous = torch.backends.mkldnn.enabled  # (mkldnn.flags() also warns about TF32)
    if off:
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = previous


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        objective: Objective,
        data: Data,
        config: TrainingConfig,
        *,
        dist_info: distributed.Distributed | None = None,
        evaluate: Callable[[torch.nn.Module, int], dict[str, float]] | None = None,
        save_model: Callable[[torch.nn.Module, Path], None] | None = None,
        on_entry: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """`evaluate(model, step)` returns an evaluation entry's figures (every `eval_every`
        steps and at the end); `on_entry` sees every log entry (train and eval) as it is
        written, on rank 0."""
        self.config = config
        self.on_entry = on_entry
        self.dist = dist_info or distributed.Distributed()
        self.objective, self.data = objective, data
        self.evaluate, self.save_model = evaluate, save_model
        self.out_dir = Path(config.out_dir)
        self.model = model.to(self.dist.device)
        if config.budget_seconds is None and not config.max_steps:
            raise ValueError("give a step count (max_steps) or a time budget (budget_seconds)")
        self.optimizer = build_optimizer(self.model, config.optim)
        self.schedule = build_schedule(
            self.optimizer, config.optim, config.max_steps, config.budget_seconds
        )
        self.wrapped = distributed.wrap(self.model, self.dist)
        self.step = 0
        self.stopped = False  # an evaluation returned "stop": True (early stopping)
        self.divergence = Divergence()
        self.tokens_seen = 0  # real (unpadded) tokens so far: this rank's times the world size
        self.train_seconds = 0.0  # time in training steps (what a budget counts), all sessions
        # wall-clock seconds of the work this state holds: before this process (from the
        # checkpoint) plus since this trainer was made
        self.seconds_before, self._clock = 0.0, time.perf_counter()
        self.compiled = compiles(config.compile, self.dist.device)
        if config.compile == "graphs":  # (the run made the model's shapes static)
            self.model.compile(mode="reduce-overhead")
        elif self.compiled:  # in place: parameter names and state dicts stay the module's
            self.model.compile()
        self.precision = resolve_precision(config.precision, self.dist.device)
        self.dtype = self.precision.dtype
        self.scaler = torch.amp.GradScaler(enabled=self.dtype == torch.float16)

    # ------------------------------------------------------------------ state
    def _rng_state(self) -> dict[str, Any]:
        kind, keys, position, has_gauss, gauss = np.random.get_state(legacy=True)
        assert isinstance(keys, np.ndarray)  # the legacy tuple form
        state = {
            "python": random.getstate(),
            # plain values, so the file loads with torch.load(weights_only=True)
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss],
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def save(self) -> None:
        """Rank 0 writes the HF-layout model, then the checkpoint (atomically, one file). The
        state is written last: a run killed between the two resumes from the previous state and
        writes both again, so a state that says "finished" always has its final model beside it.
        Non-finite weights are never written (TrainingDiverged)."""
        self._check_finite_weights()
        if self.dist.is_main:
            model_digest = None
            if self.save_model is not None:
                self.save_model(self.model, self.out_dir)
                if (self.out_dir / MODEL_FILE).exists():
                    model_digest = sha256_of(self.out_dir / MODEL_FILE)
            state = {
                "step": self.step,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "schedule": self.schedule.state_dict(),
                "scaler": self.scaler.state_dict(),
                "data": self.data.state_dict(),
                "rng": self._rng_state(),
                "config": asdict(self.config),
                "schedule_values": self.config.schedule_values(),
                "seconds": self.seconds,
                "train_seconds": self.train_seconds,
                "tokens_seen": self.tokens_seen,
                "stopped": self.stopped,
                "divergence": self.divergence.state_dict(),
            }
            with atomic_path(self.out_dir / STATE_FILE) as tmp:
                torch.save(state, tmp)
                # The digest file lists the previous state's checksum and this one's, and is
                # written before the state is renamed into place: a kill at any point leaves a
                # state whose checksum is listed.
                digests = _read_digests(self.out_dir / DIGEST_FILE)[-1:] + [sha256_of(tmp)]
                record: dict[str, Any] = {"sha256": digests}
                if model_digest is not None:
                    record[MODEL_FILE] = model_digest
                atomic_write_text(self.out_dir / DIGEST_FILE, json.dumps(record))
            self._write_run_record(self.step)
        distributed.barrier(self.dist)

    def _write_run_record(self, checkpoint_step: int | None) -> None:
        """run.json: the run's identity and the step of its last state (claim_folder)."""
        if self.config.identity is not None:
            record = {"identity": self.config.identity, "checkpoint_step": checkpoint_step}
            atomic_write_text(self.out_dir / RUN_FILE, json.dumps(record))

    def _weight_norm(self) -> float:
        """The weights' total L2 norm (read at log steps: a device sync there only)."""
        with torch.no_grad():
            norms = [p.detach().float().norm() for p in self.model.parameters()]
            return float(torch.stack(norms).norm()) if norms else 0.0

    def _check_finite_weights(self) -> None:
        bad = [n for n, p in self.model.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            raise TrainingDiverged(
                f"{self.out_dir}: weights became NaN or infinite by step {self.step} "
                f"(e.g. {bad[:3]}); not saved: the last checkpoint written is kept. Lower --lr "
                f"(it was {self.config.optim.learning_rate:g})"
            )

    def load(self) -> bool:
        path = self.out_dir / STATE_FILE
        if not path.exists():
            return False
        digests = _read_digests(self.out_dir / DIGEST_FILE)
        if digests and sha256_of(path) not in digests:  # (runs from before digests have none)
            raise ValueError(
                f"{path}: the file is corrupt (its SHA-256 is not the one recorded in "
                f"{DIGEST_FILE} when it was written); restore it from a copy, or delete it and "
                f"{DIGEST_FILE} to start the run afresh"
            )
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:
            raise ValueError(f"{path}: cannot read the trainer state ({err})") from None
        # (states written before OptimConfig keep these values flat in their "config")
        saved = state.get("schedule_values", state.get("config", {}))
        now_values = self.config.schedule_values()
        for key in SCHEDULE_FIELDS:
            before, now = saved.get(key), now_values[key]
            if key in saved and before != now:
                flag = _FLAGS.get(key, "--" + key.replace("_", "-"))
                raise ValueError(
                    f"{path}: the run was started with {key} = {before}, not {now}: resuming with "
                    f"another value would change its learning-rate schedule mid-run (with more "
                    f"steps the rate would jump back up). Resume with the same {flag}, or start "
                    f"a new run from these weights with a fresh schedule (bertkit pretrain "
                    f"--init-from {self.out_dir})"
                )
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError as err:
            raise ValueError(
                f"{path}: the checkpoint does not fit this model (another config?): {err}"
            ) from None
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.scaler.load_state_dict(state["scaler"])
        self.data.load_state_dict(state["data"])
        rng = state["rng"]
        version, internal, gauss_next = rng["python"]
        random.setstate((version, tuple(internal), gauss_next))
        kind, keys, position, has_gauss, gauss = rng["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.step = int(state["step"])
        self.seconds_before = float(state.get("seconds", 0.0))
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.stopped = bool(state.get("stopped", False))
        self.divergence.load_state_dict(state.get("divergence", {}))
        return True

    def finished(self) -> bool:
        """The step count or the time budget is spent, whichever comes first, or an evaluation
        asked to stop (early stopping)."""
        config = self.config
        return (
            self.stopped
            or bool(config.max_steps and self.step >= config.max_steps)
            or (config.budget_seconds is not None and self.train_seconds >= config.budget_seconds)
        )

    @property
    def seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self._clock

    # ------------------------------------------------------------------ loop
    def train(self) -> list[dict[str, Any]]:
        if self.dist.device.type != "cpu":
            return self._train()
        # On CPU, freed buffers stay in the heap for the next step (`host_memory`: a step's
        # large buffers page-faulted afresh every step, 8% of an MRPC step on an AVX2 EPYC);
        # in fp32 without oneDNN (`_onednn_off`)
        with heap_kept(), _onednn_off(self.dtype is None):
            return self._train()

    def _train(self) -> list[dict[str, Any]]:
        lock = run_lock(self.out_dir) if self.dist.is_main else contextlib.nullcontext()
        with lock, _StopSignals() as stop:
            return self._train_until(stop)

    def _train_until(self, stop: _StopSignals) -> list[dict[str, Any]]:
        config = self.config
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:  # temporary files of writes a kill cut short
            for leftover in self.out_dir.glob(".*.tmp"):
                leftover.unlink(missing_ok=True)
        torch.manual_seed(config.seed)
        resumed = config.resume and self.load()
        if config.resume and not resumed:
            if (self.out_dir / RUN_FILE).exists():  # claim_folder found it this run's own
                logger.warning(
                    "%s: this run was stopped before its first checkpoint; starting it again "
                    "from step 0",
                    self.out_dir,
                )
            else:
                logger.warning(
                    "%s: no %s to resume from; starting afresh", self.out_dir, STATE_FILE
                )
        if self.dist.is_main and not resumed:
            # a kill during the first save can leave the digests of a state never renamed in
            (self.out_dir / DIGEST_FILE).unlink(missing_ok=True)
        if self.dist.is_main and not (resumed and (self.out_dir / RUN_FILE).exists()):
            self._write_run_record(self.step if resumed else None)
        if resumed and self.save_model is not None and self.dist.is_main:
            # The model file is written before the state: a kill between the two, a state from
            # before that order or a file changed since leaves a model.safetensors that is not
            # the state's. Its recorded SHA-256 tells; the state's weights are then written again
            # (and a finished run's always: what it leaves must be its final model).
            path = self.out_dir / MODEL_FILE
            recorded = _read_model_digest(self.out_dir / DIGEST_FILE)
            stale = path.exists() and recorded is not None and sha256_of(path) != recorded
            if stale:
                logger.warning(
                    "%s: not the model of step %d (its SHA-256 differs from the one recorded in "
                    "%s); written again from %s",
                    path,
                    self.step,
                    DIGEST_FILE,
                    STATE_FILE,
                )
            if stale or self.finished():
                self.save_model(self.model, self.out_dir)
        log = _Log(
            self.out_dir / LOG_FILE, self.dist.is_main, keep_until=self.step if resumed else 0
        )
        if not self.finished():  # a finished run resumed writes nothing
            # what this session computes in, and why (a resumed run may be on another machine)
            run = {"step": self.step, "split": "run", **self.precision.as_dict()}
            log.write(run | {"compiled": self.compiled, "graphs": config.compile == "graphs"})
            if config.progress and self.dist.is_main:
                print(f"precision: {self.precision.reason}", file=sys.stderr, flush=True)
        entries: list[dict[str, Any]] = []
        bar = self._progress()
        sums = norms = None
        tokens, steps_logged = 0, 0
        tick = time.perf_counter()
        self.wrapped.train()
        budget_schedule = self.schedule if isinstance(self.schedule, BudgetSchedule) else None
        budget = budget_schedule is not None
        compiling = 0.0  # seconds torch.compile took during this session's steps
        while not self.finished():
            started = time.perf_counter()
            compiled_before = compile_seconds() if self.compiled else 0.0
            if budget_schedule is not None:
                budget_schedule.set_spent(self.train_seconds)
            batches = [self.data.next_batch() for _ in range(config.accumulation)]
            plan = getattr(self.model, "host_layouts", None)
            totals = torch.stack([self.objective.counts(b) for b in batches]).sum(0).double()
            if self.dist.enabled:  # (one process: no trip to the device, whose .cpu() would
                # wait for the last step's kernels and keep the host from running ahead)
                totals = distributed.all_reduce_sum(totals.to(self.dist.device), self.dist).cpu()
            for index, batch in enumerate(batches):
                real = int(batch["attention_mask"].sum())  # counted on the CPU: no device sync
                tokens += real
                self.tokens_seen += real * self.dist.world_size
                host, device = batch, self.dist.device
                batch = {k: to_device(v, device) for k, v in host.items()}
                last = index == len(batches) - 1
                sync = (
                    contextlib.nullcontext()
                    if last or not self.dist.enabled
                    else self.wrapped.no_sync()  # type: ignore[operator]
                )
                with (
                    sync,
                    torch.autocast(
                        self.dist.device.type, dtype=self.dtype, enabled=self.dtype is not None
                    ),
                ):
                    layouts = plan(host, device) if plan is not None else None
                    if layouts is not None:  # (under autocast: it sets the CPU's row multiple)
                        batch["layouts"] = layouts
                    loss, stats = self.objective.loss(self.wrapped, batch, totals)
                    # DDP averages gradients over ranks; the loss is already a global mean
                    loss = loss * self.dist.world_size
                self.scaler.scale(loss).backward()
                stats = stats.detach().double()  # stays on the device until a log step
                sums = stats if sums is None else sums + stats
            self.scaler.unscale_(self.optimizer)
            norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), config.optim.max_grad_norm
            )
            norm = norm.detach().double()  # before clipping
            # Reading the norm waits for the device: every step on the CPU (where it is free),
            # at log steps on a GPU (a NaN there may touch the weights first; the finite check
            # before every save still keeps them out of the checkpoint). With fp16 loss scaling
            # an overflow only skips the step: the scaler's job.
            check = self.dist.device.type == "cpu" or (self.step + 1) % config.log_every == 0
            if check and not self.scaler.is_enabled() and not torch.isfinite(norm):
                raise TrainingDiverged(
                    f"{self.out_dir}: the loss or its gradient is NaN or infinite at step "
                    f"{self.step + 1} (learning rate {self.schedule.get_last_lr()[0]:g}); "
                    "stopped before this step touched the weights, the last checkpoint is kept. "
                    f"Lower --lr (the peak was {config.optim.learning_rate:g})"
                )
            norms = norm if norms is None else norms + norm
            self.scaler.step(self.optimizer)
            self.scaler.update()
            lr = self.schedule.get_last_lr()[0]
            self.schedule.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            steps_logged += 1
            spent = compile_seconds() - compiled_before if self.compiled else 0.0
            compiling += spent  # not training time: a budget and tokens/s leave it out
            tick += spent
            self.train_seconds += time.perf_counter() - started - spent
            if budget:  # every rank stops at the same step: rank 0's clock decides
                self.train_seconds = distributed.broadcast_float(self.train_seconds, self.dist)
            last = self.finished()
            if self.divergence.start is None:  # the run's first step: where its loss starts
                assert sums is not None
                first = distributed.all_reduce_sum(sums.clone(), self.dist).cpu()
                self.divergence.start = self.objective.log_entry(first)["loss"]
            if self.step % config.log_every == 0 or last:
                assert sums is not None
                sums = distributed.all_reduce_sum(sums, self.dist).cpu()
                elapsed = time.perf_counter() - tick
                entry = {
                    "step": self.step,
                    "split": "train",
                    **self.objective.log_entry(sums),
                    "lr": lr,
                    "grad_norm": round(float(norms) / steps_logged, 4),
                    "tokens": self.tokens_seen,
                    "seconds": round(self.train_seconds, 2),
                }
                entry["tokens_per_s"] = round(tokens * self.dist.world_size / max(elapsed, 1e-9), 1)
                entries.append(entry)
                log.write(entry)
                self._tell(entry)
                why = self.divergence.check(float(entry["loss"]), self._weight_norm())
                if why is not None:
                    raise TrainingDiverged(
                        f"{self.out_dir}: {why}, at step {self.step} (learning rate {lr:g}); "
                        "stopped, the last checkpoint is kept. Lower --lr (the peak was "
                        f"{config.optim.learning_rate:g})"
                    )
                if bar is not None:
                    bar.set_postfix(
                        loss=f"{entry['loss']:.4f}", tok_s=f"{entry['tokens_per_s']:.0f}"
                    )
                sums = norms = None
                tokens, tick, steps_logged = 0, time.perf_counter(), 0
            if bar is not None:
                bar.update(1)
            if self.evaluate is not None and (
                (config.eval_every and self.step % config.eval_every == 0) or last
            ):
                entry = {
                    "step": self.step,
                    **self._evaluate(),
                    "tokens": self.tokens_seen,
                    "seconds": round(self.train_seconds, 2),
                }
                if entry.pop("stop", False):  # early stopping: this step is the last
                    self.stopped = last = True
                entries.append(entry)
                log.write(entry)
                self._tell(entry)
                if bar is not None:  # on the console too, above the progress bar
                    bar.write(f"step {self.step}: {format_figures(entry)}")
                self.wrapped.train()
            stopping = stop.requested(self.dist)
            if self.step % config.save_every == 0 or last or stopping:
                self.save()
            if stopping and not last:
                if bar is not None:
                    bar.close()
                raise TrainingInterrupted(
                    f"stopped by {stopping} at step {self.step}; a checkpoint is saved in "
                    f"{self.out_dir}: continue with --resume",
                    stopping,
                )
        if bar is not None:
            bar.close()
        if self.compiled and compiling:
            entry = {"step": self.step, "split": "compile", "seconds": round(compiling, 2)}
            entries.append(entry)
            log.write(entry)
        return entries

    def _tell(self, entry: dict[str, Any]) -> None:
        if self.on_entry is not None and self.dist.is_main:
            self.on_entry(entry)

    def _evaluate(self) -> dict[str, float]:
        self.wrapped.eval()
        with (
            torch.no_grad(),
            torch.autocast(self.dist.device.type, dtype=self.dtype, enabled=self.dtype is not None),
        ):
            assert self.evaluate is not None
            return self.evaluate(self.wrapped, self.step)

    def _progress(self):
        if not (self.config.progress and self.dist.is_main):
            return None
        from tqdm import tqdm

        total = self.config.max_steps if self.config.budget_seconds is None else None
        return tqdm(total=total, initial=self.step, desc="train", unit="step")


def _read_digests(path: Path) -> list[str]:
    return read_digests(path).get("sha256", [])


def _read_model_digest(path: Path) -> str | None:
    """The SHA-256 recorded for the model file beside the state (None: none recorded)."""
    value = read_digests(path).get(MODEL_FILE)
    return value if isinstance(value, str) else None


def format_figures(entry: dict[str, Any]) -> str:
    """An evaluation's numbers in one line: "mlm_accuracy 0.2270, nsp_accuracy 0.6730, ..."."""
    skip = {"step", "split", "tokens", "seconds", "epoch", "score"}
    return ", ".join(
        f"{k} {v:.4f}"
        for k, v in entry.items()
        # per-type figures (f1_PER, precision_NP, ...) stay in log.jsonl: one short line here
        if k not in skip and isinstance(v, float) and not re.search(r"_[A-Z]", k)
    )


class _StopSignals:
    """While training, the first SIGTERM or SIGINT (Ctrl-C) asks the loop to stop after the
    current step, save a checkpoint and raise TrainingInterrupted; a second one stops at once.
    Only in the main thread (signal handlers cannot be set elsewhere)."""

    SIGNALS = ("SIGTERM", "SIGINT")

    def __init__(self) -> None:
        self.name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
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


class _Log:
    """log.jsonl: one JSON object per line. On resume, lines past the checkpoint's step go, so
    the file reads as if the run had never stopped. With TensorBoard installed, the same numbers
    also go to `tensorboard/` beside it (as `train/loss`, `eval/mlm_accuracy`, ...)."""

    def __init__(self, path: Path, enabled: bool, keep_until: int) -> None:
        self.path, self.enabled = path, enabled
        self.board = None
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            pass
        else:
            self.board = SummaryWriter(str(path.parent / "tensorboard"), purge_step=keep_until + 1)
        kept = []
        if keep_until and path.exists():
            lines = path.read_bytes().split(b"\n")
            for number, raw in enumerate(lines, start=1):
                if not raw.strip():
                    continue
                try:
                    line = raw.decode("utf-8")
                    if json.loads(line)["step"] <= keep_until:
                        kept.append(line)
                except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
                    if number < len(lines) - 1:  # not the last line, which a kill can cut short
                        logger.warning("%s:%d: not a log entry, dropped on resume", path, number)
        with atomic_path(path) as tmp:
            tmp.write_text("".join(line + "\n" for line in kept))

    def write(self, entry: dict[str, Any]) -> None:
        if self.enabled:
            clean = {
                k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in entry.items()
            }
            # opened for each entry (one every log_every steps): nothing is left open when the
            # loop ends by an exception, and each line is on disk when write returns
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(clean) + "\n")
            if self.board is not None:
                split = entry.get("split", "train")
                for key, value in clean.items():
                    if isinstance(value, (int, float)) and key != "step":
                        self.board.add_scalar(f"{split}/{key}", value, entry["step"])
                self.board.flush()
