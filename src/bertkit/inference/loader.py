"""Opening a model folder (or a Hub name) to use it: the one place that does.

    loaded = load("runs/mrpc", precision="auto")          # its own head, from its task record
    loaded.model, loaded.tokenizer, loaded.task, loaded.device, loaded.precision

Every user of a trained model (Predictor, FillMask, Embedder, the insight pictures, extract,
evaluate, export, serve) opens it here, as text-embeddings-inference loads its model once behind
all its routes. What a folder says of itself is read once: its task record (`TASK_FILE`: the
task, its head, what it learnt and the reading settings of the user's files), else the head its
`config.json` names; the weights' digest is checked as they load (`checkpoint.load_pretrained`).
The device left out is `_device.default_device`'s; the precision is `precision.resolve_precision`'s
(`auto`: bf16 autocast where the hardware runs it natively), and under bf16 the linear layers'
weights are cast once (`cast_for_inference`). `backend="onnx"` opens the folder's `model.onnx`
(`bertkit export --onnx`) with ONNX Runtime instead.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from bertkit._device import default_device, fit_threads
from bertkit._io import TASK_FILE
from bertkit.core.checkpoint import HF_CONFIG, read_config
from bertkit.core.config import BertConfig
from bertkit.core.embedding import declared_length
from bertkit.core.family import family_of_folder
from bertkit.core.heads import MODEL_CLASSES
from bertkit.core.hub import model_dir
from bertkit.core.tokenizer import BertTokenizer
from bertkit.precision import (
    Precision,
    cast_for_inference,
    compile_for_inference,
    inference_compile,
    resolve_precision,
)
from bertkit.rows import FileConfig
from bertkit.tasks.base import Task, read_task_info
from bertkit.tasks.own import OwnTask
from bertkit.tasks.saved import saved_head, task_of_folder

ONNX_FILE = "model.onnx"
ONNX_INFO = "onnx.json"


def head_of(path: Path, info: dict[str, Any]) -> str:
    """The head a folder is used with: its task record's, else the first of `config.json`'s
    "architectures" that bertkit has (what save_pretrained and transformers write), else the
    bare encoder."""
    if "head" in info:
        return str(info["head"])
    config_file = path / HF_CONFIG
    written = json.loads(config_file.read_text()) if config_file.exists() else {}
    architectures = written.get("architectures") or ["BertModel"]
    name = family_of_folder(path).bert_class(
        architectures[0]
    )  # (RobertaForSequenceClassification: ours)
    return name if name in MODEL_CLASSES else "BertModel"


@dataclass
class Loaded:
    """A model ready to run: `model` (a torch head on `device`, in eval mode and cast for
    `precision`, maybe compiled; or an ONNX Runtime session), and what its folder says."""

    path: Path
    model: Any
    config: BertConfig
    head: str
    device: torch.device
    precision: Precision
    task: Task | None = None  # a fine-tuned folder's task, with what it learnt
    info: dict[str, Any] = field(default_factory=dict)  # its task record as saved
    # the encoder that embeds (a head's `.bert`, else the model), compiled where `load`
    # compiled the encoder alone
    encoder: Any = None

    @functools.cached_property
    def tokenizer(self) -> BertTokenizer:
        """The tokenizer the folder ships (WordPiece, or its tokenizer.json), checked against
        the model (`BertTokenizer.check_model`)."""
        tokenizer = BertTokenizer.from_pretrained(self.path)
        tokenizer.check_model(self.config, self.path)
        return tokenizer

    @property
    def max_seq_length(self) -> int | None:
        """The length its texts were cut at in fine-tuning; None for a model without a task."""
        if self.task is None:
            return None
        return int(self.info.get("max_seq_length", self.task.default_max_seq_length))

    def reading(self, given: FileConfig | None = None) -> FileConfig:
        """How this model reads a file: the reading settings saved with it (your own data's
        format, header-less columns, encoding, separators), each setting `given` (not None) in
        place of its saved value (`columns=""`: the file's first line names its columns)."""
        saved = self.task.data.reading if isinstance(self.task, OwnTask) else FileConfig()
        return (given or FileConfig()).over(saved)


def reading_length(loaded: Loaded, given: int | None = None) -> int:
    """Where a model's texts are cut, in pieces with the special tokens: `given`, else the
    folder's declared length, else the tokenizer's `model_max_length` — never past the
    positions (sentence-transformers' rule: all-MiniLM-L6-v2 declares 256; a plain BERT
    folder reads 512).

    >>> reading_length(load("bert-tiny-folder"))   # doctest: +SKIP
    512
    """
    positions = loaded.config.max_length
    longest = min(loaded.tokenizer.model_max_length, positions)
    return min(given or declared_length(loaded.path) or longest, positions)


def task_of_checkpoint(model: str | os.PathLike, name: str | None = None,
                       **options: Any) -> tuple[Task, dict]:  # fmt: skip
    """The task a fine-tuned checkpoint answers (its own, or `name`), with what it learnt and
    tuned (labels, thresholds), and the checkpoint's task info. A folder transformers or
    sentence-transformers saved (no task record) answers the task its head names
    (`tasks.saved.task_of_folder`, given `options`)."""
    from bertkit.tasks import get_task

    folder = model_dir(model)
    if name is None and folder.is_dir() and not (folder / TASK_FILE).exists():
        if saved_head(folder) is not None:
            return task_of_folder(folder, **options)
    info = read_task_info(model)
    return get_task(name or info["task"]).with_settings(info), info


def load(
    model: str | os.PathLike,
    *,
    head: str | None = None,
    task: str | None = None,
    fine_tuned: bool = False,
    device: str | torch.device | None = None,
    precision: str = "fp32",
    backend: str = "torch",
    compile: str = "off",
    task_options: dict[str, Any] | None = None,
    compile_encoder_only: bool = False,
) -> Loaded:
    """`model` (a folder or a Hub name) opened to run. `head`: the class to load it as (default:
    the folder's own, `head_of`); `fine_tuned`: its task — its task record's, else the task
    head a folder transformers or sentence-transformers saved names (`tasks.saved`; with
    `task_options`: a tagger's aggregation, a reader's no-answer rule), else refused; `task`:
    read the record as this task's. `precision` auto|fp32|bf16|fp16, `backend` torch|onnx and
    `compile` off|on as `bertkit predict` takes them (checked before anything loads);
    `compile_encoder_only`: `compile` compiles the encoder (`Loaded.encoder`) and leaves the
    head eager (a masked LM that serves fill-mask eagerly and embeds compiled)."""
    compiled = inference_compile(compile, backend)
    fit_threads()
    path = model_dir(model)  # a folder, or a Hub name
    found: Task | None = None
    info: dict[str, Any] = {}
    if fine_tuned or task is not None or (head is None and (path / TASK_FILE).exists()):
        found, info = task_of_checkpoint(path, task, **(task_options or {}))
        info = {**info, "head": info.get("head", found.head)}
    name = head or head_of(path, info)
    chosen = torch.device("cpu") if backend == "onnx" else default_device(device)
    compute = resolve_precision(precision, chosen, backend=backend)
    if backend == "onnx":
        net: Any = OnnxModel(path)
        config = read_config(path)
    else:
        net = MODEL_CLASSES[name].from_pretrained(path).to(chosen).eval()
        config = net.config
        missing = net.load_report["missing"] if found is not None else []
        if missing:  # a task answered by a head drawn at random is no answer
            raise ValueError(
                f"{path}: its {name} lacks {len(missing)} trained head tensors, e.g. "
                f"{missing[:4]}: the folder holds no trained head of this kind"
            )
    encoder = getattr(net, "bert", net)
    if isinstance(net, torch.nn.Module):
        cast_for_inference(net, compute)
        if compiled and compile_encoder_only:
            encoder = compile_for_inference(encoder)
        elif compiled:
            net = encoder = compile_for_inference(net)
    loaded = Loaded(path, net, config, name, chosen, compute, found, info, encoder)
    if found is not None and "saved_by" in info:  # a saved head reads what its folder allows
        info["max_seq_length"] = min(reading_length(loaded), found.default_max_seq_length) \
            if found.head == "BertForQuestionAnswering" else reading_length(loaded)  # fmt: skip
    return loaded


class OnnxModel:
    """An ONNX Runtime session that answers like a bertkit head: `model(input_ids=…, …)` gives an
    object with the exported outputs as torch tensors. Threads: torch's count; the workers do
    not spin after a run (spinning threads slow whatever runs next on a small CPU)."""

    training = False

    def __init__(self, directory: str | os.PathLike, threads: int | None = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise ImportError(
                "the onnx backend needs onnxruntime: pip install onnxruntime"
            ) from None
        directory = Path(directory)
        path = directory / ONNX_FILE
        if not path.exists():
            raise FileNotFoundError(f"{path}: no ONNX model (make one: bertkit export --onnx)")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs()]
        # what the graph reads (an encoder without segments, DistilBERT's, has no token types)
        self.inputs = {i.name for i in self.session.get_inputs()}
        info = directory / ONNX_INFO
        self.info: dict[str, Any] = json.loads(info.read_text()) if info.exists() else {}

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None, **_: Any):
        feeds = {
            "input_ids": input_ids,
            "token_type_ids": torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids,
            "attention_mask": torch.ones_like(input_ids) if attention_mask is None else attention_mask,
        }  # fmt: skip
        arrays = {
            k: np.ascontiguousarray(v.cpu().numpy(), dtype=np.int64)
            for k, v in feeds.items()
            if k in self.inputs
        }
        values = self.session.run(self.names, arrays)
        return SimpleNamespace(
            **{n: torch.from_numpy(v) for n, v in zip(self.names, values, strict=True)}
        )

    # what run_outputs and Predictor call on a torch model
    def eval(self) -> OnnxModel:
        return self

    def train(self, mode: bool = True) -> OnnxModel:
        return self

    def to(self, *_: Any, **__: Any) -> OnnxModel:
        return self
