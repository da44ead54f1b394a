"""Named pre-training recipes: plain data that `bertkit pretrain --recipe NAME` lays under the
command line (an explicit flag always wins).

- `paper`: the paper's optimisation settings (batch 256, peak lr 1e-4 after 10,000 warm-up steps,
  sequences of 128, 15% masked, at most 20 predictions). They are the defaults when
  no recipe is given; dropout stays the model config's (0.1). The paper trains BERT-Base; the command's default size stays `tiny`.
- `laptop`: the settings that got furthest below the unigram plateau per token on 2 CPU cores in
  the runs of `docs/results/recipe/` (BERT-tiny, batch 32, peak lr 2e-3 over a 10% warm-up,
  Adam beta2 0.98, no dropout, the MLM output bias started at the log unigram frequencies), for a
  time budget (`--budget`) of minutes to hours. Same architecture and objectives as the paper
  (post-LN BERT, MLM 80/10/10 + NSP); it changes only settings the paper leaves to the user or
  fixes for 1M TPU steps. It does not yet reach the issue's target (20% held-out MLM accuracy
  in 10 minutes): see the write-up.
"""

from __future__ import annotations

from typing import Any

RECIPES: dict[str, dict[str, Any]] = {
    "paper": {
        "config": "tiny",
        "batch_size": 256,
        "lr": 1e-4,
        "warmup_steps": 10_000,
        "seq_len": 128,
        "mask_prob": 0.15,
        "max_predictions": 20,
        "position_init": "normal",
        "attention_init": "normal",
        "embedding_updates": "dense",
        "adam_beta2": 0.999,
        "mlm_bias_init": "zeros",
    },
    "laptop": {
        "config": "tiny",
        "batch_size": 32,
        "lr": 2e-3,
        "warmup_fraction": 0.1,
        "adam_beta2": 0.98,
        "dropout": 0.0,
        "mlm_bias_init": "unigram",
        "seq_len": 128,
        "mask_prob": 0.15,
        "max_predictions": 20,
        "position_init": "normal",
        "attention_init": "normal",
        "embedding_updates": "dense",
    },
}


def recipe(name: str) -> dict[str, Any]:
    try:
        return dict(RECIPES[name])
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; expected one of {sorted(RECIPES)}") from None
