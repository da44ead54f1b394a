"""Sentence embeddings: a text's token states pooled into one vector, the bi-encoder that
`bertkit finetune sentence-embedding` trains, and its folder in the sentence-transformers layout
(`bertkit.inference.embedder.Embedder` gives raw texts' vectors).

Pooling is defined once, as sentence-transformers defines it: the mean of the final states of
every real token ([CLS] and [SEP] included: attention mask 1), or [CLS]'s state. A saved model is
`config.json`, `model.safetensors` (a plain BertModel: transformers' AutoModel loads it),
`vocab.txt`, and sentence-transformers' `modules.json` (Transformer, Pooling, Normalize),
`sentence_bert_config.json` and `1_Pooling/config.json`: `SentenceTransformer(path)` gives the
same vectors.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bertkit._io import TASK_FILE, atomic_write_text, read_json
from bertkit.core.config import BertConfig
from bertkit.core.model import BertModel, BertPreTrainedModel

POOLINGS = ("mean", "cls")
POOLING_DIR = "1_Pooling"


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str = "mean") -> torch.Tensor:
    """(B, S, H) states and the (B, S) mask -> (B, H): the mean over the mask's real tokens, or
    [CLS]'s state (`cls`).

    >>> pool(torch.ones(1, 3, 2).cumsum(1), torch.tensor([[1, 1, 0]])).tolist()
    [[1.5, 1.5]]
    """
    if pooling == "cls":
        return hidden[:, 0]
    if pooling != "mean":
        raise ValueError(f"pooling must be one of {POOLINGS}, not {pooling!r}")
    weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def shortened(vectors: torch.Tensor, dimensions: int, unit: torch.Tensor | bool) -> torch.Tensor:
    """(N, H) vectors cut to their first `dimensions` coordinates (a Matryoshka model's smaller
    size), then brought to unit length where `unit` says (one flag, or one per row): the cut
    before the normalising, as sentence-transformers' truncate_dim with normalized vectors.

    >>> shortened(torch.tensor([[3.0, 4.0, 12.0]]), 2, True).tolist()
    [[0.6000000238418579, 0.800000011920929]]
    """
    cut = vectors[:, :dimensions]
    if isinstance(unit, bool):
        return F.normalize(cut, dim=-1) if unit else cut
    return torch.where(unit.unsqueeze(1), F.normalize(cut, dim=-1), cut)


# the prompt names each role takes by default, in sentence-transformers' order of preference
# (encode_query, encode_document)
ROLE_PROMPTS = {"query": ("query",), "document": ("document", "passage", "corpus")}


def prompt_for(prompts: dict[str, str], role: str) -> str | None:
    """The name of the prompt a folder's `prompts` give to texts of a `role` (query or
    document), None where it declares none for it.

    >>> prompt_for({"query": "query: ", "passage": "passage: "}, "document")
    'passage'
    """
    return next((name for name in ROLE_PROMPTS[role] if name in prompts), None)


def _declared(file: Path) -> Any:
    """A sentence-transformers module file's JSON; None where the folder has no such file."""
    return read_json(file) if file.exists() else None


def read_pooling(path: str | os.PathLike) -> str | None:
    """The pooling a sentence-transformers folder declares (1_Pooling/config.json); None where
    it declares none."""
    file = Path(path) / POOLING_DIR / "config.json"
    settings = _declared(file)
    if settings is None:
        return None
    # sentence-transformers 6 writes "pooling_mode" (a name, or a list of them); earlier
    # versions one flag per mode
    mode = settings.get("pooling_mode")
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if mode is None:
        mode = ("mean" if settings.get("pooling_mode_mean_tokens")
                else "cls" if settings.get("pooling_mode_cls_token") else None)  # fmt: skip
    if mode in POOLINGS:
        return mode
    raise ValueError(f"{file}: pooling {mode!r}: a pooling bertkit does not have (it has "
                     f"{' and '.join(POOLINGS)})")  # fmt: skip


def read_prompts(path: str | os.PathLike) -> tuple[dict[str, str], str | None, bool]:
    """The prompts a sentence-transformers folder declares (config_sentence_transformers.json's
    `prompts`, e.g. {"query": "query: ", "document": "passage: "}), its `default_prompt_name`,
    and whether pooling counts the prompt's tokens (1_Pooling/config.json's `include_prompt`,
    true unless it says otherwise)."""
    path = Path(path)
    settings = _declared(path / "config_sentence_transformers.json") or {}
    prompts = settings.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, (str, type(None)))
                                                 for v in prompts.values()):  # fmt: skip
        raise ValueError(f"{path / 'config_sentence_transformers.json'}: \"prompts\" must map "
                         "names to texts")  # fmt: skip
    pooling = _declared(path / POOLING_DIR / "config.json") or {}
    # a null prompt is no prompt, as sentence-transformers reads it
    return ({name: text or "" for name, text in prompts.items()},
            settings.get("default_prompt_name"), pooling.get("include_prompt", True))  # fmt: skip


@dataclass(frozen=True)
class Splade:
    """SPLADE pooling (sentence-transformers' SpladePooling): each vocabulary entry's weight is
    log(1 + ReLU(its masked-LM logit)) — twice log1p with `log1p_relu` — then the `max` (or
    `sum`) over the text's tokens."""

    pooling: str = "max"
    activation: str = "relu"


def read_splade(path: str | os.PathLike) -> Splade | None:
    """The SPLADE pooling a sentence-transformers SparseEncoder folder declares (modules.json's
    SpladePooling module and its config.json); None where it declares none."""
    path = Path(path)
    for module in _declared(path / "modules.json") or []:
        if str(module.get("type", "")).endswith("SpladePooling"):
            file = path / module.get("path", "") / "config.json"
            settings = _declared(file) or {}
            found = Splade(settings.get("pooling_strategy", "max"),
                           settings.get("activation_function", "relu"))  # fmt: skip
            if found.pooling not in ("max", "sum") or found.activation not in ("relu",
                                                                                 "log1p_relu"):  # fmt: skip
                raise ValueError(f"{file}: SPLADE pooling {found.pooling!r} with "
                                 f"{found.activation!r}: bertkit has max or sum, relu or "
                                 "log1p_relu")  # fmt: skip
            return found
    return None


@dataclass(frozen=True)
class MultiVector:
    """A multi-vector (ColBERT-style, late-interaction) folder as sentence-transformers'
    MultiVectorEncoder saves it: each token's final state through a linear `projection` (the
    Dense module's folder; None: none), kept where the MultiVectorMask keeps it (real tokens;
    for `skiplist_tasks`, not the `skiplist` pieces; for documents only `keep_only` ids where
    given), at unit length if `normalize`. Queries and documents are cut at their own lengths;
    `expansion` pads queries with [MASK]s as ColBERT does ({"strategy": "fixed" or "min",
    "length", "attend", "token"}); scores are MaxSim (`meanmaxsim`: over the query's vectors)."""

    projection: str | None = None
    skiplist: tuple[str, ...] = ()
    skiplist_tasks: tuple[str, ...] = ("document",)
    keep_only: tuple[int, ...] | None = None
    normalize: bool = True
    query_length: int | None = None
    document_length: int | None = None
    expansion: dict[str, Any] | None = None
    similarity: str = "maxsim"


def read_multi_vector(path: str | os.PathLike) -> MultiVector | None:
    """The multi-vector settings a MultiVectorEncoder folder declares (modules.json's Dense,
    MultiVectorMask and Normalize modules, sentence_bert_config.json's query_length,
    document_length and query_expansion); None where the folder is not one. A module bertkit
    does not run (token pooling, another activation) is refused by name."""
    path = Path(path)
    modules = _declared(path / "modules.json") or []
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if "MultiVectorMask" not in kinds:
        return None
    found: dict[str, Any] = {"normalize": "Normalize" in kinds}
    for module, kind in zip(modules, kinds, strict=True):
        folder = path / module.get("path", "")
        settings = _declared(folder / "config.json") or {}
        if kind == "Dense":
            activation = str(settings.get("activation_function", "")).rsplit(".", 1)[-1]
            if activation != "Identity":
                raise ValueError(f"{folder / 'config.json'}: a {activation} projection; bertkit "
                                 "runs a linear one (Identity)")  # fmt: skip
            found["projection"] = module.get("path", "")
        elif kind == "MultiVectorMask":
            tasks = settings.get("skiplist_tasks") or ["document"]
            keep = settings.get("keep_only_token_ids")
            found |= {"skiplist": tuple(settings.get("skiplist_words") or ()),
                      "skiplist_tasks": tuple([tasks] if isinstance(tasks, str) else tasks),
                      "keep_only": tuple(keep) if keep else None}  # fmt: skip
        elif kind not in ("Transformer", "Normalize", "MLMTransformer"):
            raise ValueError(f"{path / 'modules.json'}: a {kind} module; bertkit's multi-vector "
                             "path runs Transformer, Dense, MultiVectorMask and Normalize")  # fmt: skip
    reading = _declared(path / "sentence_bert_config.json") or {}
    expansion = reading.get("query_expansion")
    if expansion is not None and expansion.get("strategy") not in ("fixed", "min"):
        raise ValueError(f"{path / 'sentence_bert_config.json'}: query_expansion strategy "
                         f"{expansion.get('strategy')!r} (bertkit has fixed and min)")  # fmt: skip
    settings = _declared(path / "config_sentence_transformers.json") or {}
    return MultiVector(**found, query_length=reading.get("query_length"),
                       document_length=reading.get("document_length"), expansion=expansion,
                       similarity=settings.get("similarity_fn_name") or "maxsim")  # fmt: skip


def maxsim(query: torch.Tensor, documents: list[torch.Tensor], mean: bool = False) -> torch.Tensor:
    """Late interaction (ColBERT's MaxSim): for each document, the sum over the query's vectors
    of each one's largest dot product with the document's vectors (`mean`: divided by the
    query's count, MeanMaxSim).

    >>> q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    >>> maxsim(q, [torch.tensor([[1.0, 0.0], [0.6, 0.8]])]).tolist()
    [1.7999999523162842]
    """
    if not documents:
        return torch.zeros(0)
    lengths = [len(d) for d in documents]
    similarities = query @ torch.cat(documents).T  # (q, all documents' vectors)
    best = torch.stack([part.amax(1) if len(part.T) else torch.zeros(len(query))
                        for part in similarities.split(lengths, dim=1)])  # fmt: skip
    scores = best.sum(1)
    return scores / max(len(query), 1) if mean else scores


def declared_normalize(path: str | os.PathLike) -> bool:
    """Whether a folder declares unit-length vectors (sentence-transformers' Normalize module in
    modules.json)."""
    modules = _declared(Path(path) / "modules.json") or []
    return any(str(m.get("type", "")).endswith("Normalize") for m in modules)


class BertForSentenceEmbedding(BertPreTrainedModel):
    """The encoder, pooled (`pooling`) and normalised to unit length: one vector per text.
    Texts come as the usual `input_ids` (B, S) with their mask; a trained model compares texts
    by the dot product of their vectors (their cosine)."""

    def __init__(self, config: BertConfig, pooling: str = "mean") -> None:
        super().__init__(config)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, not {pooling!r}")
        self.bert = BertModel(config)
        if self.bert.pooler is not None:
            # Kept, so a folder keeps its pooler's weights; no pooling reads it, so frozen: a
            # trained parameter without a gradient would stall DDP's all-reduce
            self.bert.pooler.requires_grad_(False)
        self.pooling = pooling
        self.max_seq_length = 128  # what sentence-transformers truncates at (set by finetune)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        normalize: bool = True,
    ) -> torch.Tensor:  # (B, H), unit length unless `normalize` is false
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.bert(input_ids, token_type_ids, attention_mask, unpad=True).last_hidden_state
        pooled = pool(hidden.float(), attention_mask, self.pooling)
        return F.normalize(pooled, dim=-1) if normalize else pooled

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs: Any):
        """A BERT folder (its declared sentence-transformers pooling, else mean) as an embedding
        model."""
        from bertkit.core.hub import model_dir

        path = model_dir(path)
        model = super().from_pretrained(path, **kwargs)
        model.pooling = read_pooling(path) or "mean"
        return model

    def save_pretrained(self, directory: str | os.PathLike, **kwargs: Any) -> None:
        """The encoder as a plain BertModel, and sentence-transformers' module files."""
        directory = Path(directory)
        self.bert.save_pretrained(directory, **kwargs)
        hidden = self.config.hidden_size
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": POOLING_DIR,
             "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize",
             "type": "sentence_transformers.models.Normalize"},
        ]  # fmt: skip
        pooling = {
            "word_embedding_dimension": hidden,
            "pooling_mode_cls_token": self.pooling == "cls",
            "pooling_mode_mean_tokens": self.pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": False,
            "include_prompt": True,
        }
        (directory / POOLING_DIR).mkdir(exist_ok=True)
        (directory / "2_Normalize").mkdir(exist_ok=True)
        atomic_write_text(directory / "modules.json", json.dumps(modules, indent=2))
        atomic_write_text(directory / POOLING_DIR / "config.json", json.dumps(pooling, indent=2))
        atomic_write_text(
            directory / "sentence_bert_config.json",
            json.dumps({"max_seq_length": self.max_seq_length, "do_lower_case": False}, indent=2),
        )


def declared_length(path: Path) -> int | None:
    """The length a folder's texts are cut at, where it says (sentence-transformers'
    sentence_bert_config.json, a fine-tuned folder's task record); None where it does not."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"),
                      (TASK_FILE, "max_seq_length")):  # fmt: skip
        file = path / name
        if file.exists():
            try:
                value = json.loads(file.read_text(encoding="utf-8")).get(key)
            except json.JSONDecodeError:
                continue
            if isinstance(value, int):
                return value
    return None
