"""Task heads on top of `BertModel`: pre-training (MLM + NSP), masked LM, sequence
classification/regression, token tagging, span QA and multiple choice.

Attribute names follow the checkpoints (`bert`, `cls.predictions`, `classifier`, `qa_outputs`), so
Hugging Face and Google weights load by name. Labels use -100 for "no label" (ignored by the loss).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, TypedDict

import torch
from torch import nn

from bertkit.core.config import BertConfig
from bertkit.core.embedding import BertForSentenceEmbedding
from bertkit.core.family import family_of
from bertkit.core.lm_head import (
    BertOnlyMLMHead,
    BertPredictionHeadTransform,
    BertPreTrainingHeads,
    gather_positions,
)
from bertkit.core.losses import (
    IGNORE_INDEX,
    fused_vocab_cross_entropy,
    reduce_loss,
    sequence_loss,
    span_loss,
    token_loss,
)
from bertkit.core.model import BertModel, BertPreTrainedModel, activation
from bertkit.core.unpad import Layouts

if TYPE_CHECKING:
    from typing_extensions import Unpack

Tensor = torch.Tensor


# What the heads return: logits, the loss when labels are given, and the encoder's hidden states
# and attentions when asked for.
@dataclasses.dataclass
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


@dataclasses.dataclass
class BertHeadOutput:
    logits: torch.Tensor | None  # None only for BertForMaskedLM(fused_mlm=True)
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    mlm_loss_sum: torch.Tensor | None = None  # BertForMaskedLM(fused_mlm=True)
    mlm_correct: torch.Tensor | None = None


@dataclasses.dataclass
class BertQuestionAnsweringOutput:
    start_logits: torch.Tensor  # (B, S)
    end_logits: torch.Tensor  # (B, S)
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class EncodeOptions(TypedDict, total=False):
    """What every head's `forward` takes by keyword besides its inputs and labels (transformers'
    names): the encoder's hidden states and attentions returned, and `layouts` (what
    `host_layouts` gave for the same batch)."""

    output_hidden_states: bool
    output_attentions: bool
    layouts: Layouts | None


class _Head(BertPreTrainedModel):
    """A task head on `self.bert`. What the head reads of the encoder's output decides what the
    encoder computes: every position (`per_position`: tagging, QA), [CLS] alone
    (`reads_cls_only`: classifiers), or the `read_positions` a forward gives (masked LM)."""

    bert: BertModel
    per_position = True
    reads_cls_only = False

    def _encode(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        *,
        read_positions: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        layouts: Layouts | None = None,
    ):
        """Run the encoder, on real tokens only (`unpad=True`) whenever no padded position's
        value can be seen: the head reads [CLS] or chosen positions, or the model is training
        (losses ignore padding). Requested hidden states or attentions keep the padded path, so
        they match other implementations everywhere. `read_positions`: the only positions
        (besides [CLS]) the head reads, see `BertModel.forward`; `layouts`: what
        `host_layouts` gave for the same batch."""
        unpad, read_positions, cls_only = self._reads(
            read_positions, output_hidden_states or output_attentions
        )
        return self.bert(
            input_ids,
            token_type_ids,
            attention_mask,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            unpad=unpad,
            read_positions=read_positions,
            read_cls_only=cls_only,
            layouts=layouts,
        )

    def _reads(self, read_positions: torch.Tensor | None, reads_all: bool):
        """(unpad, read_positions, read_cls_only) of a forward."""
        per_position = self.per_position and read_positions is None
        fixed = self.padded_only or self.static_shapes
        unpad = not (reads_all or fixed) and (self.training or not per_position)
        if fixed:
            return unpad, None, False
        return unpad, read_positions, self.reads_cls_only

    def host_layouts(self, batch: dict[str, torch.Tensor], device: torch.device | str) -> Layouts:
        """The layouts `_encode` would compute on `device` for `batch` (its attention_mask, and
        the masked LM's masked_positions), computed where the batch is (the host) and moved to
        `device`: a forward given them (`layouts=`) never waits for the device to count the real
        tokens, so the host queues the step's kernels ahead of the card."""
        mask = batch["attention_mask"]
        mask = mask.reshape(-1, mask.shape[-1])  # multiple choice: (B x choices, S)
        unpad, positions, cls_only = self._reads(batch.get("masked_positions"), False)
        layouts = self.bert.layouts(
            mask, (mask.shape[0], mask.shape[1]), device, unpad=unpad,
            causal=self.bert.config.is_decoder, read_positions=positions, read_cls_only=cls_only,
        )  # fmt: skip
        return layouts.to(device)


class _PerTokenHead(_Head):
    """A head with an output at every token (tagging, span QA), optionally through Table 5's
    BiLSTM (`with_bilstm`) between the encoder and its classifier."""

    with_bilstm = False

    def _init_encoder(self, config: BertConfig) -> None:
        self.bert = BertModel(config, add_pooling_layer=False)
        self.bilstm = BiLSTM(config) if self.with_bilstm else None

    def _encode_tokens(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        **options: Unpack[EncodeOptions],
    ):
        """The encoder's output and every token's final vector (B, S, H), through the BiLSTM
        when the head has one."""
        out = self._encode(input_ids, token_type_ids, attention_mask, **options)
        hidden = out.last_hidden_state
        if self.bilstm is not None:
            hidden = self.bilstm(hidden, attention_mask)
        return out, hidden


class _MaskedLMMixin:
    """Vocabulary logits only where asked: the paper predicts just the masked tokens, and the
    H x V decoder is most of a pre-training step's cost when run at every position."""

    cls: BertPreTrainingHeads | BertOnlyMLMHead
    bert: BertModel

    def tie_weights(self) -> None:
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def _mlm_logits(
        self, sequence: torch.Tensor, masked_positions: torch.Tensor | None
    ) -> torch.Tensor:
        if masked_positions is not None:
            sequence = gather_positions(sequence, masked_positions)  # (B, P, H)
        return self.cls.predictions(sequence)

    def _mlm(self, hidden: torch.Tensor, masked_positions: torch.Tensor | None,
             labels: torch.Tensor | None, fused: bool):  # fmt: skip
        """(logits, mean loss, summed loss, correct argmax count) of the masked LM; with
        `fused` (training; needs `masked_positions` and `labels`) no logits and the sums set,
        else the logits and no sums."""
        if fused:
            if masked_positions is None or labels is None:
                raise ValueError("fused_mlm needs masked_positions and labels")
            total, correct = self._fused_mlm(hidden, masked_positions, labels)
            return None, reduce_loss(total, labels.ne(IGNORE_INDEX).sum(), "mean"), total, correct
        logits = self._mlm_logits(hidden, masked_positions)
        return logits, (token_loss(logits, labels) if labels is not None else None), None, None

    def _fused_mlm(
        self, sequence: torch.Tensor, masked_positions: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed cross-entropy, correct argmax count) over the labelled positions, without
        the (tokens, V) logits in memory: see `fused_vocab_cross_entropy`."""
        states = self.cls.predictions.transform(gather_positions(sequence, masked_positions))
        predictions = self.cls.predictions
        return fused_vocab_cross_entropy(
            states.flatten(0, 1), predictions.decoder.weight, predictions.bias, labels.flatten()
        )


# ------------------------------------------------------------------------------- models
class BertForPreTraining(_MaskedLMMixin, _Head):
    """BERT with the paper's two pre-training heads: masked LM and next-sentence prediction.

    `masked_positions` (B, P) selects where MLM logits are computed (Google's
    `masked_lm_positions`; pad with any position and label -100); `labels` then is (B, P).
    Without `masked_positions`, logits and labels cover all S positions.
    """

    cls: BertPreTrainingHeads

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        _needs_pooler(config, "next-sentence prediction")
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.init_weights()

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, masked_positions: Tensor | None = None,
                labels: Tensor | None = None, next_sentence_label: Tensor | None = None,
                *, fused_mlm: bool = False, **options: Unpack[EncodeOptions]
                ) -> BertForPreTrainingOutput:  # fmt: skip
        """`next_sentence_label` (B,): 0 IsNext, 1 NotNext. With `fused_mlm` (training; needs
        `masked_positions` and `labels`) the MLM loss is computed without materialising the
        logits: `mlm_logits` is None, `mlm_loss_sum` and `mlm_correct` are set (see
        `fused_vocab_cross_entropy`)."""
        out = self._encode(
            input_ids, token_type_ids, attention_mask, read_positions=masked_positions, **options
        )
        assert out.pooler_output is not None
        nsp_logits = self.cls.seq_relationship(out.pooler_output)  # (B, 2)
        mlm_logits, mlm_loss, mlm_sum, mlm_correct = self._mlm(
            out.last_hidden_state, masked_positions, labels, fused_mlm
        )
        nsp_loss = (
            sequence_loss(nsp_logits, next_sentence_label, "single_label_classification")
            if next_sentence_label is not None
            else None
        )
        parts = [x for x in (mlm_loss, nsp_loss) if x is not None]
        loss = torch.stack(parts).sum() if parts else None
        return BertForPreTrainingOutput(
            mlm_logits,
            nsp_logits,
            loss,
            mlm_loss,
            nsp_loss,
            out.hidden_states,
            out.attentions,
            mlm_sum,
            mlm_correct,
        )


class BertForMaskedLM(_MaskedLMMixin, _Head):
    """Masked LM head only (the "No NSP" ablation; fill-mask). Same `masked_positions` contract
    as `BertForPreTraining`."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.init_weights()

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, masked_positions: Tensor | None = None,
                labels: Tensor | None = None, *, fused_mlm: bool = False,
                **options: Unpack[EncodeOptions]) -> BertHeadOutput:  # fmt: skip
        """`fused_mlm`: as in `BertForPreTraining.forward`."""
        out = self._encode(
            input_ids, token_type_ids, attention_mask, read_positions=masked_positions, **options
        )
        logits, loss, total, correct = self._mlm(
            out.last_hidden_state, masked_positions, labels, fused_mlm
        )
        return BertHeadOutput(logits, loss, out.hidden_states, out.attentions, total, correct)


class _PooledClassifier(_Head):
    """A head that scores one vector per input, with the classifier its family's checkpoints
    have (`kind`): "pooler" (BERT's linear layer on the pooled [CLS]), "tanh" / "gelu"
    (RoBERTa's and ELECTRA's dense + activation + out_proj on the first token), "pre_classifier"
    (DistilBERT's pre_classifier + ReLU), "summary" (ELECTRA's multiple choice: its
    sequence_summary, a projection and GELU, then a linear layer) or "head" (ModernBERT's
    prediction head on [CLS] or the mean) — under the names its checkpoints give them, so
    that fine-tuned weights load and save in the family's layout."""

    per_position, reads_cls_only = False, True

    def _add_classifier(self, config: BertConfig, kind: str, outputs: int) -> None:
        self.kind = kind
        self.bert = BertModel(config, add_pooling_layer=kind == "pooler")
        hidden, dropout = config.hidden_size, _classifier_dropout(config)
        if kind == "pre_classifier":  # DistilBERT's, its own dropout
            self.pre_classifier = nn.Linear(hidden, hidden)
            dropout = float(config.extra.get("seq_classif_dropout", 0.2))
        if kind == "summary":  # (its dropout is the summary's own)
            self.sequence_summary = _SequenceSummary(config)
        self.dropout = nn.Dropout(dropout)
        if kind in ("tanh", "gelu"):
            self.classifier: nn.Module = _ClassificationHead(hidden, outputs, dropout, kind)
        else:
            self.classifier = nn.Linear(hidden, outputs)
        if kind == "head":  # ModernBERT's: its prediction head on [CLS] or the mean
            self.head = BertPredictionHeadTransform(config)  # (`head.norm` there: family)
            self.mean = config.extra.get("classifier_pooling", "cls") == "mean"
            self.reads_cls_only = not self.mean

    def _logits(self, out, attention_mask: torch.Tensor | None) -> torch.Tensor:  # (B, outputs)
        if self.kind == "pooler":
            return self.classifier(self.dropout(out.pooler_output))
        first = out.last_hidden_state[:, 0]  # <s> / [CLS]
        if self.kind == "pre_classifier":
            return self.classifier(self.dropout(torch.relu(self.pre_classifier(first))))
        if self.kind == "summary":
            return self.classifier(self.sequence_summary(first))
        if self.kind == "head":
            pooled = first
            if self.mean:
                hidden = out.last_hidden_state
                mask = (torch.ones(hidden.shape[:2], device=hidden.device)
                        if attention_mask is None else attention_mask).unsqueeze(-1).to(hidden.dtype)  # fmt: skip
                pooled = (hidden * mask).sum(1) / mask.sum(1)
            return self.classifier(self.dropout(self.head(pooled)))
        return self.classifier(self.dropout(first))


class BertForSequenceClassification(_PooledClassifier):
    """A linear layer on the pooled [CLS] vector. `config.num_labels == 1` is regression (MSE,
    e.g. STS-B); otherwise softmax cross-entropy, or sigmoid BCE for multi-label
    (`problem_type`, as in Hugging Face). The family's own classifier where its checkpoints
    have another (`Family.classifier`: RoBERTa's dense + tanh + out_proj on the first token,
    ELECTRA's with GELU, DistilBERT's pre_classifier + ReLU, ModernBERT's head)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self._add_classifier(config, family_of(config.model_type).classifier, self.num_labels)
        self.init_weights()

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, labels: Tensor | None = None,
                **options: Unpack[EncodeOptions]) -> BertHeadOutput:  # fmt: skip
        """`labels`: (B,) class ids, (B,) floats, or (B, C) multi-label."""
        out = self._encode(input_ids, token_type_ids, attention_mask, **options)
        logits = self._logits(out, attention_mask)
        loss = None
        if labels is not None:
            problem = self.config.problem_type or (
                "regression"
                if self.num_labels == 1
                else "single_label_classification"
                if not labels.is_floating_point()
                else "multi_label_classification"
            )
            loss = sequence_loss(logits, labels, problem)
        return BertHeadOutput(logits, loss, out.hidden_states, out.attentions)


class _ClassificationHead(nn.Module):
    """RoBERTa's (tanh) and ELECTRA's (GELU) classifier on the first token's state, after the
    head's dropout: dense, activation, dropout, out_proj."""

    def __init__(self, hidden: int, labels: int, dropout: float, activation: str) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(hidden, labels)
        self.activation = torch.tanh if activation == "tanh" else nn.functional.gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.dropout(self.activation(self.dense(x))))


class _SequenceSummary(nn.Module):
    """ELECTRA's multiple-choice summary of the first token's state (transformers'
    ElectraSequenceSummary as ELECTRA's configs set it): dropout where `summary_first_dropout`
    says, a projection (`summary_use_proj`), the activation (`summary_activation`, GELU) and
    dropout (`summary_last_dropout`, 0.1)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        extra = config.extra
        if extra.get("summary_type", "first") != "first" or extra.get("summary_proj_to_labels"):
            raise ValueError(
                f"ELECTRA's summary_type {extra.get('summary_type')!r} (proj_to_labels "
                f"{extra.get('summary_proj_to_labels')}): bertkit reads the first token's state "
                "through a projection as wide as the model (summary_type first)"
            )
        hidden = config.hidden_size
        self.summary = (
            nn.Linear(hidden, hidden) if extra.get("summary_use_proj", True) else nn.Identity()
        )
        name = extra.get("summary_activation", "gelu")
        self.activation = activation(str(name)) if name else nn.Identity()

        def dropout(key: str, default: float) -> nn.Module:
            p = float(extra.get(key, default) or 0.0)
            return nn.Dropout(p) if p > 0 else nn.Identity()

        self.first_dropout = dropout("summary_first_dropout", 0.0)
        self.last_dropout = dropout("summary_last_dropout", 0.1)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return self.last_dropout(self.activation(self.summary(self.first_dropout(first))))


class BertForTokenClassification(_PerTokenHead):
    """A linear layer on every token's final hidden state (NER tagging; label -100 = ignore,
    e.g. the non-first pieces of a word)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self._init_encoder(config)
        # ModernBERT's prediction head before the classifier
        self.head = (
            BertPredictionHeadTransform(config)
            if family_of(config.model_type).classifier == "head"
            else None
        )
        self.dropout = nn.Dropout(_classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)
        self.init_weights()

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, labels: Tensor | None = None,
                **options: Unpack[EncodeOptions]) -> BertHeadOutput:  # fmt: skip
        """`labels`: (B, S)."""
        out, hidden = self._encode_tokens(input_ids, token_type_ids, attention_mask, **options)
        if self.head is not None:
            hidden = self.head(hidden)
        logits = self.classifier(self.dropout(hidden))  # (B, S, C)
        loss = token_loss(logits, labels) if labels is not None else None
        return BertHeadOutput(logits, loss, out.hidden_states, out.attentions)


class BertForQuestionAnswering(_PerTokenHead):
    """Span extraction: a start vector S and an end vector E (the paper, Sec. 4.2) scored against
    every token; the loss is the mean of the start and end cross-entropies."""

    def __init__(self, config: BertConfig) -> None:
        # Always two outputs (start, end); a label map would make transformers size the layer
        # by len(id2label), so a QA config carries none.
        config = dataclasses.replace(config, id2label=None, label2id=None)
        super().__init__(config)
        self._init_encoder(config)
        self.head: BertPredictionHeadTransform | None = None
        if family_of(config.model_type).classifier == "head":
            # ModernBERT's reader: its prediction head, then a two-output `classifier`
            self.head = BertPredictionHeadTransform(config)
            self.classifier = nn.Linear(config.hidden_size, 2)
        else:
            self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, start_positions: Tensor | None = None,
                end_positions: Tensor | None = None, **options: Unpack[EncodeOptions]
                ) -> BertQuestionAnsweringOutput:  # fmt: skip
        """`start_positions`, `end_positions`: (B,)."""
        out, hidden = self._encode_tokens(input_ids, token_type_ids, attention_mask, **options)
        if self.head is not None:
            logits = self.classifier(self.head(hidden))  # (B, S, 2)
        else:
            logits = self.qa_outputs(hidden)
        start_logits, end_logits = logits[..., 0], logits[..., 1]  # (B, S) each
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(
                start_logits, end_logits, start_positions, end_positions, attention_mask
            )
        return BertQuestionAnsweringOutput(
            start_logits, end_logits, loss, out.hidden_states, out.attentions
        )


class BiLSTM(nn.Module):
    """A randomly initialised one-layer bidirectional LSTM over the encoder's output, H/2 units
    per direction so the width stays H: the `+ BiLSTM` of the paper's Table 5. Padding is
    packed away, so it never feeds the recurrence."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.lstm = nn.LSTM(
            config.hidden_size, config.hidden_size // 2, batch_first=True, bidirectional=True
        )

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        batch, seq_len, _ = hidden.shape  # (B, S, H) -> (B, S, H)
        if attention_mask is None:
            lengths = torch.full((batch,), seq_len, dtype=torch.long)
        else:
            lengths = attention_mask.sum(1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(
            hidden, lengths, batch_first=True, enforce_sorted=False
        )
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=seq_len)
        return out


class BertBiLSTMForTokenClassification(BertForTokenClassification):
    """`BertForTokenClassification` with a BiLSTM between encoder and classifier (Table 5)."""

    with_bilstm = True


class BertBiLSTMForQuestionAnswering(BertForQuestionAnswering):
    """`BertForQuestionAnswering` with a BiLSTM between encoder and span classifier (Table 5's
    "LTR & No NSP + BiLSTM" row)."""

    with_bilstm = True


class BertForMultipleChoice(_PooledClassifier):
    """One `[CLS] context [SEP] choice [SEP]` per choice, a score from the pooled vector, softmax
    over the choices (SWAG). The family's own scorer where its checkpoints have another
    (`Family.choice_classifier`: DistilBERT's pre_classifier, ELECTRA's sequence_summary,
    ModernBERT's head)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self._add_classifier(config, family_of(config.model_type).choice_classifier, 1)
        self.init_weights()

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, labels: Tensor | None = None,
                **options: Unpack[EncodeOptions]) -> BertHeadOutput:  # fmt: skip
        """Inputs (B, C, S) for C choices; `labels` (B,): the index of the right choice."""
        if input_ids.dim() != 3:
            raise ValueError(
                f"input_ids must be (batch, choices, seq_len), got {tuple(input_ids.shape)}"
            )
        batch, choices, seq_len = input_ids.shape

        def flat(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.reshape(batch * choices, seq_len)

        out = self._encode(
            input_ids.reshape(batch * choices, seq_len),
            flat(token_type_ids),
            flat(attention_mask),
            **options,
        )
        logits = self._logits(out, flat(attention_mask)).view(batch, choices)
        loss = (
            sequence_loss(logits, labels, "single_label_classification")
            if labels is not None
            else None
        )
        return BertHeadOutput(logits, loss, out.hidden_states, out.attentions)


def _needs_pooler(config: BertConfig, what: str) -> None:
    """Refuse a head reading the pooler on a family whose checkpoints have none."""
    if not family_of(config.model_type).pooler:
        raise ValueError(
            f"{what} reads BERT's pooler, which {config.model_type} checkpoints do not have; "
            "bertkit runs it for bert, roberta, xlm-roberta and mpnet"
        )


def _classifier_dropout(config: BertConfig) -> float:
    return (
        config.classifier_dropout
        if config.classifier_dropout is not None
        else config.hidden_dropout_prob
    )


# Architectures by the name written in config.json "architectures".
MODEL_CLASSES: dict[str, type[BertPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (
        BertModel,
        BertForPreTraining,
        BertForMaskedLM,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertForQuestionAnswering,
        BertForMultipleChoice,
        BertBiLSTMForTokenClassification,
        BertBiLSTMForQuestionAnswering,
        BertForSentenceEmbedding,
    )
}
