"""Shards (bertkit.pretraining.shards): preparing real text, garbled files refused."""

import json
from pathlib import Path

import numpy as np
import pytest

from bertkit import BertTokenizer
from bertkit.pretraining.dataset import PretrainingData
from bertkit.pretraining.shards import (
    Shards,
    encode_documents,
    prepare_shards,
)

from helpers import SPECIALS, synthetic_shards, synthetic_tokenizer


def test_prepare_shards_real_text_and_errors(tmp_path):
    vocab = (
        SPECIALS + list("abcdefghijklmnopqrstuvwxyz.") + ["the", "cat", "sat", "dog", "ran", "##s"]
    )
    tok = BertTokenizer(vocab=vocab, lowercase=True)
    corpus = tmp_path / "c.txt"
    corpus.write_text(
        "The cat sat. The dog ran.\n\nCats sat.\n\n\x00\x01\n\nOnly one sentence here.\n"
    )
    meta = prepare_shards([corpus], tok, tmp_path / "s", workers=1, progress=False)
    assert meta["num_documents"] == 3 and meta["num_sentences"] == 4
    assert meta["skipped"]["empty_documents"] == 1  # only control characters: nothing to tokenise
    shards = Shards(tmp_path / "s")
    shard, bounds = shards.sentence_bounds(1)
    assert tok.decode(shards.tokens[shard][bounds[0] : bounds[-1]]) == "cats sat."
    again = prepare_shards([corpus], tok, tmp_path / "s2", workers=2, progress=False)
    for kind in ("tokens", "sentences", "documents"):
        assert (tmp_path / "s" / f"shard-00000.{kind}").read_bytes() == (
            tmp_path / "s2" / f"shard-00000.{kind}"
        ).read_bytes()
    assert again["num_tokens"] == meta["num_tokens"]
    with pytest.raises(FileExistsError, match="already exists"):
        prepare_shards([corpus], tok, tmp_path / "s", progress=False)
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(ValueError, match="the corpus is empty"):
        prepare_shards([tmp_path / "empty.txt"], tok, tmp_path / "e", progress=False)
    assert not (tmp_path / "e").exists()
    other = BertTokenizer(vocab=vocab + ["extra"], lowercase=True)
    with pytest.raises(ValueError, match="prepared with another vocabulary"):
        PretrainingData(shards, other, batch_size=2)
    data = (tmp_path / "s" / "shard-00000.tokens").read_bytes()
    (tmp_path / "s" / "shard-00000.tokens").write_bytes(data[:-2])
    with pytest.raises(ValueError, match="shard-00000.tokens: .* the shard is truncated"):
        Shards(tmp_path / "s")
    with pytest.raises(ValueError, match="fewer than one global batch"):
        PretrainingData(Shards(tmp_path / "s2"), tok, batch_size=64).next_batch()
    single = tmp_path / "one.txt"
    single.write_text("Just one sentence.\n")
    prepare_shards([single], tok, tmp_path / "one", progress=False)
    with pytest.raises(ValueError, match="needs at least 2 documents"):
        PretrainingData(Shards(tmp_path / "one"), tok, batch_size=1).next_batch()
    mlm = PretrainingData(Shards(tmp_path / "one"), tok, batch_size=1, objective="mlm").next_batch()
    assert mlm["input_ids"].shape[0] == 1


def test_encode_documents_drops_empty_sentences_and_documents_anywhere():
    vocab = SPECIALS + ["the", "cat", "sat"]
    tok = BertTokenizer(vocab=vocab, lowercase=True)
    chunk = encode_documents(
        [
            ([], False),
            (["the cat", "\x00"], False),
            (["sat"], False),
            (["\x01"], False),
            ([], False),
        ],
        tok,
        np.dtype(np.uint16),
    )
    assert chunk.tokens.tolist() == [5, 6, 7] and chunk.sentence_lengths.tolist() == [2, 1]
    assert chunk.document_sentences.tolist() == [1, 1] and chunk.dropped_documents == 3
    assert tok.encode_ids(["the cat", ""]) == [[5, 6], []]
    assert tok("the cat sat", max_length=3)["input_ids"] == [2, 5, 3]  # __call__ settings restored


def test_garbled_shards_and_meta_are_refused_by_file_and_field(tmp_path):
    import shutil

    tokenizer = synthetic_tokenizer()
    synthetic_shards(tmp_path / "good", tokenizer, documents=50)
    good = tmp_path / "good" / "shards"
    meta = json.loads((good / "meta.json").read_text())
    name = meta["shards"][0]["name"]

    def broken(label: str) -> Path:
        target = tmp_path / label
        shutil.copytree(good, target)
        return target

    cases = []
    target = broken("index")  # the document index garbled: offsets go back
    offsets = np.fromfile(target / f"{name}.documents", dtype=np.int64)
    offsets[3] = 10**9
    offsets.tofile(target / f"{name}.documents")
    cases.append((target, f"{name}.documents: offset .* goes back|offsets run"))
    target = broken("sentences")
    offsets = np.fromfile(target / f"{name}.sentences", dtype=np.int64)
    offsets[-1] += 5
    offsets.tofile(target / f"{name}.sentences")
    cases.append((target, "sentences: offsets run 0.* expected 0"))
    for label, change, says in (
        ("list", lambda m: [m], "not bertkit shards"),
        ("dtype", lambda m: {**m, "dtype": "float16"}, "dtype 'float16' is not an integer"),
        ("missing", lambda m: {k: v for k, v in m.items() if k != "shards"}, "'shards' is missing"),
        ("count", lambda m: {**m, "shards": [{**m["shards"][0], "tokens": -3}]}, "'tokens' is -3"),
    ):
        target = broken(label)
        (target / "meta.json").write_text(json.dumps(change(meta)))
        cases.append((target, says))
    for target, says in cases:
        with pytest.raises(ValueError, match=says):
            Shards(target)
    assert Shards(good).num_documents == 50


def test_shards_carry_digests_that_a_run_checks(setup, tmp_path, capsys):
    """prepare records each file's SHA-256; a token id garbled inside the vocabulary's range
    (which every other check lets through) stops `bertkit pretrain` before it trains, naming
    the file; a shard name that leads out of its folder is refused; shards prepared before
    digests still open, said once."""
    import hashlib
    import shutil

    from bertkit.cli import main

    from helpers import tiny_cli_args

    good = tmp_path / "shards"
    shutil.copytree(setup / "shards", good)
    meta = json.loads((good / "meta.json").read_text())
    shard = meta["shards"][0]
    for kind in ("tokens", "sentences", "documents"):
        content = (good / f"{shard['name']}.{kind}").read_bytes()
        assert shard["sha256"][kind] == hashlib.sha256(content).hexdigest()
    assert Shards(good).verify() == 3 * len(meta["shards"])

    garbled = tmp_path / "garbled"
    shutil.copytree(good, garbled)
    tokens = np.fromfile(garbled / f"{shard['name']}.tokens", dtype=meta["dtype"])
    tokens[7] = (int(tokens[7]) + 1) % meta["vocab_size"]  # another word, still in range
    tokens.tofile(garbled / f"{shard['name']}.tokens")
    Shards(garbled)  # sizes and offsets are all still right
    out = tmp_path / "run"
    assert main(["pretrain", *map(str, tiny_cli_args(setup, out, steps=4, data=garbled))]) != 0
    said = capsys.readouterr().err
    assert f"{shard['name']}.tokens: its content is not what bertkit prepare wrote" in said
    assert not (out / "log.jsonl").exists()

    outside = tmp_path / "outside"
    shutil.copytree(good, outside)
    escaped = {**meta, "shards": [{**shard, "name": f"../garbled/{shard['name']}"}]}
    (outside / "meta.json").write_text(json.dumps(escaped))
    with pytest.raises(ValueError, match=r"shard name '\.\./garbled/.*' is not a file name in"):
        Shards(outside)

    older = tmp_path / "older"
    shutil.copytree(good, older)
    plain = {**meta, "shards": [{k: v for k, v in s.items() if k != "sha256"}
                                for s in meta["shards"]]}  # fmt: skip
    (older / "meta.json").write_text(json.dumps(plain))
    assert Shards(older).verify() == 0
