"""The paper's optimiser: Adam with decoupled weight decay 0.01 (not on biases and LayerNorm),
beta = (0.9, 0.999), epsilon 1e-6 as in Google's `AdamWeightDecayOptimizer`, linear warmup to the
peak learning rate, then linear decay to zero at the last step."""

from __future__ import annotations

import torch
from torch import nn

NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weights that decay, and biases/LayerNorm parameters that do not."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad or id(parameter) in seen:
            continue
        seen.add(id(parameter))
        (no_decay if name.endswith(NO_DECAY) else decay).append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module,
    lr: float = 1e-4,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
) -> torch.optim.AdamW:
    return torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr, betas=betas, eps=eps)


def warmup_linear_decay(step: int, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the peak learning rate for 0-based `step`: up linearly over the warmup
    (reaching the peak on its last step), then down linearly; no step is taken at zero.

    >>> [round(warmup_linear_decay(s, 2, 6), 2) for s in range(6)]
    [0.5, 1.0, 0.8, 0.6, 0.4, 0.2]
    >>> [round(warmup_linear_decay(s, 0, 4), 2) for s in range(4)]
    [1.0, 0.75, 0.5, 0.25]
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (total_steps - step) / (total_steps - warmup_steps + (warmup_steps > 0)))


def build_schedule(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_linear_decay(step, warmup_steps, total_steps)
    )
