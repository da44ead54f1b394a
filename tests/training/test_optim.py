"""Optimisers and schedules (bertkit.training.optim)."""

import numpy as np
import pytest
import torch

from bertkit import BertConfig, BertForPreTraining
from bertkit.training.optim import parameter_groups, warmup_linear_decay


def test_schedule_and_parameter_groups():
    assert [round(warmup_linear_decay(s, 3, 8), 3) for s in range(8)] == [
        0.333,
        0.667,
        1.0,
        0.833,
        0.667,
        0.5,
        0.333,
        0.167,
    ]
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=50))
    decay, no_decay = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith(("bias", "LayerNorm.weight")) for p in no_decay["params"])
    assert all(not names[id(p)].endswith(("bias", "LayerNorm.weight")) for p in decay["params"])
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    total = sum(p.numel() for p in decay["params"] + no_decay["params"])
    assert total == model.num_parameters  # the tied decoder counted once


def test_budget_schedule_follows_the_clock_and_keeps_it_in_its_state():
    from bertkit.training.optim import BudgetSchedule

    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=2.0)
    schedule = BudgetSchedule(optimizer, budget=100.0, warmup=0.2)
    expected = {0: 2e-3, 10: 1.0, 20: 2.0, 60: 1.0, 95: 0.125}
    for spent, lr in expected.items():
        schedule.set_spent(spent)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(lr)
        assert schedule.get_last_lr() == [pytest.approx(lr)]
    assert not schedule.done
    schedule.set_spent(100.0)
    assert schedule.done
    again = BudgetSchedule(torch.optim.SGD([parameter], lr=2.0), budget=100.0, warmup=0.2)
    again.load_state_dict(schedule.state_dict())
    assert again.spent == 100.0 and again.done
    with pytest.raises(ValueError, match="warm-up fraction"):
        BudgetSchedule(optimizer, budget=10.0, warmup=1.0)


def test_bertadam_is_googles_update_without_bias_correction():
    """Against a reference written from Google's optimization.py (AdamWeightDecayOptimizer):
    m, v without bias correction; update = m / (sqrt(v) + eps) + wd * w; w -= lr * update; no
    weight decay on LayerNorm and biases (the groups of `parameter_groups`)."""
    from bertkit.training.optim import OptimConfig, build_optimizer

    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {"dense": torch.nn.Linear(5, 4), "LayerNorm": torch.nn.LayerNorm(4)}
    )
    start = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    optimizer = build_optimizer(
        model, OptimConfig(learning_rate=0.01, weight_decay=0.1, optimizer="bertadam")
    )
    grads = [{n: torch.randn_like(p) for n, p in model.named_parameters()} for _ in range(4)]
    for step in grads:
        for n, p in model.named_parameters():
            p.grad = step[n].clone()
        optimizer.step()
    beta1, beta2, eps, lr = 0.9, 0.999, 1e-6, 0.01
    for name, weights in start.items():
        m = np.zeros_like(weights)
        v = np.zeros_like(weights)
        decay = 0.0 if name.endswith("bias") or name.startswith("LayerNorm") else 0.1
        for step in grads:
            g = step[name].double().numpy()
            m = beta1 * m + (1.0 - beta1) * g
            v = beta2 * v + (1.0 - beta2) * g * g
            weights = weights - lr * (m / (np.sqrt(v) + eps) + decay * weights)
        got = dict(model.named_parameters())[name].detach().double().numpy()
        np.testing.assert_allclose(got, weights, rtol=1e-5, atol=1e-6)
    # the first step moves a weight ~3x lr (1 - b1) / sqrt(1 - b2), AdamW's about lr
    first = torch.nn.Parameter(torch.zeros(1))
    first.grad = torch.ones(1)
    build_optimizer(
        torch.nn.ParameterList([first]),
        OptimConfig(learning_rate=1.0, weight_decay=0.0, optimizer="bertadam"),
    ).step()
    assert float(first.detach()) == pytest.approx(-0.1 / (0.001**0.5 + 1e-6), rel=1e-5)
    with pytest.raises(ValueError, match="--optimizer .sgd. is not one of adamw, bertadam, lamb"):
        OptimConfig(optimizer="sgd")


def test_lamb_is_the_papers_update_and_resumes():
    """LAMB, step by step in numpy: bias-corrected Adam's step plus decay, scaled per tensor by
    ||w|| / ||u||; LayerNorm and biases (no decay) take Adam's step unscaled. Its state saved
    and loaded mid-run gives the same weights as the run not stopped."""
    from bertkit.training.optim import OptimConfig, build_optimizer

    def model_and_optimizer():
        torch.manual_seed(0)
        model = torch.nn.ModuleDict(
            {"dense": torch.nn.Linear(5, 4), "LayerNorm": torch.nn.LayerNorm(4)}
        )
        config = OptimConfig(learning_rate=0.01, weight_decay=0.1, optimizer="lamb")
        return model, build_optimizer(model, config)

    model, optimizer = model_and_optimizer()
    start = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    grads = [{n: torch.randn_like(p) for n, p in model.named_parameters()} for _ in range(5)]

    def steps(model, optimizer, which):
        for step in which:
            for n, p in model.named_parameters():
                p.grad = step[n].clone()
            optimizer.step()

    steps(model, optimizer, grads)
    beta1, beta2, eps, lr = 0.9, 0.999, 1e-6, 0.01
    for name, weights in start.items():
        m, v = np.zeros_like(weights), np.zeros_like(weights)
        decay = 0.0 if name.endswith("bias") or name.startswith("LayerNorm") else 0.1
        for t, step in enumerate(grads, start=1):
            g = step[name].double().numpy()
            m = beta1 * m + (1.0 - beta1) * g
            v = beta2 * v + (1.0 - beta2) * g * g
            update = (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + eps) + decay * weights
            w_norm, u_norm = np.linalg.norm(weights), np.linalg.norm(update)
            ratio = w_norm / u_norm if decay and w_norm > 0 and u_norm > 0 else 1.0
            weights = weights - lr * ratio * update
        got = dict(model.named_parameters())[name].detach().double().numpy()
        np.testing.assert_allclose(got, weights, rtol=1e-5, atol=1e-6)
    # stopped after 2 steps, its state saved and loaded into a fresh optimiser: the same run
    again, first = model_and_optimizer()
    steps(again, first, grads[:2])
    config = OptimConfig(learning_rate=0.01, weight_decay=0.1, optimizer="lamb")
    resumed = build_optimizer(again, config)
    resumed.load_state_dict(first.state_dict())
    steps(again, resumed, grads[2:])
    for (name, a), b in zip(again.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
