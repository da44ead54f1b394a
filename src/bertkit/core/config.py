"""`BertConfig`: the model's hyper-parameters, with the checkpoint files' own field names.

The field names are Google's (`bert_config.json`) plus Hugging Face's additions
(`layer_norm_eps`, `pad_token_id`, `id2label`, ...), so both JSON files round-trip unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit._io import read_json
from bertkit.core.family import family_of

# Activations a BERT checkpoint may name. "gelu" is the exact (erf) GELU of the paper's code;
# "gelu_new"/"gelu_pytorch_tanh" are the tanh approximation some later checkpoints use.
ACTIVATIONS = (
    "gelu",
    "gelu_new",
    "gelu_pytorch_tanh",
    "gelu_fast",
    "relu",
    "silu",
    "swish",
    "tanh",
)

# bertkit's architecture keys beyond the paper: the paper's value first (and the default).
ARCHITECTURE_CHOICES: dict[str, tuple[str, ...]] = {
    "layer_norm_position": ("post", "pre"),
    "feed_forward": ("mlp", "glu"),
}

# Google's released sizes (google-research/bert README, "BERT-Tiny" ... "BERT-Large"):
# name -> (num_hidden_layers L, hidden_size H, num_attention_heads A). intermediate = 4H.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

# Keys Hugging Face writes into config.json that say nothing about a BERT's weights or maths.
# They are accepted and dropped on read; `model_type` and `architectures` are written back on save.
_HF_IGNORED_KEYS = frozenset(
    {
        "architectures",
        "model_type",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_cache",
        "gradient_checkpointing",
        "output_past",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
        "tokenizer_class",
        "bos_token_id",
        "eos_token_id",
        "sep_token_id",
        "cls_token_id",
        "finetuning_task",
        "chunk_size_feed_forward",
        "add_cross_attention",
        "tie_word_embeddings",
        "torchscript",
        "pruned_heads",
        "_name_or_path",
        "_attn_implementation_autoset",
        "name_or_path",
    }
)
# Keys in some of Google's bert_config.json files (e.g. multilingual) that configure nothing we
# build: the pooler keys describe the single dense+tanh pooler every BERT has.
_GOOGLE_IGNORED_KEYS = frozenset(
    {
        "directionality",
        "pooler_fc_size",
        "pooler_num_attention_heads",
        "pooler_num_fc_layers",
        "pooler_size_per_head",
        "pooler_type",
    }
)
# Google's bert_config.json holds exactly these (modeling.py `BertConfig.__init__`).
GOOGLE_KEYS = (
    "attention_probs_dropout_prob",
    "hidden_act",
    "hidden_dropout_prob",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "max_position_embeddings",
    "num_attention_heads",
    "num_hidden_layers",
    "type_vocab_size",
    "vocab_size",
)


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder and its task heads.

    `BertConfig.from_preset("base")` gives BERT-Base (L=12, H=768, A=12, 110M parameters).
    """

    vocab_size: int = 30522
    hidden_size: int = 768  # H
    num_hidden_layers: int = 12  # L
    num_attention_heads: int = 12  # A
    intermediate_size: int = 3072  # feed-forward size, 4H in every released model
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # Left-to-right (causal) self-attention, for the paper's LTR ablation. Hugging Face's name,
    # so transformers applies the same mask to a checkpoint we save.
    is_decoder: bool = False
    position_embedding_type: str = "absolute"
    # Task heads (Hugging Face's names). `id2label` fixes num_labels of classification heads.
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    problem_type: str | None = (
        None  # "regression" | "single_label_classification" | "multi_label_classification"
    )
    classifier_dropout: float | None = None  # None: use hidden_dropout_prob
    # Beyond the paper (bertkit's own keys, written to config.json only when not the paper's):
    # "pre" puts each sub-layer's LayerNorm before it and one more after the last layer
    # (x + F(LN(x)), as GPT-2 and most later encoders); "glu" makes the feed-forward
    # act(x W) * (x V) (Shazeer 2020; GEGLU with gelu), the intermediate weight then (2I, H).
    # Neither is a checkpoint transformers or Google's code can run.
    layer_norm_position: str = "post"
    feed_forward: str = "mlp"
    # The family the checkpoint belongs to (config.json's `model_type`: bert, roberta,
    # xlm-roberta, electra, distilbert; `core.family`), and ELECTRA's embedding width (the
    # embeddings then projected to hidden_size); None: hidden_size.
    model_type: str = "bert"
    embedding_size: int | None = None
    # MPNet's relative position buckets: a bias per head and bucket shared by every layer
    relative_attention_num_buckets: int | None = None
    # ModernBERT's (transformers' names): rotary positions of two bases, for the layers of
    # `layer_types` ("full_attention" or "sliding_attention": a window of `local_attention`
    # pieces, half each side), and the linear layers' and LayerNorms' biases
    global_rope_theta: float | None = None
    local_rope_theta: float | None = None
    layer_types: list[str] | None = None
    local_attention: int | None = None
    attention_bias: bool = True
    mlp_bias: bool = True
    norm_bias: bool = True
    # Anything else the file held, when read with strict=False; written back unchanged.
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            if self.label2id is None:
                self.label2id = {v: k for k, v in self.id2label.items()}
        if self.label2id is not None:
            self.label2id = {str(k): int(v) for k, v in self.label2id.items()}
        self.validate()

    # ----------------------------------------------------------------------------- checks
    def validate(self) -> None:
        """Raise ValueError naming the field when the configuration cannot describe a BERT."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        family_of(self.model_type, "BertConfig")
        for name in ("type_vocab_size", "embedding_size", "relative_attention_num_buckets"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < (name != "type_vocab_size")):  # fmt: skip
                raise ValueError(f"BertConfig.{name} must be a whole number, got {value!r}")
        if self.position_offset >= self.max_position_embeddings:
            raise ValueError(
                f"BertConfig.max_position_embeddings ({self.max_position_embeddings}) leaves no "
                f"position after {self.model_type}'s offset of {self.position_offset}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"BertConfig.hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"BertConfig.hidden_act {self.hidden_act!r} is unknown; expected one of {ACTIVATIONS}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= float(value) < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {value!r}")
        if self.classifier_dropout is not None and not 0.0 <= self.classifier_dropout < 1.0:
            raise ValueError(
                f"BertConfig.classifier_dropout must be in [0, 1), got {self.classifier_dropout!r}"
            )
        if not float(self.initializer_range) > 0:
            raise ValueError(
                f"BertConfig.initializer_range must be positive, got {self.initializer_range!r}"
            )
        if not float(self.layer_norm_eps) > 0:
            raise ValueError(
                f"BertConfig.layer_norm_eps must be positive, got {self.layer_norm_eps!r}"
            )
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"BertConfig.pad_token_id ({self.pad_token_id}) must be within the vocabulary "
                f"(0..{self.vocab_size - 1})"
            )
        for name, allowed in ARCHITECTURE_CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"BertConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}"
                )
        if self.position_embedding_type != "absolute":
            raise ValueError(
                "BertConfig.position_embedding_type must be 'absolute' (BERT's learned positions), "
                f"got {self.position_embedding_type!r}"
            )
        if self.problem_type not in (
            None,
            "regression",
            "single_label_classification",
            "multi_label_classification",
        ):
            raise ValueError(f"BertConfig.problem_type {self.problem_type!r} is unknown")
        memory = _physical_memory()
        if memory and 4 * self.parameter_estimate() > memory:
            raise ValueError(
                f"this config has about {self.parameter_estimate() / 1e9:,.1f}B parameters: "
                f"{4 * self.parameter_estimate() / 2**30:,.0f} GiB in fp32 for the weights alone, "
                f"more than this machine's {memory / 2**30:,.0f} GiB (hidden_size "
                f"{self.hidden_size}, num_hidden_layers {self.num_hidden_layers}, vocab_size "
                f"{self.vocab_size}, intermediate_size {self.intermediate_size})"
            )

    def parameter_estimate(self) -> int:
        """Parameters of BertModel with this config (embeddings, layers, pooler), computed from
        the sizes without building anything: BERT-Base gives 109,482,240."""
        h, i, e = self.hidden_size, self.intermediate_size, self.embedding_size or self.hidden_size
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * e
        embeddings += 2 * e - 2 * h + ((e * h + h) if e != h else 0)  # its LayerNorm, projection
        up = 2 * (h * i + i) if self.feed_forward == "glu" else h * i + i
        layer = 4 * (h * h + h) + 2 * h + up + (i * h + h) + 2 * h
        final = 2 * h if self.layer_norm_position == "pre" else 0
        final += (self.relative_attention_num_buckets or 0) * self.num_attention_heads
        return embeddings + 2 * h + self.num_hidden_layers * layer + final + (h * h + h)

    @property
    def is_paper_architecture(self) -> bool:
        """Post-LN layers with the MLP feed-forward: what transformers and Google's code run."""
        return all(getattr(self, k) == allowed[0] for k, allowed in ARCHITECTURE_CHOICES.items())

    @property
    def position_offset(self) -> int:
        """The row of the position table that position 0 reads: 0, or RoBERTa's
        pad_token_id + 1 (`core.family`)."""
        return self.pad_token_id + 1 if family_of(self.model_type).positions == "offset" else 0

    @property
    def max_length(self) -> int:
        """The most positions (pieces) one input may have."""
        return self.max_position_embeddings - self.position_offset

    # ----------------------------------------------------------------------------- helpers
    @property
    def head_size(self) -> int:
        """Size of one attention head, H / A."""
        return self.hidden_size // self.num_attention_heads

    @property
    def num_labels(self) -> int:
        """Outputs of a classification head: len(id2label), 2 when unset (Hugging Face's default)."""
        return len(self.id2label) if self.id2label else 2

    def with_labels(self, labels: int | list[str]) -> BertConfig:
        """A copy whose classification heads have these labels (a count or the label names)."""
        names = [f"LABEL_{i}" for i in range(labels)] if isinstance(labels, int) else list(labels)
        if not names:
            raise ValueError("a classification head needs at least one label")
        return dataclasses.replace(
            self, id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)}
        )

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> BertConfig:
        """One of Google's released sizes: tiny, mini, small, medium, base, large.

        >>> BertConfig.from_preset("mini").num_hidden_layers
        4
        """
        try:
            layers, hidden, heads = PRESETS[name]
        except KeyError:
            raise ValueError(
                f"unknown preset {name!r}; expected one of {sorted(PRESETS, key=list(PRESETS).index)}"
            ) from None
        values: dict[str, Any] = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
        )
        values.update(overrides)
        return cls(**values)

    # ----------------------------------------------------------------------------- JSON
    @classmethod
    def from_dict(
        cls, data: dict[str, Any], *, strict: bool = True, source: str = "config"
    ) -> BertConfig:
        """Build from a Google `bert_config.json` or Hugging Face `config.json` dictionary.

        Unknown keys raise ValueError (naming them and `source`) unless `strict=False`, in which
        case they are kept in `extra` and written back by `to_dict`.
        """
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
        model_type = data.get("model_type", "bert")
        family = family_of(model_type, source)
        if family.adapt_config is not None:  # (ModernBERT's rope and layer types, both formats)
            data = family.adapt_config(data)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        values: dict[str, Any] = {"model_type": model_type, **family.config_defaults}
        extra: dict[str, Any] = {}
        unknown = []
        for key, value in data.items():
            key = family.config_keys.get(key, key)
            if key in family.kept_keys:
                extra[key] = value
            elif key in names and key != "model_type":
                values[key] = value
            elif key in _HF_IGNORED_KEYS or key in _GOOGLE_IGNORED_KEYS:
                continue
            elif key == "num_labels":  # Hugging Face's shorthand; id2label wins when both are given
                if "id2label" not in data:
                    values["id2label"] = {i: f"LABEL_{i}" for i in range(int(value))}
            else:
                unknown.append(key)
                extra[key] = value
        if unknown and strict:
            raise ValueError(
                f"{source}: unknown config keys {sorted(unknown)}; pass strict=False to keep them "
                "as extras"
            )
        # Google's own BertConfig requires only vocab_size; every other key defaults to BERT-Base,
        # as in both reference implementations (a wrong default then fails on tensor shapes).
        if "vocab_size" not in data:
            raise ValueError(f"{source}: missing required config key 'vocab_size'")
        try:
            config = cls(**values)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{source}: {err}") from None
        config.extra = extra
        return config

    def to_dict(self, flavour: str = "hf") -> dict[str, Any]:
        """`flavour="hf"`: a transformers-compatible config.json; "google": bert_config.json."""
        if flavour == "google":
            if self.model_type != "bert":
                raise ValueError(f"Google's BERT code has no {self.model_type} models")
            if not self.is_paper_architecture:
                raise ValueError(
                    "Google's BERT code has no pre-LN or GLU layers: this model "
                    f"(layer_norm_position {self.layer_norm_position!r}, feed_forward "
                    f"{self.feed_forward!r}) cannot be written as a TF checkpoint"
                )
            return {k: getattr(self, k) for k in GOOGLE_KEYS}
        if flavour != "hf":
            raise ValueError(f"flavour must be 'hf' or 'google', got {flavour!r}")
        family = family_of(self.model_type)
        theirs = {ours: key for key, ours in family.config_keys.items()}
        data: dict[str, Any] = {"model_type": self.model_type}
        for f in dataclasses.fields(self):
            if f.name in ("extra", "model_type") or f.name in family.unwritten_keys:
                continue
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name in ARCHITECTURE_CHOICES and value == ARCHITECTURE_CHOICES[f.name][0]:
                continue  # the paper's: config.json stays what transformers writes
            if f.name.endswith("_bias") and value is True:
                continue  # (every BERT's; only ModernBERT's config.json says otherwise)
            if f.name == "id2label":
                value = {str(k): v for k, v in value.items()}
            data[theirs.get(f.name, f.name)] = value
        data.update(self.extra)
        return data

    @classmethod
    def resolve(cls, spec: str | os.PathLike | BertConfig, vocab_size: int) -> BertConfig:
        """What a `--config` names, for a vocabulary of `vocab_size`: a preset (tiny … large,
        sized to it), a config.json / bert_config.json path or a BertConfig (either must match)."""
        if isinstance(spec, BertConfig):
            resolved = spec
        elif str(spec) in PRESETS:
            resolved = cls.from_preset(str(spec), vocab_size=vocab_size)
        elif Path(spec).is_file():
            resolved = cls.from_json_file(spec)
        else:
            raise ValueError(
                f"--config {str(spec)!r} is neither a preset ({', '.join(PRESETS)}) nor a file"
            )
        if resolved.vocab_size != vocab_size:
            raise ValueError(
                f"config vocab_size {resolved.vocab_size} != the vocabulary's {vocab_size} tokens"
            )
        return resolved

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, *, strict: bool = True) -> BertConfig:
        """Read a Google `bert_config.json` or a Hugging Face `config.json`."""
        path = Path(path)
        try:
            data = read_json(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: config file not found") from None
        return cls.from_dict(data, strict=strict, source=str(path))

    def to_json_string(self, flavour: str = "hf", **extra: Any) -> str:
        data = self.to_dict(flavour)
        data.update(extra)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def to_json_file(self, path: str | os.PathLike, flavour: str = "hf", **extra: Any) -> None:
        """Write atomically; `flavour` as in `to_dict`, `extra` keys added (e.g. architectures)."""
        from bertkit._io import atomic_write_text

        atomic_write_text(path, self.to_json_string(flavour, **extra))


def _physical_memory() -> int | None:
    """Bytes of RAM (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
