"""Fill-mask (bertkit.inference.fill_mask) against transformers' pipeline; the command."""

from __future__ import annotations

import json

import pytest

from bertkit.cli import main
from bertkit.inference.fill_mask import FillMask

TEXTS = ["The capital of France is [MASK].", "[MASK] went to the [MASK] on monday ."]


def test_fill_mask_matches_transformers_pipeline(mlm_dir):
    transformers = pytest.importorskip("transformers")
    pipe = transformers.pipeline("fill-mask", model=str(mlm_dir), top_k=5, device="cpu")
    ours = FillMask(mlm_dir)(TEXTS, top=5)
    assert [len(masks) for masks in ours] == [1, 2]
    for text, masks in zip(TEXTS, ours, strict=True):
        theirs = pipe(text)
        theirs = [theirs] if isinstance(theirs[0], dict) else theirs  # one [MASK]: not nested
        for mine, reference in zip(masks, theirs, strict=True):
            assert mine["ids"] == [r["token"] for r in reference]
            assert mine["tokens"] == pipe.tokenizer.convert_ids_to_tokens(mine["ids"])
            assert mine["probabilities"] == pytest.approx([r["score"] for r in reference], abs=1e-5)
            assert mine["probabilities"] == sorted(mine["probabilities"], reverse=True)
    # batches of one give what a batch of two gives (padding does not leak into a prediction)
    single = FillMask(mlm_dir, batch_size=1)(TEXTS, top=5)
    for a, b in zip(single, ours, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x["ids"] == y["ids"]
            assert x["probabilities"] == pytest.approx(y["probabilities"], abs=1e-6)


def test_fill_mask_refuses_what_it_cannot_answer(mlm_dir, minilm_dir):
    with pytest.raises(ValueError, match="no masked-LM head"):
        FillMask(minilm_dir)
    fill = FillMask(mlm_dir)
    with pytest.raises(ValueError, match=r"text 1: no \[MASK\]"):
        fill(["a [MASK] here", "none here"])
    with pytest.raises(ValueError, match="text 0: 7[0-9] pieces, more than the model's 64"):
        fill(["[MASK] " + "word " * 70])
    with pytest.raises(ValueError, match="top must be at least 1"):
        fill("[MASK]", top=0)
    pairs = fill([("the [MASK] sat", "on the mat"), "a [MASK]"], top=2)
    assert [len(p) for p in pairs] == [1, 1] and pairs[0][0]["position"] == 2


def test_fill_mask_command_reads_and_writes_json_lines(mlm_dir, tmp_path, capsys):
    lines = tmp_path / "in.jsonl"
    lines.write_text('"a [MASK] here"\n\n{"text": "the [MASK]", "text_pair": "b"}\n')
    assert main(["fill-mask", "--model", str(mlm_dir), "--input", str(lines), "--top", "3"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["text"] for p in printed] == ["a [MASK] here", "the [MASK]"]
    assert printed[1]["text_pair"] == "b" and len(printed[0]["masks"][0]["tokens"]) == 3
    lines.write_text('"a [MASK]"\n{broken\n')
    assert main(["fill-mask", "--model", str(mlm_dir), "--input", str(lines)]) == 2
    assert f"{lines}:2: not JSON" in capsys.readouterr().err


def test_the_head_is_found_from_tensor_names_without_loading(mlm_dir, minilm_dir, caplog):
    from bertkit.core.checkpoint import tensor_names
    from bertkit.inference.fill_mask import MLM_HEAD_TENSOR, has_mlm_head

    assert has_mlm_head(mlm_dir) and not has_mlm_head(minilm_dir)
    assert MLM_HEAD_TENSOR in tensor_names(mlm_dir)
    with caplog.at_level("WARNING"), pytest.raises(ValueError, match="no masked-LM head"):
        FillMask(minilm_dir)
    assert "newly initialised" not in caplog.text  # refused before any weight was loaded
