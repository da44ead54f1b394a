"""NSP/MLM instances (bertkit.pretraining.instances), their statistics over >= 100k of them."""

import numpy as np
import pytest

from bertkit.pretraining.dataset import MaskingConfig, PretrainingData, build_plan
from bertkit.pretraining.instances import document_instances, mask_tokens

from helpers import doc_of_token, synthetic_shards, synthetic_tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tokenizer = synthetic_tokenizer()
    # several shards, so that spans and random documents cross shard boundaries
    shards = synthetic_shards(
        tmp_path_factory.mktemp("c"), tokenizer, documents=3000, shard_tokens=400_000
    )
    assert len(shards.meta["shards"]) > 2
    return tokenizer, shards


@pytest.mark.slow
def test_instance_statistics_over_100k_instances(corpus):
    tokenizer, shards = corpus
    max_len = 48
    data = PretrainingData(shards, tokenizer, batch_size=500, seq_len=max_len, seed=1)
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
        seq_len=64,
        masking=MaskingConfig(whole_word_mask=True),
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
