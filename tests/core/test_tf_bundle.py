"""Google's TF checkpoint bundles read and written without TensorFlow (bertkit.core.tf_bundle)."""

import shutil

import pytest
import torch

from bertkit import (
    BertForPreTraining,
)
from bertkit.core.checkpoint import read_state_dict
from bertkit.core.tf_bundle import read_bundle


def test_bundle_reader_skips_optimizer_slots(google_tiny):
    everything = read_bundle(google_tiny / "bert_model.ckpt")
    assert "global_step" in everything
    assert any(name.endswith("/adam_m") for name in everything)
    weights = read_state_dict(google_tiny)
    assert not any("adam" in name or "global_step" in name for name in weights)
    assert weights["bert.encoder.layer.0.attention.self.query.weight"].shape == (64, 64)
    kernel = everything["bert/encoder/layer_0/intermediate/dense/kernel"]
    assert kernel.shape == (64, 256)  # TF stores (in, out); ours is (out, in)
    torch.testing.assert_close(
        weights["bert.encoder.layer.0.intermediate.dense.weight"], torch.from_numpy(kernel).t()
    )


def test_truncated_and_corrupt_google_checkpoints(google_tiny, tmp_path):
    broken = tmp_path / "tf"
    shutil.copytree(google_tiny, broken)
    data_file = broken / "bert_model.ckpt.data-00000-of-00001"
    data = bytearray(data_file.read_bytes())
    data_file.write_bytes(bytes(data[: len(data) - 1000]))
    with pytest.raises(ValueError, match=r"data-00000-of-00001: truncated: variable"):
        BertForPreTraining.from_pretrained(broken)
    embeddings = read_bundle(google_tiny / "bert_model.ckpt")["bert/embeddings/word_embeddings"]
    at = bytes(data).find(embeddings.tobytes()[:256])
    assert at >= 0
    data[at + 5000] ^= 0xFF  # one flipped bit pattern inside the word embeddings
    data_file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"corrupt: checksum mismatch for variable"):
        BertForPreTraining.from_pretrained(broken)
    shutil.copy(google_tiny / "bert_model.ckpt.data-00000-of-00001", data_file)
    index = broken / "bert_model.ckpt.index"
    raw = bytearray(index.read_bytes())
    raw[100] ^= 0xFF
    index.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"bert_model.ckpt.index: corrupt \(checksum mismatch"):
        BertForPreTraining.from_pretrained(broken)
    index.write_bytes(bytes(raw[:20]))
    with pytest.raises(ValueError, match="bert_model.ckpt.index: truncated"):
        BertForPreTraining.from_pretrained(broken)
