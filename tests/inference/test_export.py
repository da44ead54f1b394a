"""ONNX export and the onnx backend of Predictor (issue 12): the exported graph answers like
bertkit at every position, for every head, at shapes other than the traced one."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit import Predictor
from bertkit.cli import main
from bertkit.core.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertkit.core.model import BertModel
from bertkit.core.tokenizer import BertTokenizer
from bertkit.inference.export import export_onnx
from bertkit.inference.loader import OnnxModel

from helpers import tiny_bert_config


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.mark.parametrize(
    "head",
    [
        BertForSequenceClassification,
        BertForTokenClassification,
        BertForQuestionAnswering,
        BertForMultipleChoice,
        BertModel,
    ],
)
def test_export_answers_like_bertkit_at_other_shapes(head, tokenizer, tmp_path):
    config = tiny_bert_config(tokenizer.vocab_size)
    if head in (BertForSequenceClassification, BertForTokenClassification):
        config = config.with_labels(3)
    torch.manual_seed(0)
    model = head(config).eval()
    model.save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    export_onnx(tmp_path / "model", tmp_path / "onnx")
    session = OnnxModel(tmp_path / "onnx")
    shape = (3, 2, 40) if head is BertForMultipleChoice else (3, 40)  # traced at (2, [2,] 16)
    ids = torch.randint(5, 1000, shape)
    mask = torch.ones_like(ids)
    mask[..., 30:] = 0
    mask[0, ..., 10:] = 0
    segments = torch.zeros_like(ids)
    segments[..., 20:] = 1
    with torch.no_grad():
        reference = model(input_ids=ids, token_type_ids=segments, attention_mask=mask)
    answer = session(input_ids=ids, token_type_ids=segments, attention_mask=mask)
    assert session.names, "no outputs"
    for name in session.names:
        expected, got = getattr(reference, name), getattr(answer, name)
        assert got.shape == expected.shape, name
        assert torch.allclose(got, expected, atol=1e-4), (name, (got - expected).abs().max())


def test_exported_graph_has_3d_dense_layers_one_mask_and_a_constant_scale(tokenizer, tmp_path):
    """The graph's shape is what ONNX Runtime runs fastest (issue 12 §2, measured against
    transformers' export): dense layers as 3-D MatMul (2-D rows export as Gemm, slower
    there: docs/results/README.md), the attention scale a constant (no Sqrt on q and k), and one additive mask for all
    layers (a Boolean one costs two Where and an IsNaN over the scores in every layer)."""
    import onnx

    config = tiny_bert_config(tokenizer.vocab_size)
    BertModel(config).save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    export_onnx(tmp_path / "model", tmp_path / "onnx")
    ops: dict[str, int] = {}
    for node in onnx.load(str(tmp_path / "onnx" / "model.onnx")).graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    layers = config.num_hidden_layers
    assert ops["MatMul"] == 8 * layers, ops  # q, k, v, output, 2 feed-forward, 2 in attention
    assert ops.get("Gemm", 0) == 1, ops  # the pooler, on (B, H)
    assert ops.get("Sqrt", 0) == 0 and ops.get("IsNaN", 0) == 0, ops
    assert ops.get("Where", 0) <= 1, ops


def test_predictor_onnx_backend_and_int8(tokenizer, tmp_path, capsys):
    config = tiny_bert_config(tokenizer.vocab_size).with_labels(2)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    source = tmp_path / "mrpc"
    model.save_pretrained(source, tokenizer=tokenizer)
    (source / "bertkit_task.json").write_text(
        json.dumps({"task": "mrpc", "head": "BertForSequenceClassification"})
    )
    pairs = [("The cat sat on the mat.", "A cat was sitting on a mat."), ("Yes.", "No, never.")]
    torch_answers = Predictor(source)(pairs)
    assert main(["export", "--onnx", str(source), str(tmp_path / "fp32")]) == 0
    onnx_answers = Predictor(tmp_path / "fp32", backend="onnx")(pairs)
    for a, b in zip(torch_answers, onnx_answers, strict=True):
        assert a["label"] == b["label"]
        assert a["score"] == pytest.approx(b["score"], abs=1e-5)
    assert (
        main(["export", "--onnx", str(source), str(tmp_path / "int8"), "--quantize", "int8"]) == 0
    )
    assert json.loads((tmp_path / "int8" / "onnx.json").read_text())["quantize"] == "int8"
    int8 = (tmp_path / "int8" / "model.onnx").stat().st_size
    assert int8 < 0.6 * (tmp_path / "fp32" / "model.onnx").stat().st_size
    quantized = Predictor(tmp_path / "int8", backend="onnx")(pairs)
    for a, b in zip(torch_answers, quantized, strict=True):  # int8: close, not equal
        assert a["score"] == pytest.approx(b["score"], abs=0.05)
    capsys.readouterr()
    args = ["predict", "--model", str(tmp_path / "fp32"), "--backend", "onnx", *pairs[0]]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["label"] == onnx_answers[0]["label"]
    assert main(["export", "--onnx", str(source), str(tmp_path / "fp32")]) == 2  # not empty
    # the model as every command takes it (--model, --out; --onnx the default): the same model
    assert main(["export", "--model", str(source), "--out", str(tmp_path / "flags")]) == 0
    assert Predictor(tmp_path / "flags", backend="onnx")(pairs) == onnx_answers
    capsys.readouterr()
    assert main(["export", str(source), str(tmp_path / "x"), "--out", "y"]) == 2
    assert "give one output folder" in capsys.readouterr().err
    assert (
        main(["export", "--model", str(source), str(tmp_path / "other"), str(tmp_path / "y")]) == 2
    )
    assert "two models given" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="no ONNX model"):
        Predictor(source, backend="onnx")
