"""Checkpoints: Google's TF layout read without TensorFlow, Hugging Face layouts both ways,
real pretrained weights, and clear errors for broken files."""

import dataclasses
import json
import logging
import shutil

import numpy as np
import pytest
import torch

from bertkit import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
    BertTokenizer,
)
from bertkit.cli import main
from bertkit.core.checkpoint import convert, hf_to_tf_name, tf_to_hf_name
from bertkit.core.heads import MODEL_CLASSES
from bertkit.core.tf_bundle import read_bundle

# (the sentence-embedding model, a pooled encoder, round-trips in tests/tasks/
# test_sentence_embedding.py, where sentence-transformers reads what it writes)
ALL_CLASSES = [c for c in MODEL_CLASSES.values() if c.__name__ != "BertForSentenceEmbedding"]

# The + BiLSTM heads of the paper's Table 5 have no transformers counterpart.
HF_CLASSES = [c for c in ALL_CLASSES if "BiLSTM" not in c.__name__]


def reference_inputs(reference):
    return {
        k: torch.from_numpy(reference[k]).long()
        for k in ("input_ids", "token_type_ids", "attention_mask")
    }


def check_reference(model, reference, atol=1e-5):
    with torch.no_grad():
        out = model(**reference_inputs(reference), output_hidden_states=True)
        pooled = model.bert.pooler(out.hidden_states[-1])
    assert_reference(
        reference,
        atol,
        sequence_output=out.hidden_states[-1],
        pooled_output=pooled,
        mlm_logits=out.mlm_logits,
        nsp_logits=out.nsp_logits,
    )


def assert_reference(reference, atol=1e-5, **outputs):
    """Each output equals the reference array of its name (Google's TF outputs) within `atol`."""
    for name, got in outputs.items():
        np.testing.assert_allclose(got.numpy(), reference[name], atol=atol, rtol=0, err_msg=name)


# ----------------------------------------------------------------------------- Google TF
def test_google_tf_checkpoint_reproduces_reference_without_tensorflow(google_tiny):
    import sys

    assert "tensorflow" not in sys.modules
    reference = np.load(google_tiny / "reference.npz")
    model = BertForPreTraining.from_pretrained(google_tiny)
    check_reference(model, reference)
    assert "tensorflow" not in sys.modules
    # the encoder alone, from the same directory
    encoder = BertModel.from_pretrained(google_tiny)
    with torch.no_grad():
        out = encoder(**reference_inputs(reference))
    assert_reference(
        reference, sequence_output=out.last_hidden_state, pooled_output=out.pooler_output
    )


@pytest.mark.parametrize(
    "tf_name",
    [
        "bert/embeddings/word_embeddings",
        "bert/embeddings/LayerNorm/beta",
        "bert/encoder/layer_11/attention/output/dense/kernel",
        "bert/encoder/layer_0/output/LayerNorm/gamma",
        "bert/pooler/dense/bias",
        "cls/predictions/transform/dense/kernel",
        "cls/predictions/output_bias",
        "cls/seq_relationship/output_weights",
        "output_weights",
        "cls/squad/output_bias",
    ],
)
def test_name_table_round_trips(tf_name):
    hf_name, transpose = tf_to_hf_name(tf_name)
    assert hf_to_tf_name(hf_name) == (tf_name, transpose)
    assert tf_to_hf_name(tf_name + "/adam_m") is None


def test_convert_google_to_hf_loads_in_transformers(google_tiny, tmp_path, transformers):
    reference = np.load(google_tiny / "reference.npz")
    assert main(["convert", str(google_tiny), str(tmp_path / "hf")]) == 0
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json",
        "model.safetensors",
        "vocab.txt",
    ]
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        out = hf(**reference_inputs(reference))
    assert_reference(
        reference, mlm_logits=out.prediction_logits, nsp_logits=out.seq_relationship_logits
    )
    check_reference(BertForPreTraining.from_pretrained(tmp_path / "hf"), reference)


def test_convert_hf_to_google_and_back(google_tiny, tmp_path):
    reference = np.load(google_tiny / "reference.npz")
    convert(google_tiny, tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "tf"), "--to", "google"]) == 0
    assert (tmp_path / "tf" / "bert_config.json").exists()
    assert (tmp_path / "tf" / "bert_model.ckpt.index").exists()
    original = read_bundle(google_tiny / "bert_model.ckpt", skip=lambda n: tf_to_hf_name(n) is None)
    rewritten = read_bundle(tmp_path / "tf" / "bert_model.ckpt")
    assert sorted(original) == sorted(rewritten)
    for name, array in original.items():
        np.testing.assert_array_equal(rewritten[name], array, err_msg=name)
    check_reference(BertForPreTraining.from_pretrained(tmp_path / "tf"), reference)


def test_google_classifier_head_gets_its_label_count(tmp_path, tiny_config):
    config = tiny_config.with_labels(3)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "tf", to="google")
    assert "id2label" not in json.loads((tmp_path / "tf" / "bert_config.json").read_text())
    loaded = BertForSequenceClassification.from_pretrained(tmp_path / "tf")
    assert loaded.config.num_labels == 3
    ids = torch.randint(5, 99, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- HF layout
@pytest.mark.parametrize("cls", HF_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_save_load_round_trip_and_transformers_reads_it(
    cls, safe, tiny_config, tmp_path, transformers
):
    config = tiny_config.with_labels(3)
    torch.manual_seed(0)
    model = cls(config).eval()
    model.save_pretrained(tmp_path, safe_serialization=safe)
    weights = "model.safetensors" if safe else "pytorch_model.bin"
    assert (tmp_path / weights).exists() and (tmp_path / "config.json").exists()
    shape = (2, 4, 9) if cls is BertForMultipleChoice else (2, 9)
    ids = torch.randint(5, 99, shape, generator=torch.Generator().manual_seed(0))
    reloaded = cls.from_pretrained(tmp_path)
    hf = getattr(transformers, cls.__name__).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        a, b, c = model(ids), reloaded(ids), hf(ids)
    ours = [v for v in vars(a).values() if isinstance(v, torch.Tensor)]
    again = [v for v in vars(b).values() if isinstance(v, torch.Tensor)]
    for x, y in zip(ours, again, strict=True):
        assert torch.equal(x, y)
    theirs = [v for v in c.values() if isinstance(v, torch.Tensor)]
    for x, y in zip(ours, theirs, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cls", sorted(set(ALL_CLASSES) - set(HF_CLASSES), key=str))
def test_bertkit_only_heads_round_trip(cls, tiny_config, tmp_path):
    torch.manual_seed(0)
    model = cls(tiny_config.with_labels(3)).eval()
    model.save_pretrained(tmp_path)
    reloaded = cls.from_pretrained(tmp_path, strict=True)
    ids = torch.randint(5, 99, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = model(ids), reloaded(ids)
    for x, y in zip(vars(a).values(), vars(b).values(), strict=True):
        assert x is None or torch.equal(x, y)


def test_save_writes_atomically_and_replaces_stale_weights(tiny_config, tmp_path):
    model = BertModel(tiny_config)
    model.save_pretrained(tmp_path, safe_serialization=False)
    model.save_pretrained(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["config.json", "model.safetensors"]  # no temp files, no stale .bin


def test_encoder_checkpoint_into_head_model_and_back(tiny_config, tmp_path, caplog):
    torch.manual_seed(0)
    encoder = BertModel(tiny_config).eval()
    encoder.save_pretrained(tmp_path / "encoder")
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        classifier = BertForSequenceClassification.from_pretrained(
            tmp_path / "encoder", num_labels=5
        )
    assert "classifier.weight" in caplog.text and "newly initialised" in caplog.text
    assert classifier.classifier.out_features == 5
    torch.testing.assert_close(
        classifier.bert.encoder.layer[1].output.dense.weight,
        encoder.encoder.layer[1].output.dense.weight,
    )
    classifier.save_pretrained(tmp_path / "classifier")
    back = BertModel.from_pretrained(tmp_path / "classifier")  # strips bert., ignores the head
    ids = torch.randint(5, 99, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).last_hidden_state, encoder(ids).last_hidden_state)


def test_legacy_gamma_beta_names_and_decoder_bias_are_understood(tiny_config, tmp_path):
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config).eval()
    state = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): v.clone()
        for k, v in model.state_dict().items()
    }
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].clone()
    state["bert.embeddings.position_ids"] = torch.arange(64)[None]
    (tmp_path / "config.json").write_text(tiny_config.to_json_string())
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = BertForPreTraining.from_pretrained(tmp_path, strict=True)
    ids = torch.randint(5, 99, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).mlm_logits, model(ids).mlm_logits)


# ----------------------------------------------------------------------------- real weights
def _real_sentences():
    return [
        "BERT is designed to pre-train deep bidirectional representations from unlabeled text.",
        "The quick brown fox jumps over the lazy dog.",
        "Hi!",
        "Naïve café owners in Zürich don't open before 9 a.m. — or do they?",
        "Super Bowl 50 was an American football game to determine the champion of the National "
        "Football League (NFL) for the 2015 season. The American Football Conference (AFC) "
        "champion Denver Broncos defeated the National Football Conference (NFC) champion "
        "Carolina Panthers 24–10 to earn their third Super Bowl title.",
        "EU rejects German call to boycott British lamb .",
    ]


def test_minilm_real_weights_match_transformers(minilm_dir, tmp_path, transformers):
    ours = BertModel.from_pretrained(minilm_dir)
    hf = transformers.BertModel.from_pretrained(str(minilm_dir)).eval()
    tok = BertTokenizer.from_pretrained(minilm_dir)
    batch = tok(_real_sentences(), padding=True, return_tensors="pt")
    assert batch["attention_mask"].float().mean() < 0.7  # really a padded, mixed-length batch
    with torch.no_grad():
        a, b = ours(**batch), hf(**batch)
    delta = (a.last_hidden_state - b.last_hidden_state).abs().max().item()
    print(f"\nMiniLM-L6 last_hidden_state max |delta| vs transformers: {delta:.2e}")
    assert delta <= 1e-5
    torch.testing.assert_close(a.pooler_output, b.pooler_output, atol=1e-5, rtol=0)
    # saved by bertkit, reloaded by transformers (with the vocabulary alongside)
    ours.save_pretrained(tmp_path)
    assert (tmp_path / "vocab.txt").read_text() == (minilm_dir / "vocab.txt").read_text()
    again = transformers.BertModel.from_pretrained(tmp_path).eval()
    tok_again = transformers.AutoTokenizer.from_pretrained(tmp_path)
    batch_again = tok_again(_real_sentences(), padding=True, return_tensors="pt")
    assert torch.equal(batch_again["input_ids"], batch["input_ids"])
    with torch.no_grad():
        c = again(**batch_again)
    assert (c.last_hidden_state - b.last_hidden_state).abs().max().item() <= 1e-5


# ----------------------------------------------------------------------------- broken input
def test_shape_mismatch_names_tensor_and_both_shapes(tiny_config, tmp_path):
    BertModel(tiny_config).save_pretrained(tmp_path)
    bigger = dataclasses.replace(tiny_config, vocab_size=120)
    with pytest.raises(
        ValueError,
        match=r"'embeddings.word_embeddings.weight' has shape \(99, 32\) in the checkpoint but "
        r"\(120, 32\) in BertModel \(config: vocab_size\)",
    ):
        BertModel.from_pretrained(tmp_path, config=bigger)
    model = BertModel.from_pretrained(tmp_path, config=bigger, ignore_mismatched_sizes=True)
    assert model.embeddings.word_embeddings.weight.shape == (120, 32)


def test_checkpoint_from_another_config_is_refused(tiny_config, tmp_path):
    BertModel(tiny_config).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"lacks \d+ encoder tensors .*encoder.layer.2"):
        BertModel.from_pretrained(tmp_path)


def test_missing_and_unexpected_tensors_reported_by_name(tiny_config, tmp_path, caplog):
    from safetensors.torch import load_file, save_file

    BertForSequenceClassification(tiny_config).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["bert.encoder.layer.0.extra.weight"] = torch.zeros(2)
    del state["classifier.bias"]
    save_file(state, tmp_path / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="bertkit"):
        BertForSequenceClassification.from_pretrained(tmp_path)
    assert "classifier.bias" in caplog.text and "bert.encoder.layer.0.extra.weight" in caplog.text
    with pytest.raises(
        ValueError,
        match=r"strict load failed: missing \['classifier.bias'\], unexpected \['bert.encoder.layer.0.extra.weight'\]",
    ):
        BertForSequenceClassification.from_pretrained(tmp_path, strict=True)


def test_truncated_and_corrupt_weight_files(tiny_config, tmp_path):
    model = BertModel(tiny_config)
    model.save_pretrained(tmp_path / "st")
    data = (tmp_path / "st" / "model.safetensors").read_bytes()
    (tmp_path / "st" / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        ValueError,
        match=r"model.safetensors: cannot read safetensors weights, the file is truncated or corrupt",
    ):
        BertModel.from_pretrained(tmp_path / "st")
    model.save_pretrained(tmp_path / "bin", safe_serialization=False)
    data = (tmp_path / "bin" / "pytorch_model.bin").read_bytes()
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"pytorch_model.bin: cannot read PyTorch weights"):
        BertModel.from_pretrained(tmp_path / "bin")


def test_pickled_code_is_refused(tiny_config, tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("this must never run",))

    (tmp_path / "config.json").write_text(tiny_config.to_json_string())
    torch.save({"weights": Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="refused to load: it holds more than tensors"):
        BertModel.from_pretrained(tmp_path)


def test_missing_files_are_named(tmp_path, tiny_config):
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
        BertModel.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no weights found"):
        BertModel.from_pretrained(tmp_path)
    BertModel(tiny_config).save_pretrained(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json or bert_config.json"):
        BertModel.from_pretrained(tmp_path)
    assert main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2


def test_tensors_missing_from_the_checkpoint_get_a_real_initialisation(tiny_config, tmp_path):
    """from_pretrained allocates without initialising; whatever the checkpoint lacks must still
    be drawn, never leftover memory: from N(0, 0.02) as transformers draws a new head, or with
    `new_weights="truncated-normal"` cut at 2 std as Google's run_classifier.py draws it."""
    torch.manual_seed(0)
    BertModel(tiny_config, add_pooling_layer=False).save_pretrained(tmp_path)
    std = tiny_config.initializer_range
    for new_weights in ("normal", "truncated-normal"):
        model = BertForPreTraining.from_pretrained(tmp_path, new_weights=new_weights)
        heads = model.cls
        assert torch.all(heads.predictions.bias == 0)  # a bare Parameter of its module
        assert torch.all(heads.predictions.transform.LayerNorm.weight == 1)
        assert torch.all(heads.seq_relationship.bias == 0)
        # the pooler's 32 x 32 draws: a plain normal has ~4.6% of them beyond 2 std
        weight = model.bert.pooler.dense.weight.detach()
        assert torch.isfinite(weight).all() and 0.8 * std < float(weight.std()) < 1.2 * std
        beyond = float((weight.abs() > 2 * std).float().mean())
        assert 0.03 < beyond < 0.06 if new_weights == "normal" else beyond == 0.0
        assert heads.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    # a mismatched head keeps nothing of the checkpoint and is initialised too
    BertForSequenceClassification(tiny_config.with_labels(3)).save_pretrained(tmp_path / "c")
    clf = BertForSequenceClassification.from_pretrained(
        tmp_path / "c", num_labels=5, ignore_mismatched_sizes=True, new_weights="truncated-normal"
    )
    assert torch.all(clf.classifier.bias == 0) and clf.classifier.weight.abs().max() <= 2 * std
    with pytest.raises(
        ValueError, match="new_weights is normal or truncated-normal, not 'uniform'"
    ):
        BertForPreTraining.from_pretrained(tmp_path, new_weights="uniform")
    # a checkpoint that lacks nothing still refuses a misspelt choice (it took it silently)
    with pytest.raises(ValueError, match="not 'nromal'"):
        BertModel.from_pretrained(tmp_path / "c", new_weights="nromal")


def test_written_files_honour_the_umask(tmp_path, tiny_config):
    import os
    import stat

    from bertkit._io import atomic_write_text

    model = BertForSequenceClassification(tiny_config.with_labels(2))
    modes = {}
    previous = os.umask(0o022)
    try:
        for umask in (0o022, 0o077):
            os.umask(umask)
            folder = tmp_path / f"{umask:o}"
            atomic_write_text(folder / "a.txt", "x")
            model.save_pretrained(folder)  # safetensors' save_file sets 0600 itself
            modes[umask] = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    finally:
        os.umask(previous)
    assert set(modes[0o022]) >= {"a.txt", "config.json", "model.safetensors"}
    assert set(modes[0o022].values()) == {0o644}  # not mkstemp's or safetensors' 0600
    assert set(modes[0o077].values()) == {0o600}


def test_a_full_disk_is_named_and_keeps_the_previous_file(tmp_path, monkeypatch):
    from collections import namedtuple

    from bertkit._io import atomic_path

    target = tmp_path / "trainer_state.pt"
    target.write_bytes(b"previous")

    def torch_save_on_a_full_disk(path):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 12")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(100, 100, 0))
    with pytest.raises(OSError, match=f"no space left on device writing {target}"):
        with atomic_path(target) as tmp:
            torch_save_on_a_full_disk(tmp)
    assert target.read_bytes() == b"previous" and not list(tmp_path.glob(".*.tmp"))


def test_a_legacy_non_zip_pytorch_bin_loads(tiny_config, tmp_path):
    from safetensors.torch import load_file

    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    model.save_pretrained(tmp_path / "m")
    state = load_file(tmp_path / "m" / "model.safetensors")
    (tmp_path / "m" / "model.safetensors").unlink()
    torch.save(state, tmp_path / "m" / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    loaded = BertModel.from_pretrained(tmp_path / "m")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(b"\x80\x02garbage")
    with pytest.raises(ValueError, match="truncated or corrupt|refused to load"):
        BertModel.from_pretrained(tmp_path / "m")
