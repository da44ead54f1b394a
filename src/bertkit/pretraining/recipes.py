"""Named pre-training recipes: plain data that `bertkit pretrain --recipe NAME` lays under the
command line (an explicit flag always wins).

- `paper`: the paper's optimisation settings (batch 256, peak lr 1e-4 after 10,000 warm-up steps,
  sequences of 128, 15% masked, at most 20 predictions). They are the defaults when
  no recipe is given; dropout stays the model config's (0.1). The paper trains BERT-Base; the command's default size stays `tiny`.
- `laptop`: the settings measured best per CPU-minute on 2 cores in `docs/results/recipe/`
  (BERT-tiny, batch 32, peak lr 2e-3 over a 10% warm-up, Adam beta2 0.98, no dropout, the MLM
  output bias started at the log unigram frequencies, layer 1's attention started on each
  piece's left and right neighbours), for a time budget (`--budget`) of minutes to hours. The
  paper's architecture (post-LN BERT with learned absolute positions; its checkpoints load
  anywhere) and objectives (MLM 15%, 80/10/10, + NSP); it changes settings the paper leaves to
  the user or fixes for 1M TPU steps, and two starting points: the output bias and the attention
  init (`--attention-init local`), without which a BERT sits at the unigram plateau for
  thousands of steps. It keeps NSP although `--objective mlm` reads held-out text 2.3 points
  better at equal CPU time: at one CPU-hour the model without NSP does not transfer to sentence
  pairs (STS-B 9.9 against 42.6 with NSP, random init 11-12; docs/results/recipe). `--recipe
  laptop --budget 10m` on Wikipedia reaches 22.7% held-out MLM accuracy (every chosen piece
  [MASK]). Its peak lr is for widths up to 256 (tiny, mini); a wider model gets 2e-3 × 256 /
  hidden size (`laptop_learning_rate`).
- `continue`: continued pre-training of a released BERT on a corpus of your domain (as BioBERT
  and SciBERT were made; the default with `--init-from`): the checkpoint's own size and
  vocabulary, masked LM alone (released checkpoints rarely keep an NSP head, and domain
  adaptation since RoBERTa and Gururangan et al. 2020 drops it), peak lr 5e-5 (transformers'
  `run_mlm` default) after a 6% warm-up (Gururangan et al.'s), batch 32 of 128 tokens.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bertkit.core.config import PRESETS, BertConfig
from bertkit.pretraining.train import PretrainConfig
from bertkit.settings import from_values

# The paper's masking, starting points and Adam beta2, which continued pre-training keeps too.
_PAPERS_MASKING_AND_INIT = {
    "seq_len": 128,
    "mask_prob": 0.15,
    "max_predictions": 20,
    "position_init": "normal",
    "attention_init": "normal",
    "adam_beta2": 0.999,
    "mlm_bias_init": "zeros",
}

RECIPES: dict[str, dict[str, Any]] = {
    "paper": {
        "config": "tiny",
        "batch_size": 256,
        "learning_rate": 1e-4,
        "warmup_steps": 10_000,
        **_PAPERS_MASKING_AND_INIT,
        "objective": "mlm+nsp",
    },
    "laptop": {
        "config": "tiny",
        "batch_size": 32,
        "learning_rate": 2e-3,
        "warmup_fraction": 0.1,
        "adam_beta2": 0.98,
        "dropout": 0.0,
        "mlm_bias_init": "unigram",
        "seq_len": 128,
        "mask_prob": 0.15,
        "max_predictions": 20,
        "position_init": "normal",
        "attention_init": "local",
        "objective": "mlm+nsp",
    },
    "continue": {  # no "config": the --init-from checkpoint's own
        "batch_size": 32,
        "learning_rate": 5e-5,
        "warmup_fraction": 0.06,
        **_PAPERS_MASKING_AND_INIT,
        "objective": "mlm",
    },
}


LAPTOP_LR_WIDTH = 256  # the widest model the laptop recipe's 2e-3 is measured stable on


def laptop_learning_rate(hidden_size: int) -> float:
    """The laptop recipe's peak lr for a model of `hidden_size`: 2e-3 up to 256 (BERT-tiny and
    BERT-mini learn at it), 2e-3 × 256 / hidden_size above. Measured on BERT-small (H512, batch
    32, Wikipedia; docs/results/findings §4): at 2e-3 it learned until the warm-up ended, then
    its gradient norm grew from 3 to 15 and its MLM accuracy fell back towards the unigram plateau
    (train 16.5% → 11.4%); at 1e-3 it learns. The 1/width rule beyond H512 (base, large) is an
    extrapolation, not a measurement."""
    return 2e-3 * min(1.0, LAPTOP_LR_WIDTH / hidden_size)


def _hidden_size(config: str | os.PathLike | BertConfig) -> int | None:
    """The hidden size a `--config` names (None: a file that is not there; the run says so)."""
    if isinstance(config, BertConfig):
        return config.hidden_size
    if str(config) in PRESETS:
        return PRESETS[str(config)][1]
    if Path(config).is_file():
        return BertConfig.from_json_file(config).hidden_size
    return None


def recipe(name: str, config: str | os.PathLike | BertConfig | None = None) -> dict[str, Any]:
    """The recipe's values by `PretrainConfig` field (masking's fields among them), for the
    model size `config` when one is given (the laptop recipe's lr depends on its width)."""
    try:
        values = dict(RECIPES[name])
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; expected one of {sorted(RECIPES)}") from None
    hidden = _hidden_size(config) if name == "laptop" and config is not None else None
    if hidden is not None:
        values["learning_rate"] = laptop_learning_rate(hidden)
    return values


def apply_recipe(name: str | None, given: dict[str, Any]) -> PretrainConfig:
    """The run's settings: the recipe `name` (the paper's when None, `continue` with an
    `init_from`) under the values `given` by field name (the flags a user typed; None means not
    given). An explicit warm-up, steps or fraction, replaces the recipe's; a time budget's
    warm-up is a fraction of it, so a recipe's warm-up in steps gives way to one
    (`OptimConfig.budget_warmup`) unless a fraction is given. A run from a checkpoint keeps the
    checkpoint's size unless a config is given.

    >>> apply_recipe("laptop", {"max_steps": 100}).optim.learning_rate
    0.002
    >>> apply_recipe(None, {"budget_seconds": 60}).optim.warmup_steps is None
    True
    >>> apply_recipe(None, {"init_from": "runs/bert", "max_steps": 100}).optim.learning_rate
    5e-05
    """
    given = {key: value for key, value in given.items() if value is not None}
    continued = given.get("init_from") is not None
    values = recipe(name or ("continue" if continued else "paper"), given.get("config"))
    if continued:
        values.pop("config", None)
    if "warmup_steps" in given or "warmup_fraction" in given or "budget_seconds" in given:
        values.pop("warmup_steps", None)
    if "warmup_steps" in given:
        values.pop("warmup_fraction", None)
    return from_values(PretrainConfig, values | given)
