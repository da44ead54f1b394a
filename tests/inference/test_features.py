"""The feature-based approach: layer selections, per-word features, the safetensors file,
`bertkit extract`, and the BiLSTM tagger learning from frozen features."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit import BertModel, cli
from bertkit.core.tokenizer import train_vocab
from bertkit.inference.features import (
    SELECTIONS,
    BiLSTMTagger,
    extract,
    load_features,
    save_features,
    select_layers,
    train_tagger,
)

from helpers import tiny_bert_config

TEXTS = ["the cat sat on the mat", "a dog ran far away from home", "cats and dogs"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny_features")
    tokenizer = train_vocab(texts=TEXTS * 3, vocab_size=120, min_frequency=1, show_progress=False)
    config = tiny_bert_config(
        tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=24,
    )
    torch.manual_seed(0)
    model = BertModel(config)
    model.save_pretrained(directory, tokenizer=tokenizer)
    return model.eval(), tokenizer, directory


def test_selections_combine_the_hidden_states(tiny):
    model, tokenizer, _ = tiny
    selections = [*SELECTIONS, "layer:2", "layer:-1"]
    features = extract(model, tokenizer, TEXTS, selections)
    batch = tokenizer(TEXTS[0], return_tensors="pt")
    hidden = model(**batch, output_hidden_states=True).hidden_states
    assert len(hidden) == 5
    first = {s: features[s][0] for s in selections}
    torch.testing.assert_close(first["embeddings"], hidden[0][0])
    torch.testing.assert_close(first["last"], hidden[4][0])
    torch.testing.assert_close(first["layer:-1"], hidden[4][0])
    torch.testing.assert_close(first["layer:2"], hidden[2][0])
    torch.testing.assert_close(first["second_to_last"], hidden[3][0])
    torch.testing.assert_close(first["sum_last_4"], sum(hidden[1:])[0], rtol=1e-5, atol=1e-5)
    assert first["concat_last_4"].shape == (batch["input_ids"].shape[1], 64)
    assert first["all"].shape == (batch["input_ids"].shape[1], 5, 16)
    # padding in a batch changes nothing: the shortest text alone gives the same rows
    alone = extract(model, tokenizer, [TEXTS[2]], ["last"])["last"][0]
    torch.testing.assert_close(features["last"][2], alone, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="layer must be 1..4"):
        select_layers(hidden, "layer:9")
    with pytest.raises(ValueError, match="unknown layer selection"):
        extract(model, tokenizer, TEXTS, ["middle"])


def test_per_word_features_take_the_first_piece(tiny, tmp_path):
    model, tokenizer, _ = tiny
    words = [["the", "catsdogs", "sat"], ["far"]]
    features = extract(model, tokenizer, words, ["last"])["last"]
    assert [len(f) for f in features] == [3, 1]
    pieces = [tokenizer.tokenize(w) for w in words[0]]
    text_rows = extract(model, tokenizer, [" ".join(words[0])], ["last"])["last"][0]
    first_positions = [1, 1 + len(pieces[0]), 1 + len(pieces[0]) + len(pieces[1])]
    torch.testing.assert_close(features[0], text_rows[first_positions], rtol=1e-5, atol=1e-5)
    path = save_features({"last": features}, tmp_path / "f.safetensors", {"model": "tiny"})
    loaded = load_features(path, "last")
    assert [torch.equal(a, b) for a, b in zip(loaded, features, strict=True)] == [True, True]
    with pytest.raises(KeyError, match="no features 'embeddings'"):
        load_features(path, "embeddings")


def test_extract_command(tiny, tmp_path, capsys):
    _, _, directory = tiny
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "features.safetensors"
    argv = ["extract", "--model", str(directory), "--input", str(source), "--out", str(out)]
    assert cli.main([*argv, "--layers", "last,sum_last_4,layer:1"]) == 0
    assert [f.shape[1] for f in load_features(out, "layer:1")] == [16, 16, 16]
    from safetensors.torch import load_file

    from bertkit import BertTokenizer

    stored = load_file(out)  # the rows' pieces are stored: they read back as the texts
    offsets = stored["offsets"].tolist()
    tokenizer = BertTokenizer.from_pretrained(directory)
    for n, text in enumerate(TEXTS):
        ids = stored["token_ids"][offsets[n] : offsets[n + 1]].tolist()
        assert ids == tokenizer(text)["input_ids"]
    source.write_text("one line\n\nthird\n")
    assert cli.main(argv) == 2
    assert "in.txt:2: an empty line" in capsys.readouterr().err


def test_bilstm_tagger_learns_from_frozen_features(tmp_path):
    """A tag readable from the feature vector: the tagger must reach it."""
    torch.manual_seed(0)
    features, labels = [], []
    for _ in range(60):
        n = int(torch.randint(3, 9, ()))
        x = torch.randn(n, 8)
        features.append(x)
        labels.append((x[:, 0] > 0).long().tolist())
    tagger, predicted = train_tagger(
        (features[:40], labels[:40]),
        (features[40:], labels[40:]),
        2,
        hidden_size=16,
        epochs=15,
        batch_size=8,
        learning_rate=1e-2,
    )
    right = sum(
        p == g
        for ps, gs in zip(predicted, labels[40:], strict=True)
        for p, g in zip(ps, gs, strict=True)
    )
    assert right / sum(len(g) for g in labels[40:]) > 0.9
    # on the Trainer: a log, a checkpoint, and a finished run that resumes to the same tagger
    kwargs = dict(hidden_size=8, epochs=2, batch_size=8, learning_rate=1e-2, out=tmp_path)
    first, tags = train_tagger(
        (features[:40], labels[:40]), (features[40:], labels[40:]), 2, **kwargs
    )
    entries = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert entries[-1]["step"] == 10 and (tmp_path / "trainer_state.pt").exists()
    again, tags_again = train_tagger(
        (features[:40], labels[:40]), (features[40:], labels[40:]), 2, resume=True, **kwargs
    )
    assert tags_again == tags
    for a, b in zip(first.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
    mixed = BiLSTMTagger(8, 3, hidden_size=4, mix_layers=5)
    logits = mixed(torch.randn(2, 6, 5, 8), torch.tensor([6, 2]))
    assert logits.shape == (2, 6, 3)
