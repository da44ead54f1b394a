"""bertkit: BERT (Devlin et al., NAACL 2019) on PyTorch, exact to the paper and to real checkpoints.

Names are imported on first use (PEP 562), so tools that need only the tokenizer, such as the
shard-preparation workers, start without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "BertConfig": "bertkit.core.config",
    "BertTokenizer": "bertkit.core.tokenizer",
    "train_vocab": "bertkit.core.tokenizer",
    "BertModel": "bertkit.core.model",
    "BertModelOutput": "bertkit.core.model",
    "BertForPreTraining": "bertkit.core.heads",
    "BertForMaskedLM": "bertkit.core.heads",
    "BertForSequenceClassification": "bertkit.core.heads",
    "BertForTokenClassification": "bertkit.core.heads",
    "BertForQuestionAnswering": "bertkit.core.heads",
    "BertForMultipleChoice": "bertkit.core.heads",
    "finetune": "bertkit.finetuning.train",
    "FinetuneConfig": "bertkit.finetuning.train",
    "DataConfig": "bertkit.tasks.own",
    "Predictor": "bertkit.inference.predict",
    "PredictConfig": "bertkit.inference.predict",
    "FileConfig": "bertkit.rows",
    "Embedder": "bertkit.inference.embedder",
    "extract": "bertkit.inference.features",
    "FillMask": "bertkit.inference.fill_mask",
    "similarity": "bertkit.inference.insight",
    "attention": "bertkit.inference.insight",
}
__all__ = list(_EXPORTS)  # (the imports under TYPE_CHECKING name the same: a test checks)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bertkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)


if TYPE_CHECKING:  # what static checkers read (F401 off for this file: pyproject)
    from bertkit.core.config import BertConfig
    from bertkit.core.heads import (
        BertForMaskedLM,
        BertForMultipleChoice,
        BertForPreTraining,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )
    from bertkit.core.model import BertModel, BertModelOutput
    from bertkit.core.tokenizer import BertTokenizer, train_vocab
    from bertkit.finetuning.train import FinetuneConfig, finetune
    from bertkit.inference.embedder import Embedder
    from bertkit.inference.features import extract
    from bertkit.inference.fill_mask import FillMask
    from bertkit.inference.insight import attention, similarity
    from bertkit.inference.predict import PredictConfig, Predictor
    from bertkit.rows import FileConfig
    from bertkit.tasks.own import DataConfig
