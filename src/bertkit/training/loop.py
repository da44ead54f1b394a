"""The one training loop, for pre-training and fine-tuning alike.

What a task brings is an `Objective`: how many units (masked tokens, sequences) a step's loss
averages over, and the loss of a micro-batch as a *sum* over those units. The loop divides by the
step's global count (all micro-batches, all ranks), so gradient accumulation and any number of
DDP processes give exactly the gradients of one process with the whole batch.

Each optimiser step (`_step`): micro-batches (gradient sync on the last one only), clipping,
AdamW, the schedule; every `log_every` steps a log entry (`_log_window`); evaluation and
checkpoints every N steps (`_evaluate_and_save`); a run resumes where its state says
(`_resume`). The run folder's files, written atomically with their checksums, are
`run_folder`'s; what stops a run early and cleanly (signals, NaN, divergence) is `guards`'.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from bertkit._device import fit_threads, to_device
from bertkit._io import DIGEST_FILE, MODEL_FILE, STATE_FILE, run_lock, sha256_of
from bertkit.errors import TrainingInterrupted
from bertkit.precision import resolve_precision
from bertkit.settings import flag as settings_flag
from bertkit.training import distributed
from bertkit.training.config import TrainingConfig, compile_seconds, compiles
from bertkit.training.guards import (
    Divergence,
    StopSignals,
    check_finite_weights,
    diverged,
    weight_norm,
)
from bertkit.training.host_memory import heap_kept, onednn_off
from bertkit.training.optim import BudgetSchedule, build_optimizer, build_schedule
from bertkit.training.run_folder import (
    LOG_FILE,
    RUN_FILE,
    RunLog,
    clear_leftovers,
    format_figures,
    read_state,
    stale_model,
    write_run_record,
    write_state,
)
from bertkit.training.state import Progress, TrainState

logger = logging.getLogger("bertkit")


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


def _counter(name: str) -> property:
    """A Trainer attribute that is its `progress`'s counter `name`."""
    return property(lambda self: getattr(self.progress, name),
                    lambda self, value: setattr(self.progress, name, value))  # fmt: skip


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
        flags: dict[str, str] | None = None,
    ) -> None:
        """`evaluate(model, step)` returns an evaluation entry's figures (every `eval_every`
        steps and at the end); `on_entry` sees every log entry (train and eval) as it is
        written, on rank 0; `flags`: how the run's command spells its settings ({name: flag},
        `settings.flat`), for the messages that name one (default: the settings' own)."""
        fit_threads()
        self.flags = flags or {}
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
        self.progress = Progress()  # the step, training seconds, tokens, early stop (`state`)
        self.divergence = Divergence()
        self._clock = time.perf_counter()  # (`seconds`: the checkpoint's plus this process's)
        self.compiled = compiles(config.compile, self.dist.device)
        if config.compile == "graphs":  # (the run made the model's shapes static)
            self.model.compile(mode="reduce-overhead")
        elif self.compiled:  # in place: parameter names and state dicts stay the module's
            self.model.compile()
        self.precision = resolve_precision(config.precision, self.dist.device)
        self.dtype = self.precision.dtype
        self.scaler = torch.amp.GradScaler(enabled=self.dtype == torch.float16)
        # what a checkpoint holds besides the model file, saved and restored as one
        self.state = TrainState(self.progress, model=self.model, optimizer=self.optimizer,
                                schedule=self.schedule, scaler=self.scaler, data=self.data,
                                divergence=self.divergence)  # fmt: skip

    # the run's counters, kept in `progress` (saved with the state)
    step = _counter("step")
    train_seconds = _counter("train_seconds")  # in training steps (what a budget counts)
    tokens_seen = _counter("tokens_seen")  # real tokens: this rank's times the world size
    stopped = _counter("stopped")  # an evaluation returned "stop": True (early stopping)

    @property
    def seconds_before(self) -> float:
        """Wall-clock seconds of the work the loaded checkpoint holds."""
        return self.state.seconds_before

    # ------------------------------------------------------------------ state
    def save(self) -> None:
        """Rank 0 writes the HF-layout model, then the checkpoint (atomically, one file). The
        state is written last: a run killed between the two resumes from the previous state and
        writes both again, so a state that says "finished" always has its final model beside it.
        Non-finite weights are never written (TrainingDiverged)."""
        lr = self.config.optim.learning_rate
        check_finite_weights(self.model, self.out_dir, self.step, lr, self.flag("learning_rate"))
        if self.dist.is_main:
            model_digest = None
            if self.save_model is not None:
                self.save_model(self.model, self.out_dir)
                if (self.out_dir / MODEL_FILE).exists():
                    model_digest = sha256_of(self.out_dir / MODEL_FILE)
            state = self.state.state_dict(self.seconds, config=asdict(self.config),
                                          schedule_values=self.config.schedule_values())  # fmt: skip
            write_state(self.out_dir, state, model_digest)
            write_run_record(self.out_dir, self.config.identity, self.step)
        distributed.barrier(self.dist)

    def load(self) -> bool:
        state = read_state(self.out_dir, self.config.schedule_values(), self.flag)
        if state is None:
            return False
        self.state.load_state_dict(state, self.out_dir / STATE_FILE)
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

    def flag(self, name: str) -> str:
        """The flag that sets the setting `name`, as the run's command spells it."""
        return self.flags.get(name) or settings_flag(name)

    @property
    def seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self._clock

    # ------------------------------------------------------------------ loop
    def train(self) -> list[dict[str, Any]]:
        if self.dist.device.type != "cpu":
            return self._train()
        # On CPU, freed buffers stay in the heap for the next step (`host_memory`: a step's
        # large buffers page-faulted afresh every step, 8% of an MRPC step on an AVX2 EPYC);
        # in fp32 without oneDNN (`onednn_off`)
        with heap_kept(), onednn_off(self.dtype is None):
            return self._train()

    def _train(self) -> list[dict[str, Any]]:
        lock = run_lock(self.out_dir) if self.dist.is_main else contextlib.nullcontext()
        with lock, StopSignals() as stop:
            log = self._resume()
            window = _Window()
            bar = self._progress()
            self.wrapped.train()
            budget = self.schedule if isinstance(self.schedule, BudgetSchedule) else None
            while not self.finished():
                if budget is not None:
                    budget.set_spent(self.train_seconds)
                lr = self._step(window)
                last = self.finished()
                if self.step % self.config.log_every == 0 or last:
                    self._log_window(window, lr, log, bar)
                if bar is not None:
                    bar.update(1)
                self._evaluate_and_save(window, log, bar, stop, last)
            if bar is not None:
                bar.close()
            if self.compiled and window.compiling:
                entry = {
                    "step": self.step,
                    "split": "compile",
                    "seconds": round(window.compiling, 2),
                }
                window.entries.append(entry)
                log.write(entry)
            return window.entries

    def _resume(self) -> RunLog:
        """The folder made ready and the state loaded (`resume`); the log opened past it."""
        config, out, main = self.config, self.out_dir, self.dist.is_main
        out.mkdir(parents=True, exist_ok=True)
        if main:
            clear_leftovers(out)
        torch.manual_seed(config.seed)
        resumed = config.resume and self.load()
        if config.resume and not resumed:
            if (out / RUN_FILE).exists():  # claim_folder found it this run's own
                logger.warning(
                    "%s: this run was stopped before its first checkpoint; starting it again "
                    "from step 0",
                    out,
                )
            else:
                logger.warning("%s: no %s to resume from; starting afresh", out, STATE_FILE)
        if main and not resumed:
            # a kill during the first save can leave the digests of a state never renamed in
            (out / DIGEST_FILE).unlink(missing_ok=True)
        if main and not (resumed and (out / RUN_FILE).exists()):
            write_run_record(out, config.identity, self.step if resumed else None)
        if resumed and self.save_model is not None and main:
            # (a finished run's model is always written again: it must be its final model)
            if stale_model(out, self.step) or self.finished():
                self.save_model(self.model, out)
        log = RunLog(out / LOG_FILE, main, keep_until=self.step if resumed else 0)
        if not self.finished():  # a finished run resumed writes nothing
            # what this process computes in, and why (a resumed run may be on another machine)
            run = {"step": self.step, "split": "run", **self.precision.as_dict()}
            log.write(run | {"compiled": self.compiled, "graphs": config.compile == "graphs"})
            if config.progress and main:
                print(f"precision: {self.precision.reason}", file=sys.stderr, flush=True)
        return log

    def _step(self, window: _Window) -> float:
        """One optimiser step over `accumulation` micro-batches, its loss statistics and
        gradient norm added to `window`; returns the step's learning rate."""
        config = self.config
        started = time.perf_counter()
        compiled_before = compile_seconds() if self.compiled else 0.0
        batches = [self.data.next_batch() for _ in range(config.accumulation)]
        totals = torch.stack([self.objective.counts(b) for b in batches]).sum(0).double()
        if self.dist.enabled:  # (one process: no trip to the device, whose .cpu() would
            # wait for the last step's kernels and keep the host from running ahead)
            totals = distributed.all_reduce_sum(totals.to(self.dist.device), self.dist).cpu()
        for index, batch in enumerate(batches):
            window.add(self._backward(batch, totals, last=index == len(batches) - 1))
        self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.optim.max_grad_norm)
        norm = norm.detach().double()  # before clipping
        # Reading the norm waits for the device: every step on the CPU (where it is free),
        # at log steps on a GPU (a NaN there may touch the weights first; the finite check
        # before every save still keeps them out of the checkpoint). With fp16 loss scaling
        # an overflow only skips the step: the scaler's job.
        check = self.dist.device.type == "cpu" or (self.step + 1) % config.log_every == 0
        if check and not self.scaler.is_enabled() and not torch.isfinite(norm):
            raise diverged(
                self.out_dir,
                f"the loss or its gradient is NaN or infinite at step {self.step + 1} (learning "
                f"rate {self.schedule.get_last_lr()[0]:g})",
                "stopped before this step touched the weights",
                self.flag("learning_rate"),
                config.optim.learning_rate,
            )
        window.norms = norm if window.norms is None else window.norms + norm
        self.scaler.step(self.optimizer)
        self.scaler.update()
        lr = float(self.schedule.get_last_lr()[0])
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        window.steps += 1
        spent = compile_seconds() - compiled_before if self.compiled else 0.0
        window.compiling += spent  # not training time: a budget and tokens/s leave it out
        window.tick += spent
        self.train_seconds += time.perf_counter() - started - spent
        if isinstance(self.schedule, BudgetSchedule):  # every rank stops at the same step
            self.train_seconds = distributed.broadcast_float(self.train_seconds, self.dist)
        if self.divergence.start is None:  # the run's first step: where its loss starts
            assert window.sums is not None
            first = distributed.all_reduce_sum(window.sums.clone(), self.dist).cpu()
            self.divergence.start = self.objective.log_entry(first)["loss"]
        return lr

    def _backward(self, host: dict[str, torch.Tensor], totals: torch.Tensor, *, last: bool):
        """One micro-batch's loss, backward (gradients synced on the step's `last` only); its
        real tokens and statistics."""
        real = int(host["attention_mask"].sum())  # counted on the CPU: no device sync
        self.tokens_seen += real * self.dist.world_size
        device = self.dist.device
        batch = {k: to_device(v, device) for k, v in host.items()}
        sync = (
            contextlib.nullcontext() if last or not self.dist.enabled else self.wrapped.no_sync()  # type: ignore[operator]
        )
        plan = getattr(self.model, "host_layouts", None)
        with sync, torch.autocast(device.type, dtype=self.dtype, enabled=self.dtype is not None):
            layouts = plan(host, device) if plan is not None else None
            if layouts is not None:  # (under autocast: it sets the CPU's row multiple)
                batch["layouts"] = layouts
            loss, stats = self.objective.loss(self.wrapped, batch, totals)
            # DDP averages gradients over ranks; the loss is already a global mean
            loss = loss * self.dist.world_size
        self.scaler.scale(loss).backward()
        return real, stats.detach().double()  # stays on the device until a log step

    def _log_window(self, window: _Window, lr: float, log: RunLog, bar) -> None:
        """The steps since the last log entry as one entry; a divergence stops the run."""
        assert window.sums is not None and window.norms is not None
        sums = distributed.all_reduce_sum(window.sums, self.dist).cpu()
        elapsed = time.perf_counter() - window.tick
        entry: dict[str, Any] = {
            "step": self.step,
            "split": "train",
            **self.objective.log_entry(sums),
            "lr": lr,
            "grad_norm": round(float(window.norms) / window.steps, 4),
            "tokens": self.tokens_seen,
            "seconds": round(self.train_seconds, 2),
        }
        entry["tokens_per_s"] = round(window.tokens * self.dist.world_size / max(elapsed, 1e-9), 1)
        window.entries.append(entry)
        log.write(entry)
        self._tell(entry)
        why = self.divergence.check(float(entry["loss"]), weight_norm(self.model))
        if why is not None:
            raise diverged(self.out_dir, f"{why}, at step {self.step} (learning rate {lr:g})",
                           "stopped", self.flag("learning_rate"), self.config.optim.learning_rate)  # fmt: skip
        if bar is not None:
            bar.set_postfix(loss=f"{entry['loss']:.4f}", tok_s=f"{entry['tokens_per_s']:.0f}")
        window.restart()

    def _evaluate_and_save(
        self, window: _Window, log: RunLog, bar, stop: StopSignals, last: bool
    ) -> None:
        """Every `eval_every` steps and at the end an evaluation entry (which may stop the run
        early); every `save_every` steps, at the end and on a signal a checkpoint."""
        config = self.config
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
            window.entries.append(entry)
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
                f"{self.out_dir}: continue with {self.flag('resume')}",
                stopping,
            )

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


@dataclass
class _Window:
    """What the steps since the last log entry add up (summed on the device until it is read),
    and the entries of this process."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    sums: torch.Tensor | None = None
    norms: torch.Tensor | None = None
    tokens: int = 0
    steps: int = 0
    tick: float = field(default_factory=time.perf_counter)
    compiling: float = 0.0  # seconds torch.compile took during this process's steps

    def add(self, micro: tuple[int, torch.Tensor]) -> None:
        real, stats = micro
        self.tokens += real
        self.sums = stats if self.sums is None else self.sums + stats

    def restart(self) -> None:
        self.sums = self.norms = None
        self.tokens, self.tick, self.steps = 0, time.perf_counter(), 0
