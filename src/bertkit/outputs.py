"""What the task heads return (`bertkit.heads`): logits, the loss when labels are given, and
the encoder's hidden states and attentions when asked for."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BertForPreTrainingOutput:
    mlm_logits: torch.Tensor | None  # (B, P, V) at masked_positions, else (B, S, V); None: fused
    nsp_logits: torch.Tensor  # (B, 2): index 0 = IsNext, 1 = NotNext (Google's convention)
    loss: torch.Tensor | None = None  # mlm_loss + nsp_loss, given labels
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    mlm_loss_sum: torch.Tensor | None = None  # with fused_mlm: summed over the labelled tokens
    mlm_correct: torch.Tensor | None = None  # with fused_mlm: how many of them argmax predicts


@dataclass
class BertHeadOutput:
    logits: torch.Tensor | None  # None only for BertForMaskedLM(fused_mlm=True)
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    mlm_loss_sum: torch.Tensor | None = None  # BertForMaskedLM(fused_mlm=True)
    mlm_correct: torch.Tensor | None = None


@dataclass
class BertQuestionAnsweringOutput:
    start_logits: torch.Tensor  # (B, S)
    end_logits: torch.Tensor  # (B, S)
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
