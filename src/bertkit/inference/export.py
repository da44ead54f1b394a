"""ONNX: export any bertkit checkpoint (a fine-tuned task model or a bare encoder) to ONNX,
optionally with int8 dynamic quantisation of its linear layers, and run it on CPU with ONNX
Runtime where `Predictor` would run PyTorch (`bertkit serve --backend onnx` serves it).

    bertkit export --onnx runs/mrpc runs/mrpc-onnx [--quantize int8]
    bertkit predict --model runs/mrpc-onnx --backend onnx "A sentence." "Its pair."
    Predictor("runs/mrpc-onnx", backend="onnx")([("A sentence.", "Its pair.")])

The export folder is a complete checkpoint folder for `Predictor`: `model.onnx` plus the source's
`config.json`, `vocab.txt`, `tokenizer_config.json`, its task record and `onnx.json` (what
was exported: head, outputs, opset, quantisation). The graph takes `input_ids`,
`token_type_ids` and `attention_mask` of any batch size and length (multiple choice: (batch,
choices, length)) and returns the head's outputs (`logits`, or `start_logits`/`end_logits`; a
bare encoder: `last_hidden_state`, `pooler_output`). It is traced on the padded path, so its
outputs equal bertkit's at every position (within 1e-4, tested). `onnxruntime` is an optional
extra (`pip install onnxruntime`; `onnx` too for `--quantize`), never a core dependency.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import torch

from bertkit._io import TASK_FILE, atomic_write_text
from bertkit.core.embedding import POOLING_DIR
from bertkit.inference.loader import ONNX_FILE, ONNX_INFO, load
from bertkit.settings import QUANTIZATIONS

INPUTS = ("input_ids", "token_type_ids", "attention_mask")
# (the tokenizer as the folder ships it: vocab.txt, or a family's tokenizer.json)
# and how its texts are read (a sentence-transformers folder's length, pooling, normalisation),
# so the export embeds as its source does
_COPIED = ("config.json", "vocab.txt", "tokenizer_config.json", "tokenizer.json",
           "special_tokens_map.json", TASK_FILE, "sentence_bert_config.json", "modules.json",
           f"{POOLING_DIR}/config.json")  # fmt: skip


def _outputs(head: str, model: torch.nn.Module) -> tuple[str, ...]:
    if head in ("BertForQuestionAnswering", "BertBiLSTMForQuestionAnswering"):
        return ("start_logits", "end_logits")
    if head == "BertModel":  # (a family without a pooler: DistilBERT, ELECTRA)
        pooled = getattr(model, "pooler", None) is not None
        return ("last_hidden_state", "pooler_output") if pooled else ("last_hidden_state",)
    if head in ("BertForPreTraining",):
        return ("mlm_logits", "nsp_logits")
    return ("logits",)


class _Traced(torch.nn.Module):
    """The head with positional inputs and a tuple of tensors out, as the exporter wants."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.model(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        )
        return tuple(getattr(out, name) for name in self.names)


def export_onnx(
    model: str | os.PathLike,
    out: str | os.PathLike,
    *,
    quantize: str | None = None,
    opset: int = 17,
    overwrite: bool = False,
) -> Path:
    """Write `out/model.onnx` (fp32, or int8 with `quantize="int8"`) and the files `Predictor`
    needs beside it. Returns the ONNX file's path."""
    from bertkit.core.hub import model_dir
    from bertkit.core.model import BertPreTrainedModel

    model, out = model_dir(model), Path(out)
    if quantize not in (None, *QUANTIZATIONS):
        raise ValueError(f"quantize must be {', '.join(QUANTIZATIONS)} or None, not {quantize!r}")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out}: not empty; pass --overwrite or pick another folder")
    loaded = load(model, device="cpu")  # as its task record or config.json names its head
    head, net = loaded.head, loaded.model
    for module in net.modules():  # the head and its encoder
        if isinstance(module, BertPreTrainedModel):
            module.padded_only = True
    names = _outputs(head, net)
    choices = head == "BertForMultipleChoice"
    shape = (2, 2, 16) if choices else (2, 16)  # traced at this size; every axis is dynamic
    example = (
        torch.randint(5, net.config.vocab_size, shape),
        torch.zeros(shape, dtype=torch.long),
        torch.ones(shape, dtype=torch.long),
    )
    example[2][..., -3:] = 0  # some padding in the example, so nothing assumes there is none
    axes = {0: "batch", 1: "choices", 2: "length"} if choices else {0: "batch", 1: "length"}
    out.mkdir(parents=True, exist_ok=True)
    target = out / ONNX_FILE
    fp32 = out / ".model.fp32.onnx" if quantize else target
    with torch.no_grad(), warnings.catch_warnings():
        # the tracer notes every Python-side check on a tensor (shape and id validation): none
        # of them shapes the graph, so they are not worth a screenful
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript-based exporter
        torch.onnx.export(
            _Traced(net, names),
            example,
            str(fp32),
            input_names=list(INPUTS),
            output_names=list(names),
            dynamic_axes={**{name: axes for name in INPUTS}, **_output_axes(names, choices)},
            opset_version=opset,
            dynamo=False,
        )
    if quantize == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # One scale per output channel of each weight matrix, not one per matrix: on CoNLL-2003
        # NER (MiniLM) int8 then costs 0.08 F1 instead of 1.60, at the same speed (measured:
        # docs/results, "What int8 costs in dev score"). Weights in 7 bits (`reduce_range`,
        # which ONNX Runtime's documentation advises for CPUs without VNNI, where its int8
        # products can saturate): on an AMD EPYC Zen 3 (AVX2, no VNNI) a topic classifier's
        # probabilities moved 0.056 from PyTorch's with 8 bits, 0.0011 with 7
        # (tests/serve/test_serve.py), and MiniLM's MRPC dev F1/acc -0.28/-0.25 with 8, +0.51/+0.98
        # with 7.
        quantize_dynamic(
            str(fp32), str(target), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True
        )
        fp32.unlink()
    for name in _COPIED:
        if (model / name).exists():
            (out / name).parent.mkdir(exist_ok=True)
            shutil.copyfile(model / name, out / name)
    atomic_write_text(
        out / ONNX_INFO,
        json.dumps(
            {"source": str(model), "head": head, "outputs": list(names), "opset": opset,
             "quantize": quantize},
            indent=1,
        ),
    )  # fmt: skip
    return target


def _output_axes(names: tuple[str, ...], choices: bool) -> dict[str, dict[int, str]]:
    axes = {}
    for name in names:
        if name in ("pooler_output", "nsp_logits") or (name == "logits" and not choices):
            axes[name] = {0: "batch"}
        else:  # per position (and multiple choice's (batch, choices))
            axes[name] = {0: "batch", 1: "choices" if choices else "length"}
    return axes


def onnx_folder(model: str | os.PathLike, quantize: str | None = None) -> tuple[Path, Path | None]:
    """The folder of an ONNX model of `model` to run: its own export where it is one (refused
    where its quantisation is not `quantize`), else one exported now into a temporary folder —
    returned second, for the caller to remove when done (None: nothing to remove)."""
    import logging
    import tempfile

    path = Path(model)
    if (path / ONNX_FILE).exists():
        info = json.loads((path / ONNX_INFO).read_text()) if (path / ONNX_INFO).exists() else {}
        if quantize and info.get("quantize") != quantize:
            raise ValueError(f"{path / ONNX_FILE} is not {quantize} (it was exported with "
                             f"quantize={info.get('quantize')}); use the checkpoint it came "
                             "from instead")  # fmt: skip
        return path, None
    made = Path(tempfile.mkdtemp(prefix="bertkit-onnx-"))
    logging.getLogger(__name__).warning("exporting %s to ONNX%s", path,
                                        f" ({quantize})" if quantize else "")  # fmt: skip
    export_onnx(path, made, quantize=quantize, overwrite=True)
    return made, made
