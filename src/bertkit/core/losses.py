"""The losses, defined once: token (masked LM, tagging), sequence (classification, regression,
multi-label, NSP, multiple choice), span (QA), and the fused vocabulary cross-entropy of the
pre-training step. No model code: data and task code import `IGNORE_INDEX` from here without
pulling in the heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # a label that takes no part in the loss
PAD_LOGIT = -1e4  # the logit of a padded position: no answer starts or ends there


# Each loss is defined once, here: the heads call these with reduction="mean" (their `loss`
# output, as in transformers), the training objectives and tasks with reduction="sum" (they
# divide by the step's total count of units, so accumulation and several processes average
# over the whole step).
def reduce_loss(total: torch.Tensor, count: torch.Tensor | int, reduction: str) -> torch.Tensor:
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / torch.as_tensor(count, device=total.device).clamp(min=1)
    raise ValueError(f"reduction must be 'mean' or 'sum', not {reduction!r}")


def token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    reduction: str = "mean",
    weight: torch.Tensor | None = None,
):
    """Cross-entropy of every labelled token (masked LM, tagging): labels IGNORE_INDEX (-100)
    take no part; the mean is over labelled tokens (0, not NaN, when there are none).
    `weight` (C,): each class's weight (skewed tag sets)."""
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels {tuple(labels.shape)} must match logits {tuple(logits.shape[:-1])}"
        )
    flat_labels = labels.reshape(-1)
    total = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        flat_labels,
        weight=weight,
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return reduce_loss(total, (flat_labels != IGNORE_INDEX).sum(), reduction)


def sequence_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    problem: str,
    *,
    reduction: str = "mean",
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """One value per sequence (B, C) against its label: `problem` is "regression" (MSE on
    C = 1), "single_label_classification" (cross-entropy: GLUE, NSP, multiple choice over
    the choices) or "multi_label_classification" (binary cross-entropy per label; its mean is
    over every (example, label), as in transformers). `weight` (C,): each class's weight in
    the cross-entropy, or each label's positive weight (`pos_weight`) in the binary one."""
    if problem == "regression":
        return F.mse_loss(logits.float().view(-1), labels.float().view(-1), reduction=reduction)
    if problem == "single_label_classification":
        return F.cross_entropy(logits.float(), labels.view(-1), weight=weight, reduction=reduction)
    if problem == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(
            logits.float(), labels.float(), pos_weight=weight, reduction=reduction
        )
    raise ValueError(f"unknown problem type {problem!r}")


def span_loss(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    start_positions: torch.Tensor,
    end_positions: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    reduction: str = "mean",
) -> torch.Tensor:
    """The average of the start and end cross-entropies over the window's positions (span QA).
    Padded positions (`attention_mask` 0) take no part in the softmax, so the loss does not
    depend on how much padding a batch has (transformers' head counts them; its logits are the
    same). A position outside the window (the answer cut off) is ignored, as in transformers."""
    seq_len = start_logits.shape[1]
    start_logits, end_logits = start_logits.float(), end_logits.float()
    if attention_mask is not None:
        pad = attention_mask == 0
        start_logits = start_logits.masked_fill(pad, PAD_LOGIT)
        end_logits = end_logits.masked_fill(pad, PAD_LOGIT)
    start = start_positions.view(-1).clamp(0, seq_len)
    end = end_positions.view(-1).clamp(0, seq_len)
    ce = F.cross_entropy(
        start_logits, start, ignore_index=seq_len, reduction=reduction
    ) + F.cross_entropy(end_logits, end, ignore_index=seq_len, reduction=reduction)
    return ce / 2


# Rows of softmax gradient a bf16 weight-gradient product takes at once (1024 x 30522 bf16: 62 MB).
GRADIENT_GROUP_ROWS = 1024


class _FusedVocabCrossEntropy(torch.autograd.Function):
    """Sum of softmax cross-entropies of `states @ weight.T + bias` against `labels`, computed
    a chunk of rows at a time; the gradients are made in the same pass (softmax - one-hot, two
    matrix products) and returned by `backward`, so the (n, V) logits and their gradient never
    exist in full: one (chunk, V) buffer that stays in cache replaces log_softmax, its
    backward, the one-hot gradient and the accuracy's argmax over the whole matrix.

    `compute` bf16 is what CPU autocast would do, without its memory traffic: the products in
    bf16 (the logits rounded to bf16, as autocast's linear gives them), softmax and sums in fp32,
    the softmax gradient rounded to bf16 for the two products back (as autocast's backward)."""

    @staticmethod
    def forward(ctx, states, weight, bias, labels, chunk, grads, compute):
        need = ctx.needs_input_grad if grads else (False, False, False)
        low = compute != torch.float32
        total = torch.zeros((), dtype=torch.float64, device=states.device)
        correct = torch.zeros((), dtype=torch.long, device=states.device)
        grad_states = torch.empty(states.shape, device=states.device) if need[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need[1] else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if need[2] else None
        inputs, matrix, offset = states.to(compute), weight.to(compute), bias.to(compute)
        # In bf16 the weight's gradient is one product over a group of chunks, its softmax
        # gradients kept in a (group, V) buffer: a (V, H) bf16 product added into the fp32
        # gradient converts the whole matrix, nine times a BERT-small step when it was made per
        # chunk of 64 rows (30522 x 512, 640 masked rows); twice per group of 1,024 (the step
        # 1.03-1.14x faster on 2 threads of a Zen 4: docs/results/matrix_units). Rounded to
        # bf16 once a group instead of once a chunk, as autocast's backward rounds its product.
        group = max(chunk, GRADIENT_GROUP_ROWS // chunk * chunk)
        pending = (
            torch.empty((min(group, states.shape[0]), weight.shape[0]), dtype=compute,
                        device=states.device)
            if low and grad_weight is not None else None
        )  # fmt: skip
        for start in range(0, states.shape[0], chunk):
            rows = inputs[start : start + chunk]
            targets = labels[start : start + chunk]
            logits = torch.addmm(offset, rows, matrix.t())  # (c, V)
            if low:
                logits = logits.float()
            top, best = logits.max(-1)
            correct += (best == targets).sum()
            target_logits = logits.gather(1, targets[:, None]).squeeze(1)
            logits.sub_(top[:, None]).exp_()  # unnormalised probabilities
            norm = logits.sum(-1)
            total += (top + norm.log() - target_logits).sum().double()
            if grad_states is None and grad_weight is None and grad_bias is None:
                continue
            grad = logits.div_(norm[:, None])  # softmax
            grad[torch.arange(len(targets), device=grad.device), targets] -= 1.0
            if grad_bias is not None:
                grad_bias += grad.sum(0)
            if low:
                grad = grad.to(compute)
            if grad_states is not None:  # (chunk, H): a copy costs nothing here
                grad_states[start : start + chunk] = grad @ matrix
            if grad_weight is not None:
                if pending is not None:
                    at = start % group
                    pending[at : at + len(rows)] = grad
                    end = start + len(rows)
                    if end % group == 0 or end == states.shape[0]:
                        first = end - (at + len(rows))
                        grad_weight += pending[: at + len(rows)].t() @ inputs[first:end]
                else:
                    grad_weight.addmm_(grad.t(), rows)
        if grad_states is not None:
            grad_states = grad_states.to(states.dtype)
        ctx.save_for_backward(grad_states, grad_weight, grad_bias)
        ctx.mark_non_differentiable(correct)
        return total.to(states.dtype if not low else torch.float32), correct

    @staticmethod
    def backward(ctx, grad_total, _grad_correct):
        grad_states, grad_weight, grad_bias = ctx.saved_tensors
        scale = grad_total.to(torch.float32)
        return (
            (grad_states * scale).to(grad_states.dtype) if grad_states is not None else None,
            grad_weight * scale if grad_weight is not None else None,
            grad_bias * scale if grad_bias is not None else None,
            None,
            None,
            None,
            None,
        )


def fused_vocab_cross_entropy(
    states: torch.Tensor,  # (n, H) the MLM transform's output at the masked positions
    weight: torch.Tensor,  # (V, H) the decoder (tied word embeddings)
    bias: torch.Tensor,  # (V,)
    labels: torch.Tensor,  # (n,) token ids, IGNORE_INDEX where there is none (padding slots)
    chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of cross-entropies, number of argmax hits) over the labelled rows: the same numbers
    as `F.cross_entropy(states @ weight.T + bias, labels, reduction="sum")` and an argmax count,
    for about a third of the memory traffic (the pre-training step's vocabulary softmax).
    Under CPU bf16 autocast the products are bf16, as autocast's would be (LTR's every-piece
    softmax, (4096, 128) × (30522, 128): 0.41 s instead of 1.2 s on two threads of a Zen 5 with
    AVX-512 and AVX512-BF16, 2026-11-26); under CUDA autocast, or with half-precision weights, it
    is the plain path (logits, then fp32 cross-entropy), over every row with the unlabelled ones
    ignored: no selection of the labelled rows, whose count a GPU would have to send the host
    before the next kernel (a wait every step)."""
    kind = states.device.type
    autocast = torch.is_autocast_enabled(kind)
    compute = torch.get_autocast_dtype(kind) if autocast else states.dtype
    fused = weight.dtype == torch.float32 and (
        (not autocast and states.dtype == torch.float32)
        or (autocast and kind == "cpu" and compute == torch.bfloat16)
    )
    if not fused:  # on CUDA the chunk loop would be many small kernels (not measured there)
        logits = F.linear(states, weight, bias).float()
        total = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
        return total, ((logits.argmax(-1) == labels) & (labels != IGNORE_INDEX)).sum()
    valid = labels != IGNORE_INDEX
    states, labels = states[valid], labels[valid]
    if states.shape[0] == 0:
        zero = states.sum() * 0.0 + weight.sum() * 0.0 + bias.sum() * 0.0
        return zero, torch.zeros((), dtype=torch.long, device=states.device)
    grads = torch.is_grad_enabled() and (
        states.requires_grad or weight.requires_grad or bias.requires_grad
    )
    with torch.autocast(kind, enabled=False):
        return _FusedVocabCrossEntropy.apply(states, weight, bias, labels, chunk, grads, compute)
