"""Corpus readers, shards, and the statistics of NSP/MLM instances (>= 100k of them)."""

import json
from pathlib import Path

import numpy as np
import pytest

from bertkit import BertTokenizer
from bertkit.pretraining.corpus import CorpusStats, read_documents
from bertkit.pretraining.dataset import MaskingConfig, PretrainingData, build_plan
from bertkit.pretraining.instances import document_instances, mask_tokens
from bertkit.pretraining.shards import (
    Shards,
    chunk_from_token_documents,
    encode_documents,
    prepare_shards,
    write_shards,
)

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def synthetic_tokenizer(words: int = 400, pieces: int = 60) -> BertTokenizer:
    vocab = SPECIALS + [f"[unused{i}]" for i in range(5)]
    vocab += [f"w{i}" for i in range(words)] + [f"##p{i}" for i in range(pieces)]
    return BertTokenizer(vocab=vocab, lowercase=True)


def synthetic_shards(tmp_path, tokenizer, documents=1500, seed=0, shard_tokens=1 << 27) -> Shards:
    """Documents of 1-40 sentences of 1-30 tokens; ~30% of tokens are ## continuations."""
    rng = np.random.default_rng(seed)
    vocab = tokenizer.vocab
    starts = np.asarray([i for t, i in vocab.items() if t.startswith("w")])
    continuations = np.asarray([i for t, i in vocab.items() if t.startswith("##")])
    docs = []
    for _ in range(documents):
        doc = []
        for _ in range(int(rng.integers(1, 41))):
            n = int(rng.integers(1, 31))
            ids = rng.choice(starts, n)
            cont = rng.random(n) < 0.3
            cont[0] = False
            ids[cont] = rng.choice(continuations, int(cont.sum()))
            doc.append(ids)
        docs.append(doc)
    write_shards(
        [chunk_from_token_documents(docs)],
        tokenizer,
        tmp_path / "shards",
        shard_tokens=shard_tokens,
    )
    return Shards(tmp_path / "shards")


def doc_of_token(shards: Shards, shard: int, offset: int) -> int:
    sentence = np.searchsorted(shards.sentences[shard], offset, side="right") - 1
    local = np.searchsorted(shards.documents[shard], sentence, side="right") - 1
    return int(shards.document_offsets[shard] + local)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tokenizer = synthetic_tokenizer()
    # several shards, so that spans and random documents cross shard boundaries
    shards = synthetic_shards(
        tmp_path_factory.mktemp("c"), tokenizer, documents=3000, shard_tokens=400_000
    )
    assert len(shards.meta["shards"]) > 2
    return tokenizer, shards


def test_instance_statistics_over_100k_instances(corpus):
    tokenizer, shards = corpus
    max_len = 48
    data = PretrainingData(shards, tokenizer, batch_size=500, max_seq_length=max_len, seed=1)
    masked = maskable = to_mask = to_random = kept = is_random = instances = 0
    cls_id, sep_id, mask_id = (
        tokenizer.cls_token_id,
        tokenizer.sep_token_id,
        tokenizer.mask_token_id,
    )
    while instances < 100_000:
        epoch_row = (data.epoch, data.row)
        batch = data.next_batch()
        plan = data.plan(data.epoch)
        ids = batch["input_ids"].numpy()
        assert ids.shape[1] <= max_len  # no instance over max_seq_length
        positions, labels = batch["masked_positions"].numpy(), batch["labels"].numpy()
        real = labels != -100
        rows = np.arange(len(ids))[:, None].repeat(positions.shape[1], 1)
        picked = ids[rows[real], positions[real]]
        original = labels[real]
        # special tokens are never masked: the original token at a position is never [CLS]/[SEP]
        assert not np.isin(original, [cls_id, sep_id]).any()
        # the tokens left in place: everything but the masked positions equals the original
        maskable += int(
            (
                (batch["attention_mask"].numpy() == 1) & ~np.isin(ids, [cls_id, sep_id])
                | (ids == mask_id)
            ).sum()
        )
        masked += int(real.sum())
        to_mask += int((picked == mask_id).sum())
        kept += int((picked == original).sum())
        to_random += int(((picked != mask_id) & (picked != original)).sum())
        is_random += int(batch["next_sentence_label"].sum())
        instances += len(ids)
        del epoch_row, plan
    print(
        f"\n{instances} instances: masked {masked / maskable:.4f} of maskable tokens; "
        f"[MASK] {to_mask / masked:.4f}, random {to_random / masked:.4f}, kept {kept / masked:.4f}; "
        f"NotNext {is_random / instances:.4f}"
    )
    assert abs(masked / maskable - 0.15) <= 0.003
    assert abs(to_mask / masked - 0.8) <= 0.01
    assert abs(to_random / masked - 0.1) <= 0.01
    assert abs(kept / masked - 0.1) <= 0.01
    assert abs(is_random / instances - 0.5) <= 0.01


def test_segments_come_from_the_right_documents(corpus):
    tokenizer, shards = corpus
    plan = build_plan(
        shards, np.random.default_rng(3), max_seq_length=64, short_seq_prob=0.1, objective="mlm+nsp"
    )
    assert len(plan) > 20_000
    random_next = plan[:, 6] == 1
    assert abs(random_next.mean() - 0.5) < 0.01
    for row in plan[:5000]:
        shard_a, a0, a1, shard_b, b0, b1, is_random = (int(x) for x in row)
        assert 0 < a1 - a0 and 0 < b1 - b0 and (a1 - a0) + (b1 - b0) <= 61
        doc_a = doc_of_token(shards, shard_a, a0)
        assert doc_of_token(shards, shard_a, a1 - 1) == doc_a
        doc_b = doc_of_token(shards, shard_b, b0)
        assert doc_of_token(shards, shard_b, b1 - 1) == doc_b
        if is_random:
            assert doc_b != doc_a  # never A's own document
        else:
            assert doc_b == doc_a and b0 >= a1 and shard_a == shard_b  # the actual continuation


def test_short_sequences_and_targets():
    bounds = np.cumsum([0] + [10] * 200)  # a long document of 10-token sentences
    rng = np.random.default_rng(0)
    lengths = []
    for _ in range(50):
        rows = document_instances(
            0, bounds, 0, 2, lambda d: (0, bounds), rng, max_seq_length=128, short_seq_prob=0.1
        )
        lengths += [(r[2] - r[1]) + (r[5] - r[4]) for r in rows]
    lengths = np.asarray(lengths)
    assert lengths.max() <= 125
    assert 0.6 < (lengths >= 110).mean()  # most instances fill the target length


def test_whole_word_masking_never_splits_a_word(corpus):
    tokenizer, shards = corpus
    data = PretrainingData(
        shards,
        tokenizer,
        batch_size=256,
        max_seq_length=64,
        masking=MaskingConfig(whole_word=True),
        seed=2,
    )
    continuation = data.is_continuation
    checked = 0
    for _ in range(40):
        batch = data.next_batch()
        labels, positions = batch["labels"].numpy(), batch["masked_positions"].numpy()
        for row in range(len(labels)):
            chosen = set(positions[row][labels[row] != -100].tolist())
            original = batch["input_ids"].numpy()[row].copy()
            original[positions[row][labels[row] != -100]] = labels[row][labels[row] != -100]
            n = int(batch["attention_mask"][row].sum())
            for p in range(1, n - 1):
                if continuation[original[p]] and original[p - 1] not in (
                    tokenizer.cls_token_id,
                    tokenizer.sep_token_id,
                ):
                    assert (p in chosen) == (p - 1 in chosen), (row, p)
                    checked += 1
    assert checked > 10_000


def test_mask_tokens_respects_cap_and_maskable():
    rng = np.random.default_rng(0)
    ids = np.arange(200)
    maskable = np.ones(200, bool)
    maskable[[0, 100, 199]] = False
    for _ in range(200):
        out, positions, labels = mask_tokens(
            ids, maskable, rng, mask_id=-1, random_ids=np.arange(5), max_predictions=20
        )
        assert len(positions) == 20 and maskable[positions].all()
        assert np.array_equal(labels, ids[positions]) and np.array_equal(
            np.delete(out, positions), np.delete(ids, positions)
        )


def test_dynamic_masks_change_by_epoch_static_ones_cycle(tmp_path):
    tokenizer = synthetic_tokenizer()
    shards = synthetic_shards(tmp_path, tokenizer, documents=60)

    def first_batches(masking, epochs):
        data = PretrainingData(shards, tokenizer, batch_size=4, masking=masking, seed=0)
        out = []
        for epoch in epochs:
            data.load_state_dict({"epoch": epoch, "row": 0})
            out.append(data.next_batch()["input_ids"])
        return out

    dynamic = first_batches(MaskingConfig(), [0, 1])
    assert (
        not np.array_equal(dynamic[0].numpy(), dynamic[1].numpy()[: len(dynamic[0])])
        if dynamic[0].shape == dynamic[1].shape
        else True
    )
    static = first_batches(MaskingConfig(static=True, dupe_factor=2), [0, 1, 2])
    assert static[0].shape == static[2].shape and np.array_equal(
        static[0].numpy(), static[2].numpy()
    )
    # resuming from a position gives the same batches
    data = PretrainingData(shards, tokenizer, batch_size=4, seed=5)
    for _ in range(7):
        data.next_batch()
    state = data.state_dict()
    expected = [data.next_batch()["input_ids"] for _ in range(5)]
    again = PretrainingData(shards, tokenizer, batch_size=4, seed=5)
    again.load_state_dict(state)
    for tensor in expected:
        assert np.array_equal(again.next_batch()["input_ids"].numpy(), tensor.numpy())


def test_ranks_split_the_global_batch(tmp_path):
    tokenizer = synthetic_tokenizer()
    shards = synthetic_shards(tmp_path, tokenizer, documents=80)
    whole = PretrainingData(shards, tokenizer, batch_size=8, seed=0)
    parts = [
        PretrainingData(shards, tokenizer, batch_size=4, seed=0, rank=r, world_size=2)
        for r in range(2)
    ]
    for _ in range(6):
        big = whole.next_batch()
        small = [p.next_batch() for p in parts]
        for r in range(2):
            n = small[r]["input_ids"].shape[1]
            assert np.array_equal(
                small[r]["input_ids"].numpy(), big["input_ids"][4 * r : 4 * r + 4, :n].numpy()
            )
            assert np.array_equal(
                small[r]["next_sentence_label"].numpy(),
                big["next_sentence_label"][4 * r : 4 * r + 4].numpy(),
            )


def test_single_segment_objectives(tmp_path):
    tokenizer = synthetic_tokenizer()
    shards = synthetic_shards(tmp_path, tokenizer, documents=50)
    mlm = PretrainingData(shards, tokenizer, batch_size=8, objective="mlm").next_batch()
    assert "next_sentence_label" not in mlm and int(mlm["token_type_ids"].sum()) == 0
    assert int((mlm["input_ids"] == tokenizer.sep_token_id).sum()) == 8  # [CLS] A [SEP]
    ltr = PretrainingData(shards, tokenizer, batch_size=8, objective="ltr").next_batch()
    row = ltr["input_ids"][0]
    n = int(ltr["attention_mask"][0].sum())
    assert ltr["masked_positions"][0, : n - 1].tolist() == list(range(n - 1))
    assert ltr["labels"][0, : n - 1].tolist() == row[1:n].tolist()  # the next token, unmasked input
    assert tokenizer.mask_token_id not in row.tolist()


# ----------------------------------------------------------------------------- corpus & shards
def test_corpus_formats(tmp_path):
    (tmp_path / "google.txt").write_text("First sentence.\nSecond one.\n\nOther doc.\n")
    docs = list(read_documents([tmp_path / "google.txt"], format="google"))
    assert docs == [["First sentence.", "Second one."], ["Other doc."]]
    (tmp_path / "wiki").write_text(
        '<doc id="1" url="u" title="Alpha">\nAlpha\n\nAlpha is a letter. It comes first.\n</doc>\n'
        '<doc id="2" url="u" title="Empty">\nEmpty\n</doc>\n'
    )
    stats = CorpusStats()
    assert list(read_documents([tmp_path / "wiki"], stats=stats)) == [
        ["Alpha is a letter.", "It comes first."]
    ]
    assert stats.empty_documents == 1
    (tmp_path / "plain.txt").write_text("One para. Two sentences.\n\nNext document here.\n")
    assert list(read_documents([tmp_path / "plain.txt"])) == [
        ["One para.", "Two sentences."],
        ["Next document here."],
    ]
    assert list(read_documents([tmp_path / "plain.txt"], format="text-file")) == [
        ["One para.", "Two sentences.", "Next document here."]
    ]
    (tmp_path / "d.jsonl").write_text(
        json.dumps({"text": "The sky is blue. Grass is green.\nWater is wet."}) + "\n"
    )
    assert list(read_documents([tmp_path / "d.jsonl"])) == [
        ["The sky is blue.", "Grass is green.", "Water is wet."]
    ]


def test_bad_corpus_input_is_reported_with_file_line_and_offset(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line.\nbad \xff byte.\nfine.\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: not UTF-8 at byte offset 15"):
        list(read_documents([bad]))
    stats = CorpusStats()
    assert list(read_documents([bad], on_error="skip", stats=stats)) == [["good line.", "fine."]]
    assert stats.bad_lines == 1 and "byte offset 15" in stats.problems[0]
    (tmp_path / "x.jsonl").write_text('{"text": "ok."}\n{"title": "no text"}\n')
    with pytest.raises(ValueError, match=r'x.jsonl:2: not a JSON object with a "text" string'):
        list(read_documents([tmp_path / "x.jsonl"]))
    (tmp_path / "w").write_text('<doc id="1" url="u" title="T">\nT\ntext.\n')
    with pytest.raises(ValueError, match="has no closing </doc>"):
        list(read_documents([tmp_path / "w"]))
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        list(read_documents([tmp_path / "missing.txt"]))


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
