"""The settings of a fine-tuning run (`FinetuneConfig`: the `bertkit finetune` flags), apart
from the run itself (`bertkit.finetuning.train`) so that what reads them (the runs of several seeds,
the model card) need not import the run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from bertkit.core.checkpoint import NEW_WEIGHTS
from bertkit.settings import (
    Settings,
    flat_names,
    nested,
    replaced,
    setting,
)
from bertkit.tasks import Task
from bertkit.training.config import ComputeConfig
from bertkit.training.optim import OptimConfig

FINETUNE_WARMUP_FRACTION = 0.1  # Google's run_classifier.py: warmup_proportion 0.1


class Sizes(NamedTuple):
    epochs: int
    learning_rate: float
    batch_size: int
    max_seq_length: int
    bucket_batches: int


@flat_names
@dataclass
class FinetuneConfig(Settings):
    """Hyperparameters of a fine-tuning run; None takes the task's default (the paper's value).
    The `bertkit finetune` flags are these fields, the optimiser's among them (`--lr`,
    `--warmup-fraction`, ...), and so are the names it takes: FinetuneConfig(learning_rate=2e-5)
    sets `optim.learning_rate`."""

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
    optim: OptimConfig = nested(
        OptimConfig,
        learning_rate=None,
        helps={
            "learning_rate": "peak learning rate (5e-5; SWAG: 2e-5)",
            "warmup_steps": "linear warm-up steps (instead of --warmup-fraction)",
            "warmup_fraction": f"linear warm-up, a fraction of the steps, rounded down (default "
            f"{FINETUNE_WARMUP_FRACTION}; formerly --warmup-proportion, --warmup)",
        },
        renamed={"warmup_proportion": "warmup_fraction", "--warmup": "warmup_fraction"},
    )
    batch_size: int | None = setting(
        None, "sequences per step (32; SQuAD 2.0: 48, SWAG: 16)", check="positive"
    )
    max_seq_length: int | None = setting(
        None, "pieces per sequence (128; SQuAD: 384)", check="positive"
    )
    seed: int = setting(42, "seed of the head's init, dropout and batch order")
    head_init: str = setting(
        "normal",
        "how the weights the checkpoint lacks (the task's head) are drawn: normal, N(0, the "
        "config's initializer_range), as transformers draws them; truncated-normal, cut at 2 "
        "std, as Google's run_classifier.py does (one epoch of STS-B scored 2.2 points lower with "
        "it over 16 runs, docs/results)",
        choices=NEW_WEIGHTS,
    )
    eval_batch_size: int = setting(64, "sequences per evaluation batch", check="positive")
    bucket_batches: int | None = setting(
        None,
        "batches' worth of training examples sorted by length together, so a batch pads little "
        "(50; token tagging, STS-B and your own scores: 1, random batches, as transformers' "
        "Trainer draws them)",
        check="positive",
    )
    compute: ComputeConfig = nested(ComputeConfig)
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
    validation_split: float | str | None = setting(
        None,
        "carve this fraction of the training examples out (the same ones for every seed and run) "
        "as the validation set that picks the epoch and any threshold; the task's dev set is then "
        "scored once, by the chosen model, and reported as 'test' (nothing is chosen on it). "
        "With --dataset, a name instead: the dataset's split to validate on (default: its "
        "'validation')",
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

    def sizes(self) -> Sizes:
        """The five settings a task fills in, of a `resolved` config."""
        values = (self.epochs, self.optim.learning_rate, self.batch_size, self.max_seq_length,
                  self.bucket_batches)  # fmt: skip
        if any(v is None for v in values):
            raise ValueError("FinetuneConfig.resolved(task) first: the task's defaults are unset")
        return Sizes(*values)  # type: ignore[arg-type]

    def optim_for(self, max_steps: int) -> OptimConfig:
        """The optimiser and schedule of a run of `max_steps` steps (of a `resolved` config):
        a warm-up fraction becomes int(fraction x steps) steps, as Google's run_classifier.py
        rounds it."""
        optim = self.optim
        if optim.warmup_fraction is not None:
            steps = int(optim.warmup_fraction * max_steps)
            optim = dataclasses.replace(optim, warmup_steps=steps, warmup_fraction=None)
        return optim

    def resolved(self, task: Task) -> FinetuneConfig:
        """The task's defaults where none was given; the warm-up a tenth of the steps unless
        one is given in steps or as a fraction."""
        optim = self.optim
        warmup = None if optim.warmup_steps is not None else FINETUNE_WARMUP_FRACTION
        return replaced(
            self,
            epochs=self.epochs or task.default_epochs,
            learning_rate=optim.learning_rate or task.default_learning_rate,
            warmup_fraction=optim.warmup_fraction if optim.warmup_fraction is not None else warmup,
            batch_size=self.batch_size or task.default_batch_size,
            max_seq_length=self.max_seq_length or task.default_max_seq_length,
            bucket_batches=self.bucket_batches or task.default_bucket_batches,
        )
