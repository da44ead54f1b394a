"""The paper's optimiser: Adam with decoupled weight decay 0.01 (not on biases and LayerNorm),
beta = (0.9, 0.999), epsilon 1e-6 as in Google's `AdamWeightDecayOptimizer`, linear warmup to the
peak learning rate, then linear decay to zero at the last step."""

from __future__ import annotations

import torch
from torch import nn

NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weights that decay, and biases/LayerNorm parameters that do not."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
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
    kind: str = "adamw",
) -> torch.optim.Optimizer:
    """torch's AdamW over `parameter_groups`, or with kind="bertadam" Google's original update
    (`BertAdam`: no bias correction).

    AdamW runs fused (one kernel over all parameters) where torch has that kernel (CPU, CUDA):
    on CPU torch would otherwise pick its one-tensor-at-a-time loop. all-MiniLM-L6-v2's update
    took 11.7 ms instead of 90.5 (7.7x), a fine-tuning step 3.8% less, with the same weights to
    6e-8 after 20 steps (measured 2026-11-23: docs/results/README.md, "The optimiser step")."""
    groups = parameter_groups(model, weight_decay)
    if kind == "bertadam":
        return BertAdam(groups, lr=lr, betas=betas, eps=eps)
    if kind != "adamw":
        raise ValueError(f"optimizer must be adamw or bertadam, not {kind!r}")
    params = [p for group in groups for p in group["params"]]
    fused = bool(params) and all(
        p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float64)
        for p in params
    )
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)


class BertAdam(torch.optim.Optimizer):
    """Google BERT's `AdamWeightDecayOptimizer` (optimization.py), the optimiser of the paper:
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  w -= lr (m / (sqrt(v) + eps) + wd w),
    with NO bias correction of m and v (torch's AdamW has it), decoupled weight decay, and
    eps = 1e-6. Without the correction the first steps move each weight by about
    lr * (1 - b1) / sqrt(1 - b2) ~ 3 lr instead of lr: what makes fine-tuning small tasks erratic
    (Mosbach et al., ICLR 2021). Gradient clipping stays the training loop's."""

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0) -> None:  # fmt: skip
        if not lr >= 0 or not 0 <= betas[0] < 1 or not 0 <= betas[1] < 1 or not eps >= 0:
            raise ValueError(f"BertAdam: bad lr {lr}, betas {betas} or eps {eps}")
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        )

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            (beta1, beta2), lr, eps = group["betas"], group["lr"], group["eps"]
            decay = group["weight_decay"]
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                grad = parameter.grad
                state = self.state[parameter]
                if not state:
                    state["exp_avg"] = torch.zeros_like(parameter)
                    state["exp_avg_sq"] = torch.zeros_like(parameter)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                update = m / (v.sqrt() + eps)
                if decay:
                    update.add_(parameter, alpha=decay)
                parameter.add_(update, alpha=-lr)
        return loss


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
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, kind: str = "linear"
) -> torch.optim.lr_scheduler.LambdaLR:
    """The paper's warm-up and linear decay (`linear`), or the peak rate throughout
    (`constant`: the feature-based tagger's plain Adam)."""
    if kind == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    if kind != "linear":
        raise ValueError(f"schedule must be linear or constant, not {kind!r}")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_linear_decay(step, warmup_steps, total_steps)
    )


def warmup_linear_decay_fraction(progress: float, warmup: float) -> float:
    """The same shape laid over a fraction `progress` in [0, 1] of the run (a time budget):
    up linearly over the first `warmup` of it, then down linearly to zero at 1.

    >>> [round(warmup_linear_decay_fraction(p, 0.2), 2) for p in (0.0, 0.1, 0.2, 0.6, 1.0)]
    [0.0, 0.5, 1.0, 0.5, 0.0]
    """
    progress = min(max(progress, 0.0), 1.0)
    if progress < warmup:
        return progress / warmup
    return (1.0 - progress) / (1.0 - warmup) if warmup < 1.0 else 0.0


class BudgetSchedule:
    """Warm-up and linear decay laid over a wall-clock budget instead of a step count (the
    24-hour-BERT and cramming approach): before each step the learning rate is set from the
    fraction of the budget spent so far. `spent` is training time only (the loop does not charge
    evaluations and checkpoints to it) and is part of the state, so a resumed run keeps the
    budget's clock. No step runs at a rate below 1e-3 of the peak (the first would be 0)."""

    def __init__(self, optimizer: torch.optim.Optimizer, budget: float, warmup: float) -> None:
        if budget <= 0:
            raise ValueError(f"the time budget must be positive, got {budget} s")
        if not 0.0 <= warmup < 1.0:
            raise ValueError(f"the warm-up fraction must be in [0, 1), got {warmup}")
        self.optimizer, self.budget, self.warmup = optimizer, float(budget), float(warmup)
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.spent = 0.0
        self._last = list(self.base_lrs)

    @property
    def progress(self) -> float:
        return self.spent / self.budget

    @property
    def done(self) -> bool:
        return self.spent >= self.budget

    def set_spent(self, seconds: float) -> None:
        """Set the learning rate for the step about to run, `seconds` into the budget."""
        self.spent = float(seconds)
        factor = max(warmup_linear_decay_fraction(self.progress, self.warmup), 1e-3)
        self._last = [base * factor for base in self.base_lrs]
        for group, lr in zip(self.optimizer.param_groups, self._last, strict=True):
            group["lr"] = lr

    def get_last_lr(self) -> list[float]:
        return list(self._last)

    def step(self) -> None:  # the loop calls set_spent; kept for the scheduler interface
        pass

    def state_dict(self) -> dict[str, float]:
        return {"spent": self.spent, "budget": self.budget, "warmup": self.warmup}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.spent = float(state["spent"])
