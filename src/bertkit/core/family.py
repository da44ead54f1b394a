"""The BERT family: the checkpoints of BERT's descendants read as named variants of one encoder.

A `Family` says what a `model_type` of transformers' `config.json` changes, as small named
pieces the encoder (`core.model`) chooses by its config:

- positions: `learned` (BERT's, from position 0) or `offset` (RoBERTa's: position i is row
  i + pad_token_id + 1 of the table, as fairseq numbered them after the padding index); with
  `relative_attention_num_buckets`, a learned bias per head and bucket of relative distance
  added to every layer's attention scores (MPNet's, T5's buckets);
- segments: a token-type table or none (`type_vocab_size` 0: DistilBERT);
- an embedding projection (`embedding_size` below `hidden_size`: ELECTRA's
  `embeddings_project`);
- a pooler in the checkpoint or not; the tokenizer it ships (WordPiece, byte-level BPE,
  SentencePiece Unigram);
- the tensor and config names: the family's own, renamed to BERT's on reading and back on
  saving, so a folder saved by bertkit loads in transformers with the family's class.

A new variant is one `Family` here (and, where its maths differs, one named piece in the
encoder chosen by a config field), not a copied model file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit._io import read_json


@dataclass(frozen=True)
class Family:
    model_type: str
    prefix: str  # the encoder's attribute in transformers' heads ("roberta.encoder...")
    title: str  # transformers' class-name stem: "Roberta" -> RobertaModel, ...
    positions: str = "learned"  # or "offset"
    pooler: bool = True  # the base model's checkpoint holds a pooler
    tokenizer: str = "WordPiece"  # the model of the tokenizer it ships (tokenizer.json's)
    # the sequence classifier of its checkpoints: "pooler" (BERT's linear layer on the pooled
    # [CLS]), "tanh" / "gelu" (RoBERTa's and ELECTRA's dense + activation + out_proj on the
    # first token's state), "pre_classifier" (DistilBERT's pre_classifier + ReLU + classifier)
    classifier: str = "pooler"
    # its multiple-choice scorer: "pooler" (BERT's and RoBERTa's), "pre_classifier"
    # (DistilBERT's), "summary" (ELECTRA's sequence_summary) or "head" (ModernBERT's)
    choice_classifier: str = "pooler"
    # dropout on the attention's output projection (DistilBERT has none there)
    attention_output_dropout: bool = True
    # transformers' tensor-name beginnings (after the prefix) and BERT's, "{n}" a layer's number
    names: tuple[tuple[str, str], ...] = ()
    # config.json keys of the family -> BertConfig's field names
    config_keys: dict[str, str] = field(default_factory=dict)
    # config.json keys of the family that bertkit keeps as they are (written back on saving)
    kept_keys: tuple[str, ...] = ()
    # the tokenizer.json, not vocab.txt, holds its special tokens (MPNet's vocab.txt has
    # BERT's [CLS] and [SEP] beside its own <s> and </s>)
    tokenizer_json: bool = False
    # BertConfig's values where the family's config.json leaves a key out (its class's
    # defaults), and BertConfig's fields its config.json never holds
    config_defaults: dict[str, object] = field(default_factory=dict)
    unwritten_keys: tuple[str, ...] = ()
    # the family's config.json made flat before reading (ModernBERT's rope parameters)
    adapt_config: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # tensors that are one in the family's checkpoint and several in BERT's (ModernBERT's fused
    # query-key-value, renamed `attention.self.qkv.` by `names`): split on dim 0 on reading,
    # joined on saving
    fused: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # ModernBERT's first layer normalises nothing before attention
    first_attention_norm: bool = True
    # names that mean the masked-LM head only in a checkpoint with its decoder (ModernBERT's
    # `head.` is the classifiers' head elsewhere)
    mlm_names: tuple[tuple[str, str], ...] = ()

    def to_bert(self, name: str, masked_lm: bool = False) -> str:
        """A tensor name of this family's (without its prefix) as BERT's (`masked_lm`: of a
        checkpoint with the masked-LM decoder, where `mlm_names` hold)."""
        return _renamed(name, (self.mlm_names if masked_lm else ()) + self.names)

    def from_bert(self, name: str, masked_lm: bool = False) -> str:
        """A BERT tensor name as this family's (without its prefix)."""
        pairs = (self.mlm_names if masked_lm else ()) + self.names
        return _renamed(name, tuple((ours, theirs) for theirs, ours in pairs))

    def class_name(self, bert_class: str) -> str:
        """transformers' class of this family for one of bertkit's (BertModel ->
        RobertaModel)."""
        return bert_class.replace("Bert", self.title, 1)

    def bert_class(self, class_name: str) -> str:
        """bertkit's class for transformers' class of this family (RobertaForSequence-
        Classification -> BertForSequenceClassification); other names as they are."""
        if class_name.startswith(self.title):
            return "Bert" + class_name[len(self.title) :]
        return class_name


def _renamed(name: str, pairs: tuple[tuple[str, str], ...]) -> str:
    """`name` with the first of `pairs`' beginnings it starts with replaced by its partner."""
    for before, after in pairs:
        pattern = "^" + re.escape(before).replace(r"\{n\}", r"(\d+)")
        renamed, count = re.subn(pattern, after.replace("{n}", r"\1"), name)
        if count:
            return renamed
    return name


def _modernbert_config(data: dict[str, Any]) -> dict[str, Any]:
    """ModernBERT's config.json, either transformers' format (rope_parameters by layer type,
    layer_types) or the original (global_rope_theta, global_attn_every_n_layers), as flat keys
    BertConfig reads; the original keys are kept beside them."""
    data = dict(data)
    rope = data.get("rope_parameters") or {}
    if "full_attention" in rope:
        data.setdefault("global_rope_theta", rope["full_attention"]["rope_theta"])
    if "sliding_attention" in rope:
        data.setdefault("local_rope_theta", rope["sliding_attention"]["rope_theta"])
    data.setdefault("global_rope_theta", 160000.0)
    data.setdefault("local_rope_theta", 10000.0)
    if data.get("layer_types") is None:
        every = int(data.get("global_attn_every_n_layers", 3))
        data["layer_types"] = [
            "sliding_attention" if i % every else "full_attention"
            for i in range(int(data.get("num_hidden_layers", 22)))
        ]
    data.setdefault("local_attention", 128)
    return data


def _per_layer(prefix: str, pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """Renames inside every layer: the family's layer `prefix` ("transformer.layer.{n}.") and
    each (theirs, BERT's) name within it."""
    return tuple((prefix + theirs, "encoder.layer.{n}." + ours) for theirs, ours in pairs)


_ROBERTA: dict[str, object] = {"pad_token_id": 1, "type_vocab_size": 1}  # RobertaConfig's defaults
# RoBERTa's masked-LM head (and XLM-R's, MPNet's): BERT's transform, decoder and bias renamed
_LM_HEAD = (
    ("lm_head.dense.", "cls.predictions.transform.dense."),
    ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
    ("lm_head.decoder.", "cls.predictions.decoder."),
    ("lm_head.bias", "cls.predictions.bias"),
)
FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("bert", "bert", "Bert"),
        Family("roberta", "roberta", "Roberta", positions="offset", tokenizer="BPE",
               classifier="tanh", names=_LM_HEAD, config_defaults=_ROBERTA),
        Family("xlm-roberta", "roberta", "XLMRoberta", positions="offset", tokenizer="Unigram",
               classifier="tanh", names=_LM_HEAD, config_defaults=_ROBERTA),
        Family(
            "mpnet", "mpnet", "MPNet", positions="offset", tokenizer_json=True, classifier="tanh",
            names=_LM_HEAD + _per_layer(
                "encoder.layer.{n}.",
                (
                    ("attention.attn.q.", "attention.self.query."),
                    ("attention.attn.k.", "attention.self.key."),
                    ("attention.attn.v.", "attention.self.value."),
                    ("attention.attn.o.", "attention.output.dense."),
                    ("attention.LayerNorm.", "attention.output.LayerNorm."),
                ),
            ),
            config_defaults={"pad_token_id": 1, "type_vocab_size": 0,
                             "relative_attention_num_buckets": 32},
            unwritten_keys=("type_vocab_size", "position_embedding_type", "is_decoder"),
        ),
        Family(
            "modernbert", "model", "ModernBert", positions="rotary", pooler=False,
            tokenizer="BPE", classifier="head", choice_classifier="head",
            first_attention_norm=False,
            adapt_config=_modernbert_config,
            fused=(("attention.self.qkv.", ("attention.self.query.", "attention.self.key.",
                                            "attention.self.value.")),),
            mlm_names=(
                ("head.dense.", "cls.predictions.transform.dense."),
                ("head.norm.", "cls.predictions.transform.LayerNorm."),
                ("decoder.bias", "cls.predictions.bias"),
                ("decoder.weight", "cls.predictions.decoder.weight"),
            ),
            names=(
                ("embeddings.tok_embeddings.", "embeddings.word_embeddings."),
                ("embeddings.norm.", "embeddings.LayerNorm."),
                ("final_norm.", "encoder.LayerNorm."),
                ("head.norm.", "head.LayerNorm."),  # (the classifiers' head, as BERT's transform)
            ) + _per_layer(
                "layers.{n}.",
                (
                    ("attn_norm.", "attention.output.LayerNorm."),
                    ("attn.Wo.", "attention.output.dense."),
                    ("mlp_norm.", "output.LayerNorm."),
                    ("mlp.Wi.", "intermediate.dense."),
                    ("mlp.Wo.", "output.dense."),
                    ("attn.Wqkv.", "attention.self.qkv."),
                ),
            ),
            config_keys={"hidden_activation": "hidden_act", "norm_eps": "layer_norm_eps",
                         "attention_dropout": "attention_probs_dropout_prob",
                         "mlp_dropout": "hidden_dropout_prob"},
            kept_keys=("initializer_cutoff_factor", "embedding_dropout", "decoder_bias",
                       "classifier_pooling", "classifier_bias", "classifier_activation",
                       "deterministic_flash_attn", "sparse_prediction", "sparse_pred_ignore_index",
                       "reference_compile", "repad_logits_with_grad", "global_attn_every_n_layers",
                       "rope_parameters", "cls_token_id", "sep_token_id", "bos_token_id",
                       "eos_token_id", "tie_word_embeddings"),
            config_defaults={"type_vocab_size": 0, "layer_norm_position": "pre",
                             "feed_forward": "glu", "hidden_dropout_prob": 0.0,
                             "attention_probs_dropout_prob": 0.0, "layer_norm_eps": 1e-5},
            unwritten_keys=("type_vocab_size", "layer_norm_position", "feed_forward",
                            "position_embedding_type", "is_decoder"),
        ),
        Family("electra", "electra", "Electra", pooler=False, classifier="gelu",
               choice_classifier="summary",
               kept_keys=("summary_type", "summary_use_proj", "summary_activation",
                          "summary_last_dropout", "summary_first_dropout",
                          "summary_proj_to_labels"),
               # the generator's masked LM (ElectraForMaskedLM), narrowed to embedding_size
               names=(("generator_predictions.", "cls.predictions.transform."),
                      ("generator_lm_head.weight", "cls.predictions.decoder.weight"),
                      ("generator_lm_head.bias", "cls.predictions.bias"))),
        Family(
            "distilbert",
            "distilbert",
            "DistilBert",
            pooler=False,
            classifier="pre_classifier",
            choice_classifier="pre_classifier",
            attention_output_dropout=False,
            names=(
                ("vocab_transform.", "cls.predictions.transform.dense."),
                ("vocab_layer_norm.", "cls.predictions.transform.LayerNorm."),
                ("vocab_projector.weight", "cls.predictions.decoder.weight"),
                ("vocab_projector.bias", "cls.predictions.bias"),
            ) + _per_layer(
                "transformer.layer.{n}.",
                (
                    ("attention.q_lin.", "attention.self.query."),
                    ("attention.k_lin.", "attention.self.key."),
                    ("attention.v_lin.", "attention.self.value."),
                    ("attention.out_lin.", "attention.output.dense."),
                    ("sa_layer_norm.", "attention.output.LayerNorm."),
                    ("ffn.lin1.", "intermediate.dense."),
                    ("ffn.lin2.", "output.dense."),
                    ("output_layer_norm.", "output.LayerNorm."),
                ),
            ),
            config_keys={
                "dim": "hidden_size",
                "n_layers": "num_hidden_layers",
                "n_heads": "num_attention_heads",
                "hidden_dim": "intermediate_size",
                "dropout": "hidden_dropout_prob",
                "attention_dropout": "attention_probs_dropout_prob",
                "activation": "hidden_act",
            },
            kept_keys=("sinusoidal_pos_embds", "qa_dropout", "seq_classif_dropout", "tie_weights_"),
            config_defaults={"type_vocab_size": 0, "hidden_act": "gelu"},
            unwritten_keys=("type_vocab_size", "layer_norm_eps", "position_embedding_type",
                            "is_decoder"),
        ),
    )
}  # fmt: skip


def family_of(model_type: str, source: str = "config") -> Family:
    """The family a config's `model_type` names; ValueError listing those bertkit reads."""
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise ValueError(
            f"{source}: model_type {model_type!r} is not an architecture bertkit runs; it runs "
            f"{', '.join(FAMILIES)}"
        ) from None


def family_of_folder(path: str | os.PathLike) -> Family:
    """The family a model folder's `config.json` names — the one place a folder's family is
    read (the checkpoint reader, the tokenizer, the loader): BERT where the folder has no
    config.json or its config names no `model_type` (Google's bert_config.json); an unknown
    `model_type` refused by name, listing those bertkit runs; a broken file named with its
    line."""
    file = Path(path) / "config.json"
    if not file.exists():
        return FAMILIES["bert"]
    data = read_json(file, object_only=True)
    return family_of(str(data.get("model_type", "bert")), str(file))
