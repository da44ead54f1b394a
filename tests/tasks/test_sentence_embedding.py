"""`sentence-embedding` (bertkit.tasks.sentence_embedding, bertkit.core.embedding): a bi-encoder
trained with in-batch negatives learns pairs that share no word; its folder loads in
sentence-transformers with the same vectors; scored pairs train with the cosine objective;
bad pair files are refused by line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit.cli import main
from bertkit.core.embedding import pool
from bertkit.finetuning.train import FinetuneConfig, finetune
from bertkit.inference.embedder import Embedder
from bertkit.inference.predict import Predictor
from bertkit.tasks.base import DataError
from bertkit.tasks.own import DataConfig

from helpers import OWN_QUICK, synonym_pairs
from helpers import write_rows as write


def test_pairs_with_no_word_in_common_are_learnt_and_load_in_sentence_transformers(
    words_model, tmp_path
):
    train = write(tmp_path / "train.csv", synonym_pairs(200, seed=0, negatives=True))
    dev = write(tmp_path / "dev.csv", synonym_pairs(48, seed=1))
    out = tmp_path / "emb"
    argv = ["finetune", "sentence-embedding", "--model", str(words_model), "--train", str(train),
            "--validation", str(dev), "--text-column", "anchor", "--text-pair-column", "positive",
            "--negative-column", "hard", "--epochs", "6", "--batch-size", "16", "--lr", "1e-3",
            "--max-seq-length", "16", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    before, after = results["before_training"], results["dev"]
    assert set(after) == {"recall@1", "recall@10", "mrr@10"}
    assert before["mrr@10"] < 0.3 and after["mrr@10"] > before["mrr@10"] + 0.3, (before, after)
    assert results["read"]["train"]["problem"] == "pairs"
    texts = ["after coach", "the robot eats sushi", "a"]
    ours = Embedder(out)(texts)
    assert ours.shape == (3, 32) and np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
    from sentence_transformers import SentenceTransformer

    theirs = SentenceTransformer(str(out), device="cpu").encode(texts)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    answer = Predictor(out)(texts[:1])[0]
    np.testing.assert_allclose(answer["embedding"], ours[0], atol=1e-5)
    card = (out / "README.md").read_text()  # the model card
    import hashlib

    assert hashlib.sha256(train.read_bytes()).hexdigest() in card
    assert f'SentenceTransformer("{out}")' in card and "mrr@10" in card
    assert "--negative-column hard" in card and "--epochs 6" in card


def test_matryoshka_dimensions_train_the_leading_parts_too(words_model, tmp_path):
    train = write(tmp_path / "train.csv", synonym_pairs(200, seed=0))
    dev = write(tmp_path / "dev.csv", synonym_pairs(48, seed=1))
    data = DataConfig(train=str(train), validation=str(dev), text_column="anchor",
                      text_pair_column="positive", dims="32,8")  # fmt: skip
    results = finetune("sentence-embedding", words_model, data, tmp_path / "run",
                       FinetuneConfig(epochs=6, batch_size=16, learning_rate=1e-3,
                                      max_seq_length=16, progress=False))  # fmt: skip
    before, after = results["before_training"], results["dev"]
    assert {"mrr@10", "mrr@10_8", "recall@1_8"} <= set(after)  # 32 is the whole vector
    assert after["mrr@10_8"] > before["mrr@10_8"] + 0.2, (before, after)
    with pytest.raises(ValueError, match="--dims 'a,b'"):
        finetune("sentence-embedding", words_model,
                 DataConfig(train=str(train), validation=str(dev), text_column="anchor",
                            text_pair_column="positive", dims="a,b"),
                 tmp_path / "bad", FinetuneConfig(epochs=1, progress=False))  # fmt: skip
    assert not (tmp_path / "bad").exists()


def test_scored_pairs_train_with_the_cosine_objective(words_model, tmp_path):
    pairs = synonym_pairs(120, seed=2)
    rng = np.random.default_rng(3)
    rows = []
    for i, row in enumerate(pairs):  # half the pairs true (5), half mismatched (0)
        positive = row["positive"] if i % 2 == 0 else pairs[(i + 7) % len(pairs)]["positive"]
        rows.append({"a": row["anchor"], "b": positive, "score": 5 if i % 2 == 0 else 0})
    rng.shuffle(rows)
    data = DataConfig(train=str(write(tmp_path / "train.csv", rows[:90])),
                      validation=str(write(tmp_path / "dev.csv", rows[90:])), text_column="a",
                      text_pair_column="b", label_column="score", score_range="0,5")  # fmt: skip
    results = finetune("sentence-embedding", words_model, data, tmp_path / "run",
                       FinetuneConfig(**OWN_QUICK | {"epochs": 8}))  # fmt: skip
    assert results["read"]["train"]["problem"] == "scored pairs"
    assert set(results["dev"]) == {"spearman", "pearson"}
    assert results["dev"]["spearman"] > results["before_training"]["spearman"] + 0.2


@pytest.mark.parametrize(
    "rows, columns, message",
    [
        ([{"a": "x y", "b": ""}], {}, r"train.csv:2: column 'b': an empty text"),
        ([{"a": "x", "b": "z", "s": "3"}, {"a": "y", "b": "w", "s": "7"}],
         {"label_column": "s", "score_range": "0,5"}, r"train.csv:3: column 's': 7 is outside"),
    ],
)  # fmt: skip
def test_bad_pair_files_are_refused_by_line(words_model, tmp_path, rows, columns, message):
    train = write(tmp_path / "train.csv", rows)
    data = DataConfig(train=str(train), validation=str(train), text_column="a",
                      text_pair_column="b", **columns)  # fmt: skip
    with pytest.raises(DataError, match=message):
        finetune("sentence-embedding", words_model, data, tmp_path / "run",
                 FinetuneConfig(**OWN_QUICK))  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_the_model_round_trips_with_its_pooling(tmp_path):
    import torch

    from bertkit import BertConfig
    from bertkit.core.embedding import BertForSentenceEmbedding

    torch.manual_seed(0)
    model = BertForSentenceEmbedding(BertConfig.from_preset("tiny", vocab_size=100), "cls").eval()
    model.save_pretrained(tmp_path)
    again = BertForSentenceEmbedding.from_pretrained(tmp_path, strict=True).eval()
    assert again.pooling == "cls"
    ids = torch.randint(5, 99, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids), again(ids))


def test_pooling_is_sentence_transformers_mean_over_real_tokens():
    import torch

    hidden = torch.arange(12.0).view(1, 4, 3)
    mask = torch.tensor([[1, 1, 1, 0]])
    assert pool(hidden, mask).tolist() == [[3.0, 4.0, 5.0]]  # [CLS] and [SEP] counted
    assert pool(hidden, mask, "cls").tolist() == [[0.0, 1.0, 2.0]]


def test_batches_never_hold_a_text_twice_and_are_unchanged_where_none_repeats():
    from bertkit.tasks.base import FinetuneData

    rng = np.random.default_rng(0)
    texts = [frozenset({f"anchor {rng.integers(40)}", f"positive {rng.integers(300)}"})
             for _ in range(300)]  # fmt: skip
    features = [{"input_ids": [1] * int(rng.integers(3, 30))} for _ in texts]
    for bucket in (1, 4):
        data = FinetuneData(features, 16, list, seed=3, bucket_batches=bucket, distinct=texts)
        for epoch in range(3):
            plan = data.plan(epoch)
            assert sorted(np.concatenate(plan).tolist()) == list(range(300))  # every row, once
            for batch in plan:
                held = [t for i in batch for t in texts[i]]
                assert len(held) == len(set(held)), "a text twice in one batch"
            assert sum(len(b) == 16 for b in plan) >= len(plan) - 3  # few short batches
        unique = [frozenset({f"text {i}"}) for i in range(300)]
        plain = FinetuneData(features, 16, list, seed=3, bucket_batches=bucket)
        distinct = FinetuneData(features, 16, list, seed=3, bucket_batches=bucket,
                                distinct=unique)  # fmt: skip
        for epoch in range(2):  # nothing repeats: the very batches of before, in their order
            assert [b.tolist() for b in plain.plan(epoch)] == [
                b.tolist() for b in distinct.plan(epoch)]  # fmt: skip


def test_rows_that_share_an_anchor_all_train(words_model, tmp_path, capsys):
    """Real pair files repeat anchors (a title with several descriptions, a premise with
    several hypotheses): every row trains, batches never hold a text twice, the summary says
    how many rows share one, and dev ranks do not count the same anchor's other positives
    against it."""
    pairs = synonym_pairs(100, seed=0)
    rows = pairs + [{"anchor": r["anchor"], "positive": " ".join(r["positive"].split()[::-1])}
                    for r in pairs[:30]]  # fmt: skip
    train = write(tmp_path / "train.csv", rows)
    dev = write(tmp_path / "dev.csv", synonym_pairs(24, seed=1) * 2)  # each dev row twice
    argv = ["finetune", "sentence-embedding", "--model", str(words_model), "--train", str(train),
            "--validation", str(dev), "--text-column", "anchor", "--text-pair-column", "positive",
            "--epochs", "2", "--batch-size", "16", "--lr", "1e-3", "--max-seq-length", "16",
            "--out", str(tmp_path / "emb")]  # fmt: skip
    assert main(argv) == 0
    said = capsys.readouterr().err
    assert "60 rows share their 'anchor' with another row (30 texts)" in said
    results = json.loads((tmp_path / "emb" / "results.json").read_text())
    assert results["read"]["train"]["rows_sharing_anchor"] == 60
    assert results["train_examples"] == 130
    predictions = [json.loads(line) for line in
                   (tmp_path / "emb" / "predictions.jsonl").read_text().splitlines()]  # fmt: skip
    twins = {}
    for row in predictions:  # a row and its copy rank alike: the copy is not counted against
        twins.setdefault(row["anchor"], set()).add(row["rank"])
    assert all(len(ranks) == 1 for ranks in twins.values())
    # each copy ties with its twin, which would count against both: no row would rank first
    assert sum(row["rank"] == 0 for row in predictions) >= 2


def test_the_embedder_runs_at_its_precision_and_answers_in_the_order_asked(minilm_dir):
    from sentence_transformers import SentenceTransformer

    texts = ["a", "a much longer sentence about the river bank and its mill", "the cat sat"]
    fp32 = Embedder(minilm_dir, device="cpu", precision="fp32", batch_size=2)
    theirs = SentenceTransformer(str(minilm_dir), device="cpu").encode(texts)
    # sorted longest first inside, each vector back in its text's place
    np.testing.assert_allclose(fp32(texts), theirs, atol=2e-6)
    np.testing.assert_allclose(fp32(texts[::-1]), theirs[::-1], atol=2e-6)
    assert fp32.precision.name == "fp32" and fp32([]).shape == (0, 384)
    bf16 = Embedder(minilm_dir, device="cpu", precision="bf16", batch_size=2)
    assert bf16.precision.name == "bf16"
    assert bf16.encoder.encoder.layer[0].attention.self.query.weight.dtype == torch.bfloat16
    vectors = bf16(texts)  # bf16's rounding: equal within it, and not bit for bit
    assert vectors.dtype == np.float32 and np.allclose(
        np.linalg.norm(vectors, axis=1), 1, atol=1e-5
    )
    assert np.min(np.sum(vectors * theirs, axis=1)) > 0.999 and not np.array_equal(vectors, theirs)
    assert Embedder(minilm_dir, device="cpu").precision.name in ("bf16", "fp32")  # auto
