"""bertkit: BERT (Devlin et al., NAACL 2019) on PyTorch, exact to the paper and to real checkpoints."""

from bertkit.config import BertConfig
from bertkit.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertkit.model import BertModel, BertModelOutput
from bertkit.tokenizer import BertTokenizer, train_vocab

__version__ = "0.1.0"

__all__ = [
    "BertConfig",
    "BertTokenizer",
    "BertModel",
    "BertModelOutput",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertForMultipleChoice",
    "train_vocab",
]
