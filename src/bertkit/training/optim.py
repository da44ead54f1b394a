"""The paper's optimiser: Adam with decoupled weight decay 0.01 (not on biases and LayerNorm),
beta = (0.9, 0.999), epsilon 1e-6 as in Google's `AdamWeightDecayOptimizer`, linear warmup to the
peak learning rate, then linear decay to zero at the last step.

`OptimConfig` is the one place these settings live, with their one default each: pre-training
and fine-tuning hold one (their `--lr`, `--warmup-steps`, ... flags are its fields; fine-tuning's
learning rate is the task's unless given), the feature-based tagger makes one, and `Trainer`
builds the optimiser and the schedule from it unchanged."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from bertkit.settings import Settings, setting

NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias")
ADAM_EPSILON = 1e-6  # Google's AdamWeightDecayOptimizer's
PAPER_WARMUP_STEPS = 10_000  # the paper's warm-up of a step-count run when none is given
BUDGET_WARMUP_FRACTION = 0.1  # a time budget's warm-up when none is given


@dataclass
class OptimConfig(Settings):
    """The optimiser and its learning-rate schedule. The warm-up is `warmup_steps` steps or a
    `warmup_fraction` of the steps or of a time budget (not both); neither given: the paper's
    10,000 steps, or a tenth of a budget (`warmup_steps_for`)."""

    # None: fine-tuning's, where the task chooses (FinetuneConfig.resolved)
    learning_rate: float | None = setting(
        1e-4, "peak learning rate", check="positive", flags=("--lr",)
    )
    warmup_steps: int | None = setting(
        None, "linear warm-up steps (default 10,000, the paper's)", check="non-negative"
    )
    warmup_fraction: float | None = setting(
        None, "warm-up as a fraction of the steps or of the budget", check="fraction"
    )
    adam_beta2: float = setting(0.999, "Adam's second-moment decay", check="fraction")
    weight_decay: float = setting(
        0.01, "decoupled weight decay (not on biases, LayerNorm)", check="non-negative"
    )
    max_grad_norm: float = setting(1.0, "gradients clipped to this global norm", check="positive")
    optimizer: str = setting(
        "adamw",
        "adamw (torch's, bias-corrected), bertadam (Google's original update without bias "
        "correction, eps 1e-6) or lamb (Adam's step scaled per tensor by its weight norm over "
        "its step norm, You et al. 2020: for large batches, as NVIDIA pre-trains)",
        choices=("adamw", "bertadam", "lamb"),
    )
    schedule: str = setting(
        "linear",
        "linear: warm-up, then linear decay to 0; constant: the peak rate throughout",
        choices=("linear", "constant"),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.warmup_steps is not None and self.warmup_fraction is not None:
            raise ValueError("give --warmup-steps or --warmup-fraction, not both")

    def budget_warmup(self) -> float:
        """The warm-up fraction of a time budget."""
        return BUDGET_WARMUP_FRACTION if self.warmup_fraction is None else self.warmup_fraction

    def warmup_steps_for(self, max_steps: int | None, budget_seconds: float | None) -> int:
        """The warm-up in steps of a step-count run (0 for a budget, whose warm-up is
        `budget_warmup()` of its time). A warm-up as long as the run is refused: the rate would
        never reach its peak."""
        if max_steps is None and budget_seconds is None:
            raise ValueError("give --max-steps N or --budget TIME")
        if budget_seconds is not None:
            if self.warmup_steps is not None:
                raise ValueError(
                    "with --budget the warm-up is a fraction of the budget: give "
                    "--warmup-fraction (e.g. 0.1), not --warmup-steps"
                )
            return 0
        assert max_steps is not None  # a run without a budget has a step count
        if self.warmup_fraction is not None:
            if self.warmup_fraction == 0:
                return 0
            return max(1, round(self.warmup_fraction * max_steps))
        steps = PAPER_WARMUP_STEPS if self.warmup_steps is None else self.warmup_steps
        if steps and steps >= max_steps:
            raise ValueError(
                f"--warmup-steps {steps} is not shorter than the run (--max-steps "
                f"{max_steps}): the learning rate would never reach its peak and a short run "
                f"learns next to nothing. Give --warmup-steps below {max_steps} (e.g. "
                f"{max(1, max_steps // 10)}, a tenth), --warmup-fraction 0.1, or --recipe laptop"
            )
        return steps


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weights that decay, and biases and LayerNorm parameters that do not (a
    LayerNorm known by its type, as transformers' Trainer knows it, whatever a family names it:
    DistilBERT's `sa_layer_norm`)."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    seen: set[int] = set()
    norms = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad or id(parameter) in seen:
            continue
        seen.add(id(parameter))
        fixed = name.endswith(NO_DECAY) or id(parameter) in norms
        (no_decay if fixed else decay).append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, config: OptimConfig) -> torch.optim.Optimizer:
    """torch's AdamW over `parameter_groups` (betas 0.9 and `adam_beta2`, epsilon 1e-6), or
    with optimizer="bertadam" Google's original update (`BertAdam`: no bias correction).

    AdamW runs fused (one kernel over all parameters) where torch has that kernel (CPU, CUDA):
    on CPU torch would otherwise pick its one-tensor-at-a-time loop. all-MiniLM-L6-v2's update
    took 11.7 ms instead of 90.5 (7.7x), a fine-tuning step 3.8% less, with the same weights to
    6e-8 after 20 steps (measured 2026-11-23: docs/results/README.md, "The optimiser step")."""
    if config.learning_rate is None:
        raise ValueError("OptimConfig: no learning rate (give --lr)")
    groups = parameter_groups(model, config.weight_decay)
    lr, betas, eps = config.learning_rate, (0.9, config.adam_beta2), ADAM_EPSILON
    if config.optimizer == "bertadam":
        return BertAdam(groups, lr=lr, betas=betas, eps=eps)
    if config.optimizer == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps)
    params = [p for group in groups for p in group["params"]]
    fused = bool(params) and all(
        p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float64)
        for p in params
    )
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)


class _Adam(torch.optim.Optimizer):
    """What BertAdam and Lamb share: Adam's hyperparameters, checked, and a step that runs the
    optimiser's `update` over each parameter group."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = ADAM_EPSILON,
                 weight_decay: float = 0.0) -> None:  # fmt: skip
        if not lr >= 0 or not 0 <= betas[0] < 1 or not 0 <= betas[1] < 1 or not eps >= 0:
            raise ValueError(f"{type(self).__name__}: bad lr {lr}, betas {betas} or eps {eps}")
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
            self.update(group)
        return loss

    def update(self, group: dict) -> None:
        raise NotImplementedError


class BertAdam(_Adam):
    """Google BERT's `AdamWeightDecayOptimizer` (optimization.py), the optimiser of the paper:
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  w -= lr (m / (sqrt(v) + eps) + wd w),
    with NO bias correction of m and v (torch's AdamW has it), decoupled weight decay, and
    eps = 1e-6. Without the correction the first steps move each weight by about
    lr * (1 - b1) / sqrt(1 - b2) ~ 3 lr instead of lr: what makes fine-tuning small tasks erratic
    (Mosbach et al., ICLR 2021). Gradient clipping stays the training loop's."""

    @torch.no_grad()
    def update(self, group: dict) -> None:
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


class Lamb(_Adam):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76
    Minutes", ICLR 2020), the optimiser of NVIDIA's BERT pre-training at batch 64k:
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  u = m^ / (sqrt(v^) + eps) + wd w  (m^, v^
    bias-corrected);  w -= lr r u  with the trust ratio r = ||w|| / ||u|| per tensor (1 when
    either norm is 0). Tensors without weight decay (biases, LayerNorm) also skip the trust
    ratio (r = 1), as the reference implementation's `exclude_from_layer_adaptation` defaults to
    its weight-decay exclusions. Each group's tensors are updated together (torch's `_foreach`
    kernels) and the ratios stay on the device: no host round trip. Gradient clipping stays
    the training loop's (NVIDIA's LAMB clips the global norm to 1 first, as the loop does)."""

    @torch.no_grad()
    def update(self, group: dict) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        (beta1, beta2), lr, eps = group["betas"], group["lr"], group["eps"]
        decay = group["weight_decay"]
        grads = [p.grad for p in params]
        for p in params:
            if not self.state[p]:
                self.state[p].update(step=0, exp_avg=torch.zeros_like(p),
                                     exp_avg_sq=torch.zeros_like(p))  # fmt: skip
            self.state[p]["step"] += 1
        m = [self.state[p]["exp_avg"] for p in params]
        v = [self.state[p]["exp_avg_sq"] for p in params]
        torch._foreach_lerp_(m, grads, 1 - beta1)
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)
        step = self.state[params[0]]["step"]  # every tensor of a group steps together
        updates = torch._foreach_div(m, 1 - beta1**step)
        denominators = torch._foreach_sqrt(torch._foreach_div(v, 1 - beta2**step))
        torch._foreach_add_(denominators, eps)
        torch._foreach_div_(updates, denominators)
        if decay:
            torch._foreach_add_(updates, params, alpha=decay)
            w = torch.stack(torch._foreach_norm(params))  # one norm a tensor, in one vector
            u = torch.stack(torch._foreach_norm(updates))
            ratios = torch.where((w > 0) & (u > 0), w / u, torch.ones_like(w))
            torch._foreach_mul_(updates, list(ratios.unbind()))
        torch._foreach_add_(params, updates, alpha=-lr)


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
    optimizer: torch.optim.Optimizer,
    config: OptimConfig,
    max_steps: int | None,
    budget_seconds: float | None = None,
) -> torch.optim.lr_scheduler.LambdaLR | BudgetSchedule:
    """The schedule of a run of `max_steps` steps, or of `budget_seconds` of training time
    (then the warm-up and decay are laid over the budget: `BudgetSchedule`, whichever ends
    first when both are given): the paper's warm-up and linear decay (`linear`), or the peak
    rate throughout (`constant`: the feature-based tagger's plain Adam)."""
    warmup_steps = config.warmup_steps_for(max_steps, budget_seconds)
    if budget_seconds is not None:
        return BudgetSchedule(optimizer, budget_seconds, config.budget_warmup())
    assert max_steps is not None  # warmup_steps_for refuses neither
    if config.schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    total_steps = max_steps
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
