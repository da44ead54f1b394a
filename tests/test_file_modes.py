"""Files others can read (issue 27 §5): every writer bertkit uses — JSON and text, safetensors,
torch.save, the shards' raw arrays, ONNX (fp32 and int8), PNG — leaves files with the umask's
mode (0644 under 022, 0600 under 077), whatever mode the library sets itself, and a finished
run leaves no temporary file behind."""

from __future__ import annotations

import os
import stat

import pytest

from bertkit.cli import main
from bertkit.core.heads import BertForSequenceClassification

from helpers import synthetic_tokenizer, tiny_bert_config, tiny_cli_args


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_writer_honours_the_umask_and_leaves_no_temporary_file(umask, tmp_path, setup,
                                                                     ort):  # fmt: skip
    tokenizer = synthetic_tokenizer()
    corpus = tmp_path / "corpus.txt"
    previous = os.umask(umask)
    try:
        tokenizer.save_pretrained(tmp_path / "vocab")
        words = list(tokenizer.vocab)[10:60]
        corpus.write_text("\n\n".join(" ".join(words[i : i + 12]) + " ." for i in range(30)))
        assert main(["prepare", str(corpus), "--vocab", str(tmp_path / "vocab"), "--out",
                     str(tmp_path / "shards"), "--workers", "1"]) == 0  # fmt: skip
        run = tmp_path / "pretrain"  # torch.save (state), safetensors, JSON lines, PNG
        assert main(["pretrain", *map(str, tiny_cli_args(setup, run, steps=3, save_every=2))]) == 0
        model = BertForSequenceClassification(tiny_bert_config(tokenizer.vocab_size).with_labels(2))
        model.save_pretrained(tmp_path / "bin", tokenizer=tokenizer, safe_serialization=False)
        model.save_pretrained(tmp_path / "clf", tokenizer=tokenizer)
        for name, extra in (("onnx", []), ("int8", ["--quantize", "int8"])):
            assert main(["export", "--onnx", str(tmp_path / "clf"), str(tmp_path / name),
                         *extra]) == 0  # fmt: skip
        texts = tmp_path / "texts.txt"
        texts.write_text(" ".join(words[:8]) + "\n" + " ".join(words[8:20]) + "\n")
        assert main(["extract", "--model", str(tmp_path / "clf"), "--input", str(texts),
                     "--out", str(tmp_path / "features.safetensors")]) == 0  # fmt: skip
    finally:
        os.umask(previous)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    written = {p.relative_to(tmp_path).as_posix() for p in files}
    for expected in ("shards/meta.json", "pretrain/trainer_state.pt", "pretrain/log.jsonl",
                     "pretrain/model.safetensors", "bin/pytorch_model.bin", "onnx/model.onnx",
                     "int8/model.onnx", "int8/onnx.json", "features.safetensors"):  # fmt: skip
        assert expected in written, f"{expected} not written: {sorted(written)}"
    wrong = {p.relative_to(tmp_path).as_posix(): oct(stat.S_IMODE(p.stat().st_mode))
             for p in files if stat.S_IMODE(p.stat().st_mode) != 0o666 & ~umask}  # fmt: skip
    assert not wrong, f"modes other than {oct(0o666 & ~umask)}: {wrong}"
    temporary = [name for name in written if name.endswith(".tmp") or ".fp32." in name
                 or "/.model" in name or name.rsplit("/", 1)[-1].startswith("tmp")]  # fmt: skip
    assert not temporary, temporary
