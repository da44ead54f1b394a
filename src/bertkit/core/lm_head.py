"""The output layers of pre-training, named as the checkpoints name them: the masked-LM
prediction head (a transform, then the vocabulary logits through the tied word embeddings and
an output bias) and NSP's two-way classifier; `gather_positions` picks the masked positions'
states for them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.core.config import BertConfig
from bertkit.core.model import activation
from bertkit.precision import activated


class BertPredictionHeadTransform(nn.Module):
    """dense, activation, LayerNorm: the masked LM's transform, and ModernBERT's head before its
    classifiers too (with its `classifier_bias` and `classifier_activation`, LayerNorms without
    bias; its `head.norm` is this LayerNorm: `core.family`). `width`: its output's, the
    hidden size unless given (ELECTRA's masked LM narrows to its embedding size)."""

    def __init__(self, config: BertConfig, width: int | None = None) -> None:
        super().__init__()
        width = width or config.hidden_size
        bias = bool(config.extra.get("classifier_bias", True))  # (only ModernBERT's says)
        self.dense = nn.Linear(config.hidden_size, width, bias=bias)
        self.act_name = str(config.extra.get("classifier_activation", config.hidden_act))
        self.act = activation(self.act_name)
        self.LayerNorm = nn.LayerNorm(width, eps=config.layer_norm_eps, bias=config.norm_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(activated(self.dense, x, self.act_name, self.act))


class BertLMPredictionHead(nn.Module):
    """transform -> vocabulary logits with the word-embedding matrix (tied) + an output bias;
    as wide as the word embeddings (ELECTRA's `embedding_size`)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        width = config.embedding_size or config.hidden_size
        self.transform = BertPredictionHeadTransform(config, width)
        self.decoder = nn.Linear(width, config.vocab_size, bias=False)  # tied
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        return F.linear(self.transform(x), self.decoder.weight, self.bias)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)


def gather_positions(sequence: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Hidden states at the given positions: (B, S, H), (B, P) -> (B, P, H).

    >>> gather_positions(torch.arange(6.).view(1, 3, 2), torch.tensor([[2, 0]])).tolist()
    [[[4.0, 5.0], [0.0, 1.0]]]
    """
    if positions.dim() != 2 or positions.shape[0] != sequence.shape[0]:
        raise ValueError(
            f"masked_positions must be (batch={sequence.shape[0]}, P), got {tuple(positions.shape)}"
        )
    index = positions.long().unsqueeze(-1).expand(-1, -1, sequence.shape[-1])
    return torch.gather(sequence, 1, index)
