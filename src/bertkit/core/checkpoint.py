"""Checkpoints in and out: Hugging Face layout (safetensors / pytorch_model.bin) and Google's
TensorFlow checkpoints, read without TensorFlow.

Our state-dict names *are* Hugging Face's (`bert.encoder.layer.0.attention.self.query.weight`),
so the HF layout needs no renaming beyond legacy spellings; Google's names convert by the table
below (kernels transposed); the family's checkpoints (RoBERTa, DistilBERT, ...) are read under
BERT's names and written back under their own (`core.family`). Every load reports missing and
unexpected tensors by name and refuses shape mismatches, naming the tensor and both shapes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from bertkit._io import TASK_FILE, atomic_path, atomic_write_text, check_model_digest
from bertkit.core.config import BertConfig
from bertkit.core.family import Family, family_of, family_of_folder
from bertkit.core.hub import model_dir
from bertkit.core.tf_bundle import _BFloat16, bundle_prefix, read_bundle, write_bundle


class PreTrainedModule(Protocol):
    """What checkpoint I/O needs of a model: `bertkit.core.model.BertPreTrainedModel` and every head.
    A protocol, not an import, so the dependency runs one way: the model classes call into this
    module (`from_pretrained`, `save_pretrained`), and this module only calls their methods."""

    config: BertConfig
    base_model_prefix: str

    def init_module(self, module: torch.nn.Module, weights: str = ...) -> None: ...
    def tie_weights(self) -> None: ...
    def state_dict(self) -> dict[str, torch.Tensor]: ...
    def get_submodule(self, target: str) -> torch.nn.Module: ...
    def to_empty(self, *, device: Any) -> Any: ...
    def to(self, *args: Any, **kwargs: Any) -> Any: ...
    def eval(self) -> Any: ...


logger = logging.getLogger("bertkit")

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
HF_CONFIG = "config.json"
GOOGLE_CONFIG = "bert_config.json"
GOOGLE_PREFIX = "bert_model.ckpt"
TIED_DECODER = "cls.predictions.decoder.weight"

# ---------------------------------------------------------------------------- Google names
# Irregular Google TF variable names -> ours; everything else follows `_tf_to_hf`'s rule.
_TF_NAMES = {
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",  # (2, H): no transpose
    "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
    # run_classifier.py's head; run_squad.py's span head. Both are stored (out, H) already.
    "output_weights": "classifier.weight",
    "output_bias": "classifier.bias",
    "cls/squad/output_weights": "qa_outputs.weight",
    "cls/squad/output_bias": "qa_outputs.bias",
}
# Optimiser state and bookkeeping that a training checkpoint carries beside the weights.
_TF_SKIP = re.compile(
    r"(/adam_[mv]$|/Adam(_1)?$|/Momentum$|^global_step$|^good_steps$|^loss_scale$)"
)


def tf_to_hf_name(name: str) -> tuple[str, bool] | None:
    """Our name for a Google TF variable and whether its matrix is transposed; None to skip.

    >>> tf_to_hf_name("bert/encoder/layer_3/attention/self/query/kernel")
    ('bert.encoder.layer.3.attention.self.query.weight', True)
    >>> tf_to_hf_name("bert/embeddings/LayerNorm/gamma")
    ('bert.embeddings.LayerNorm.weight', False)
    """
    if _TF_SKIP.search(name):
        return None
    if name in _TF_NAMES:
        return _TF_NAMES[name], False
    parts = name.split("/")
    last = parts[-1]
    out = [
        p.replace("layer_", "layer.") if re.fullmatch(r"layer_\d+", p) else p for p in parts[:-1]
    ]
    if last == "kernel":
        return ".".join(out + ["weight"]), True
    if last in ("gamma", "beta"):
        return ".".join(out + ["weight" if last == "gamma" else "bias"]), False
    if last == "bias":
        return ".".join(out + ["bias"]), False
    if last.endswith("_embeddings"):
        return ".".join(out + [last, "weight"]), False
    return ".".join(out + [last]), False


def hf_to_tf_name(name: str) -> tuple[str, bool]:
    """The inverse of `tf_to_hf_name` for the tensors a BERT checkpoint holds."""
    for tf_name, hf_name in _TF_NAMES.items():
        if hf_name == name:
            return tf_name, False
    parts = name.split(".")
    scope: list[str] = []
    for i, part in enumerate(parts[:-1]):
        if part.isdigit() and i and parts[i - 1] == "layer":
            scope[-1] = f"layer_{part}"
        else:
            scope.append(part)
    last = parts[-1]
    if scope and scope[-1].endswith("_embeddings") and last == "weight":
        return "/".join(scope), False
    if scope and scope[-1] == "LayerNorm":
        return "/".join(scope + ["gamma" if last == "weight" else "beta"]), False
    if last == "weight":
        return "/".join(scope + ["kernel"]), True
    return "/".join(scope + [last]), False


# ---------------------------------------------------------------------------- reading
def detect_checkpoint_format(path: Path) -> str:
    """ "hf" or "google" for a checkpoint directory; FileNotFoundError naming what is missing."""
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: checkpoint directory not found")
    if any((path / f).exists() for f in (SAFETENSORS, SAFETENSORS_INDEX, PYTORCH_BIN)):
        return "hf"
    if any(path.glob("*.index")):
        return "google"
    raise FileNotFoundError(
        f"{path}: no weights found (expected {SAFETENSORS}, {PYTORCH_BIN}, or a Google "
        f"{GOOGLE_PREFIX}.index / .data-* pair)"
    )


def read_config(path: Path, *, strict: bool = False) -> BertConfig:
    for name in (HF_CONFIG, GOOGLE_CONFIG):
        if (path / name).exists():
            return BertConfig.from_json_file(path / name, strict=strict)
    raise FileNotFoundError(f"{path}: no {HF_CONFIG} or {GOOGLE_CONFIG}")


def read_state_dict(path: str | os.PathLike, *, verify: bool = True) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory under our (Hugging Face) names, on the CPU."""
    path = Path(path)
    if detect_checkpoint_format(path) == "google":
        return _read_google(bundle_prefix(path), verify=verify)
    if (path / SAFETENSORS).exists():
        if verify:  # against the SHA-256 the run that wrote it recorded, where one did
            check_model_digest(path)
        state = _read_safetensors(path / SAFETENSORS)
    elif (path / SAFETENSORS_INDEX).exists():
        state = {}
        index_file = path / SAFETENSORS_INDEX
        try:
            weight_map = json.loads(index_file.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise ValueError(f"{index_file}: not a safetensors index ({err})") from None
        for shard in sorted(set(weight_map.values())):
            state.update(_read_safetensors(path / shard))
    else:
        state = _read_torch_bin(path / PYTORCH_BIN)
    return _normalize_hf_names(_as_bert_names(state, family_of_folder(path)))


def _as_bert_names(state: dict[str, Any], family: Family) -> dict[str, Any]:
    """A family's tensor names (`roberta.encoder...`, `distilbert.transformer...`) as BERT's."""
    if family.model_type == "bert":
        return state
    out = {}
    masked_lm = any(name.startswith("decoder.") for name in state)  # (ModernBERT's decoder)
    for name, tensor in state.items():
        prefixed = name.startswith(family.prefix + ".")
        bare = family.to_bert(name[len(family.prefix) + 1 :] if prefixed else name, masked_lm)
        out[("bert." if prefixed else "") + bare] = tensor
    for joined, parts in family.fused:  # one tensor there, several here (split on dim 0)
        for name in [n for n in out if joined in n]:
            tensor = out.pop(name)  # (None: names alone, `tensor_names`)
            pieces = tensor.chunk(len(parts)) if tensor is not None else [None] * len(parts)
            for part, piece in zip(parts, pieces, strict=True):
                out[name.replace(joined, part)] = piece
    return out


def _as_family_names(state: dict[str, Any], family: Family) -> dict[str, Any]:
    """BERT's tensor names as `family`'s (what transformers' classes of it load)."""
    if family.model_type == "bert":
        return state
    state = dict(state)
    for joined, parts in family.fused:  # several tensors here, one there
        for name in [n for n in state if parts[0] in n]:
            pieces = [state.pop(name.replace(parts[0], part)) for part in parts]
            state[name.replace(parts[0], joined)] = torch.cat(pieces)
    out = {}
    masked_lm = any(name.startswith("cls.predictions.") for name in state)
    for name, tensor in state.items():
        prefixed = name.startswith("bert.")
        bare = family.from_bert(name[len("bert.") :] if prefixed else name, masked_lm)
        out[(family.prefix + "." if prefixed else "") + bare] = tensor
    return out


def tensor_names(path: str | os.PathLike) -> set[str]:
    """The names (ours) of a checkpoint directory's tensors; from the file headers alone where
    the format allows (safetensors), else by reading the weights."""
    path = Path(path)
    files = []
    if detect_checkpoint_format(path) == "hf":
        if (path / SAFETENSORS).exists():
            files = [path / SAFETENSORS]
        elif (path / SAFETENSORS_INDEX).exists():
            try:
                shards = json.loads((path / SAFETENSORS_INDEX).read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as err:
                raise ValueError(
                    f"{path / SAFETENSORS_INDEX}: not a safetensors index ({err})"
                ) from None
            files = [path / shard for shard in sorted(set(shards.values()))]
    if not files:
        return set(read_state_dict(path))
    from safetensors import SafetensorError, safe_open

    names: dict[str, None] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                names.update(dict.fromkeys(handle.keys()))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{file}: cannot read safetensors weights ({err})") from None
    return set(_normalize_hf_names(_as_bert_names(names, family_of_folder(path))))


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.exists():
        raise FileNotFoundError(f"{file}: weights file not found")
    try:
        return load_file(file, device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(
            f"{file}: cannot read safetensors weights, the file is truncated or corrupt ({err})"
        ) from None


def _read_torch_bin(file: Path) -> dict[str, torch.Tensor]:
    import pickle
    import zipfile

    # mmap needs torch's zip format; the legacy format (torch < 1.6, `_use_new_zipfile_serialization
    # =False`), which transformers still loads, is read without it
    mmap = zipfile.is_zipfile(file)
    try:
        # weights_only: tensors and plain containers only, never arbitrary pickled code.
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise ValueError(
            f"{file}: refused to load: it holds more than tensors (unpickling arbitrary objects "
            f"could run code): {err}"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        raise ValueError(
            f"{file}: cannot read PyTorch weights, the file is truncated or corrupt ({err})"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{file}: expected a dictionary of tensors")
    return state


def _read_google(prefix: Path, *, verify: bool) -> dict[str, torch.Tensor]:
    arrays = read_bundle(prefix, skip=lambda name: tf_to_hf_name(name) is None, verify=verify)
    state = {}
    for tf_name, array in arrays.items():
        name, transpose = tf_to_hf_name(tf_name)  # type: ignore[misc]
        if isinstance(array, _BFloat16):
            tensor = torch.from_numpy(np.asarray(array).view(np.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(np.asarray(array))
        state[name] = tensor.t().contiguous() if transpose else tensor
    return state


def _normalize_hf_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in state.items():
        # Old Hugging Face checkpoints (e.g. the original bert-base-uncased) say gamma/beta.
        name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
        name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
        if (
            name.endswith(("embeddings.position_ids", "embeddings.token_type_ids"))
            or name == "cls.predictions.decoder.bias"
        ):
            continue  # a non-persistent buffer some versions saved; a copy of cls.predictions.bias
        out[name] = tensor
    return out


# ---------------------------------------------------------------------------- loading
def _adapt_prefix(
    state: dict[str, torch.Tensor], model: PreTrainedModule
) -> dict[str, torch.Tensor]:
    """Match the checkpoint's `bert.` prefix to the model's (BertModel has none, heads have it)."""
    prefix = model.base_model_prefix
    encoder_keys = ("embeddings.", "embeddings_project.", "encoder.", "pooler.")
    has_prefix = any(k.startswith("bert.") for k in state)
    if prefix and not has_prefix:
        return {(f"{prefix}.{k}" if k.startswith(encoder_keys) else k): v for k, v in state.items()}
    if not prefix and has_prefix:
        return {k[len("bert.") :]: v for k, v in state.items() if k.startswith("bert.")} | {
            k: v for k, v in state.items() if not k.startswith("bert.")
        }
    return state


# How a tensor a checkpoint lacks is drawn (`load_state_dict_into`'s `new_weights`; the
# functions are `bertkit.core.model.INITIALISATIONS`)
NEW_WEIGHTS = ("normal", "truncated-normal")


def load_state_dict_into(
    model: PreTrainedModule,
    state: dict[str, torch.Tensor],
    *,
    source: str = "checkpoint",
    strict: bool = False,
    ignore_mismatched_sizes: bool = False,
    new_weights: str = "normal",
) -> dict[str, list[str]]:
    """Copy `state` into `model`, reporting what did not match; what `state` lacks (a new head)
    is drawn as `new_weights` says (`bertkit.core.model.INITIALISATIONS`).

    - A tensor whose shape differs raises ValueError naming it and both shapes (unless
      `ignore_mismatched_sizes`: it then keeps its fresh initialisation, with a warning).
    - Missing encoder tensors raise ValueError: such a checkpoint is broken or not a BERT.
    - Missing head tensors (e.g. a new classifier) keep their initialisation, with a warning.
    - Unexpected tensors are logged: pre-training heads unused by a fine-tuning model at INFO,
      anything else as a warning. `strict=True` makes every mismatch an error.
    Returns {"missing": [...], "unexpected": [...], "mismatched": [...]}.
    """
    if new_weights not in NEW_WEIGHTS:  # (before any work: a checkpoint lacking nothing
        # would otherwise take a misspelt choice without a word)
        raise ValueError(f"new_weights is {' or '.join(NEW_WEIGHTS)}, not {new_weights!r}")
    state = _adapt_prefix(_normalize_hf_names(state), model)
    expected = model.state_dict()
    tied = {TIED_DECODER, "decoder.weight"} & set(expected)
    loadable, mismatched = _matching(model, state, expected, source, ignore_mismatched_sizes)
    missing = sorted(set(expected) - set(state) - tied)
    unexpected = sorted(set(state) - set(expected))
    if TIED_DECODER in state and TIED_DECODER in expected:
        embeddings = state.get(
            "bert.embeddings.word_embeddings.weight", state.get("embeddings.word_embeddings.weight")
        )
        if embeddings is not None and not torch.equal(state[TIED_DECODER], embeddings):
            logger.warning(
                "%s: the MLM decoder is not tied to the word embeddings; using the embeddings",
                source,
            )

    encoder_missing = [m for m in missing if _is_encoder(m, model)]
    if encoder_missing:
        raise ValueError(
            f"{source}: the checkpoint lacks {len(encoder_missing)} encoder tensors needed by "
            f"{type(model).__name__}, e.g. {encoder_missing[:5]}"
        )
    if strict and (missing or unexpected or mismatched):
        raise ValueError(
            f"{source}: strict load failed: missing {missing}, unexpected {unexpected}, "
            f"mismatched {mismatched}"
        )
    with torch.no_grad():
        for name, tensor in loadable.items():
            expected[name].copy_(tensor)
    _initialize(model, missing + mismatched, loadable, new_weights)
    model.tie_weights()
    _report(model, source, missing, mismatched, unexpected)
    return {"missing": missing, "unexpected": unexpected, "mismatched": mismatched}


def _matching(
    model: PreTrainedModule,
    state: dict[str, torch.Tensor],
    expected: dict[str, torch.Tensor],
    source: str,
    ignore_mismatched_sizes: bool,
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The tensors of `state` the model has, of its shapes; the names of those of another
    shape (an error naming it and both shapes, unless `ignore_mismatched_sizes`)."""
    mismatched, loadable = [], {}
    for name, tensor in state.items():
        if name not in expected:
            continue
        if tuple(tensor.shape) != tuple(expected[name].shape):
            if not ignore_mismatched_sizes:
                raise ValueError(
                    f"{source}: tensor {name!r} has shape {tuple(tensor.shape)} in the checkpoint "
                    f"but {tuple(expected[name].shape)} in {type(model).__name__} "
                    f"(config: {_shape_hint(name)}); pass ignore_mismatched_sizes=True to "
                    "re-initialise it"
                )
            mismatched.append(name)
            continue
        loadable[name] = tensor
    return loadable, mismatched


def _report(
    model: PreTrainedModule,
    source: str,
    missing: list[str],
    mismatched: list[str],
    unexpected: list[str],
) -> None:
    """What a load did not match, said once: newly drawn and re-initialised tensors as warnings,
    unused head tensors at INFO, other unexpected ones as warnings."""
    if missing:
        logger.warning(
            "%s: %s tensors not in the checkpoint were newly initialised: %s",
            source,
            type(model).__name__,
            missing,
        )
    if mismatched:
        logger.warning("%s: re-initialised tensors of another shape: %s", source, mismatched)
    # heads and the pooler (which a masked LM, like transformers' BertForMaskedLM, has not)
    unused = ("cls.", "classifier.", "qa_outputs.", "bert.pooler.", "pooler.")
    heads = [u for u in unexpected if u.startswith(unused)]
    others = [u for u in unexpected if u not in heads]
    if heads:
        logger.info("%s: tensors not used by %s: %s", source, type(model).__name__, heads)
    if others:
        logger.warning("%s: unexpected tensors ignored: %s", source, others)


@torch.no_grad()
def _initialize(
    model: PreTrainedModule, names: list[str], loadable: dict[str, torch.Tensor], weights: str
) -> None:
    """Give the tensors a checkpoint lacked their fresh initialisation (`from_pretrained` builds
    the model without one), keeping what was loaded into the same modules."""
    by_module: dict[str, list[str]] = {}
    for name in names:
        module_name, _, attribute = name.rpartition(".")
        by_module.setdefault(module_name, []).append(attribute)
    for module_name, attributes in by_module.items():
        module = model.get_submodule(module_name)
        model.init_module(module, weights)
        if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm)):
            for attribute in attributes:  # a bare parameter, e.g. the MLM output bias
                getattr(module, attribute).zero_()
        for attribute, parameter in module.named_parameters(recurse=False):
            full_name = f"{module_name}.{attribute}" if module_name else attribute
            if full_name in loadable:
                parameter.copy_(loadable[full_name])


def _is_encoder(name: str, model: PreTrainedModule) -> bool:
    prefix = f"{model.base_model_prefix}." if model.base_model_prefix else ""
    # The pooler is left out: checkpoints saved without one (BertForMaskedLM) are common.
    return name.startswith((prefix + "embeddings.", prefix + "embeddings_project.",
                            prefix + "encoder."))  # fmt: skip


def _shape_hint(name: str) -> str:
    if "word_embeddings" in name or name.endswith("predictions.bias"):
        return "vocab_size"
    if "position_embeddings" in name:
        return "max_position_embeddings"
    if "token_type_embeddings" in name:
        return "type_vocab_size"
    if name.startswith("classifier"):
        return "number of labels"
    if "intermediate" in name or "output.dense" in name:
        return "hidden_size / intermediate_size"
    return "hidden_size"


def load_pretrained(
    cls: Any,
    path: str | os.PathLike,
    *,
    config: BertConfig | None = None,
    num_labels: int | None = None,
    strict: bool = False,
    ignore_mismatched_sizes: bool = False,
    verify: bool = True,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    new_weights: str = "normal",
) -> PreTrainedModule:
    """Build `cls` from a checkpoint directory, Hugging Face or Google layout (auto-detected).

    `config` replaces the directory's; `num_labels` sets the classification head's size (e.g.
    a fresh classifier on a pre-trained encoder). `new_weights`: how the tensors the checkpoint
    lacks are drawn, "normal" (N(0, initializer_range), as transformers draws a new head) or
    "truncated-normal" (Google's run_classifier.py: cut at 2 std; a model built from a config
    is initialised so throughout). `verify` checks Google checkpoints' CRCs.
    `path` may be a Hub name (`bertkit.core.hub.model_dir`).
    """
    path = model_dir(path)
    fmt = detect_checkpoint_format(path)
    if config is None:
        config = read_config(path)
    state = read_state_dict(path, verify=verify)
    if num_labels is None and config.id2label is None:
        num_labels = _labels_in(state)  # Google's configs never name the labels
    if num_labels is not None and num_labels != config.num_labels:
        config = config.with_labels(num_labels)
    # Built without initialising (meta device, then uninitialised memory): the checkpoint
    # overwrites nearly every tensor, and load_state_dict_into initialises the rest.
    with torch.device("meta"):
        model = cls(config)
    model = model.to_empty(device="cpu")
    model.tie_weights()  # to_empty makes separate tensors of tied ones
    # what did not match ({"missing", "unexpected", "mismatched"}), for callers that need a
    # head the checkpoint may lack (fill-mask refuses a model whose MLM head would be random)
    model.load_report = load_state_dict_into(
        model,
        state,
        source=str(path),
        strict=strict,
        ignore_mismatched_sizes=ignore_mismatched_sizes,
        new_weights=new_weights,
    )
    logger.info("loaded %s from %s (%s layout)", cls.__name__, path, fmt)
    model.source_dir = str(path)
    if dtype is not None or device is not None:
        model.to(device=device, dtype=dtype)
    model.eval()
    return model


# ---------------------------------------------------------------------------- saving
def state_dict_for_saving(model: PreTrainedModule) -> dict[str, torch.Tensor]:
    """The model's tensors under its family's names, tied copies dropped (safetensors refuses
    shared storage)."""
    state = model.state_dict()
    state.pop(TIED_DECODER, None)
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    return _as_family_names(state, family_of(model.config.model_type))


def save_pretrained(
    model: PreTrainedModule,
    directory: str | os.PathLike,
    *,
    tokenizer: Any = None,
    safe_serialization: bool = True,
) -> None:
    """Write `config.json`, `model.safetensors` (or `pytorch_model.bin`) and `vocab.txt`.

    Each file is written to a temporary name and renamed into place. The vocabulary comes from
    `tokenizer` when given, else it is copied from the directory the model was loaded from.
    Hugging Face transformers loads the result with the class of the same name.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = state_dict_for_saving(model)
    if safe_serialization:
        from safetensors.torch import save_file

        with atomic_path(directory / SAFETENSORS) as tmp:
            save_file(state, str(tmp), metadata={"format": "pt"})
        stale = directory / PYTORCH_BIN
    else:
        with atomic_path(directory / PYTORCH_BIN) as tmp:
            torch.save(state, tmp)
        stale = directory / SAFETENSORS
    stale.unlink(missing_ok=True)  # never leave two disagreeing weight files
    family = family_of(model.config.model_type)
    model.config.to_json_file(
        directory / HF_CONFIG, architectures=[family.class_name(type(model).__name__)]
    )
    _write_vocab(model, directory, tokenizer)


def _write_vocab(model: PreTrainedModule, directory: Path, tokenizer: Any) -> None:
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
        return
    source_dir = getattr(model, "source_dir", None)  # set by from_pretrained
    source = Path(source_dir) if source_dir else None
    if source is None or source.resolve() == directory.resolve():
        return
    for name in ("vocab.txt", "tokenizer_config.json"):
        if (source / name).exists():
            with atomic_path(directory / name) as tmp:
                shutil.copyfile(source / name, tmp)


# ---------------------------------------------------------------------------- conversion
def convert(
    src: str | os.PathLike, dst: str | os.PathLike, *, to: str = "hf", overwrite: bool = False
) -> Path:
    """Convert a checkpoint directory to the Hugging Face (`to="hf"`) or Google (`"google"`)
    layout, keeping every head it has. The vocabulary and tokenizer settings are copied.
    A non-empty `dst` is refused unless `overwrite`, which first removes the weights and configs
    of both layouts there (a stale `model.safetensors` beside new Google files would be what
    `from_pretrained` loads)."""
    src, dst = model_dir(src), Path(dst)
    if to not in ("hf", "google"):
        raise ValueError(f"unknown target format {to!r}; expected 'hf' or 'google'")
    if dst.is_dir() and any(dst.iterdir()) and dst.resolve() != src.resolve():
        if not overwrite:
            raise FileExistsError(
                f"{dst}: not empty; pass overwrite=True (--overwrite) to replace the "
                "checkpoint it holds, or pick another folder"
            )
        stale = [SAFETENSORS, SAFETENSORS_INDEX, PYTORCH_BIN, HF_CONFIG, GOOGLE_CONFIG]
        for path in [*(dst / n for n in stale), *dst.glob(f"{GOOGLE_PREFIX}.*")]:
            path.unlink(missing_ok=True)
    config = read_config(src)
    state = read_state_dict(src)
    labels = _labels_in(state)
    if labels is not None and config.id2label is None and labels != config.num_labels:
        config = config.with_labels(labels)
    dst.mkdir(parents=True, exist_ok=True)
    if to == "hf":
        from safetensors.torch import save_file

        state.pop(TIED_DECODER, None)
        state = {k: v.contiguous() for k, v in state.items()}
        with atomic_path(dst / SAFETENSORS) as tmp:
            save_file(state, str(tmp), metadata={"format": "pt"})
        config.to_json_file(dst / HF_CONFIG, architectures=[_architecture(state)])
    elif to == "google":
        arrays = {}
        for name, tensor in state.items():
            if name == TIED_DECODER:
                continue
            if not name.startswith(("bert.", "cls.", "classifier.", "qa_outputs.")):
                name = f"bert.{name}"
            tf_name, transpose = hf_to_tf_name(name)
            tensor = tensor.float() if tensor.dtype == torch.bfloat16 else tensor
            array = tensor.t().contiguous().numpy() if transpose else tensor.numpy()
            arrays[tf_name] = array
        write_bundle(dst / GOOGLE_PREFIX, arrays)
        atomic_write_text(
            dst / GOOGLE_CONFIG, json.dumps(config.to_dict("google"), indent=2) + "\n"
        )
    else:
        raise ValueError(f"unknown target format {to!r}; expected 'hf' or 'google'")
    for name in ("vocab.txt", "tokenizer_config.json", TASK_FILE):  # (a task model's)
        if (src / name).exists() and src.resolve() != dst.resolve():
            shutil.copyfile(src / name, dst / name)
    return dst


def _labels_in(state: dict[str, torch.Tensor]) -> int | None:
    classifier = state.get("classifier.weight", state.get("classifier.out_proj.weight"))
    return None if classifier is None or classifier.shape[0] == 1 else int(classifier.shape[0])


def _architecture(state: dict[str, torch.Tensor]) -> str:
    if "cls.seq_relationship.weight" in state:
        return "BertForPreTraining"
    if "cls.predictions.bias" in state:
        return "BertForMaskedLM"
    if "qa_outputs.weight" in state:
        return "BertForQuestionAnswering"
    if "classifier.weight" in state:
        return "BertForSequenceClassification"
    return "BertModel"
