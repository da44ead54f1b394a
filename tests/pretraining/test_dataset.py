"""The pre-training data stream (bertkit.pretraining.dataset): masks per epoch, ranks."""

import numpy as np
import pytest
import torch

from bertkit.pretraining.dataset import MaskingConfig, PretrainingData

from helpers import synthetic_shards, synthetic_tokenizer


def test_dynamic_masks_change_by_epoch_static_ones_cycle(tmp_path):
    tokenizer = synthetic_tokenizer()
    shards = synthetic_shards(tmp_path, tokenizer, documents=60)

    def batches(masking, epoch, count=6):
        """The first `count` batches of `epoch`, as training reads them (`next_batch`)."""
        data = PretrainingData(shards, tokenizer, batch_size=4, masking=masking, seed=0)
        data.load_state_dict({"epoch": epoch, "row": 0})
        return [data.next_batch() for _ in range(count)]

    def same(a, b):
        return all(a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a)

    # dynamic masking: each epoch's batches are made anew (its masks' version is the epoch), so
    # epoch 2 repeats none of epoch 0's; static masking with dupe_factor 2: the epoch modulo 2,
    # so epoch 2 is epoch 0 again, batch for batch, and epoch 1 is not
    dynamic = [batches(MaskingConfig(), epoch) for epoch in (0, 2)]
    assert not any(same(a, b) for a, b in zip(*dynamic, strict=True))
    static = MaskingConfig(static_masking=True, dupe_factor=2)
    first, second, third = (batches(static, epoch) for epoch in (0, 1, 2))
    assert all(same(a, b) for a, b in zip(first, third, strict=True))
    assert not any(same(a, b) for a, b in zip(first, second, strict=True))
    # within an epoch the same masks again (a resumed run reads what the killed one would)
    assert all(same(a, b) for a, b in zip(dynamic[0], batches(MaskingConfig(), 0), strict=True))
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


@pytest.mark.parametrize("objective", ["mlm+nsp", "ltr"])
def test_fixed_shapes_pad_every_batch_to_one_shape(tmp_path, objective):
    """`fixed_shapes` (`--compile graphs`): every batch is seq_len wide with room for the most
    predictions a sequence can have, the extra cells padding and ignored labels; the tokens and
    labels are the unfixed batches' own."""
    tokenizer = synthetic_tokenizer()
    shards = synthetic_shards(tmp_path, tokenizer, documents=60)
    settings = dict(batch_size=2, seq_len=48, short_seq_prob=0.9, objective=objective, seed=3)
    loose = PretrainingData(shards, tokenizer, **settings)
    fixed = PretrainingData(shards, tokenizer, **settings, fixed_shapes=True)
    most = 47 if objective == "ltr" else 20
    widths = set()
    for _ in range(10):
        a, b = loose.next_batch(), fixed.next_batch()
        widths.add(a["input_ids"].shape[1])
        assert b["input_ids"].shape == (2, 48) and b["labels"].shape == (2, most)
        n, p = a["input_ids"].shape[1], a["labels"].shape[1]
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            assert torch.equal(b[key][:, :n], a[key]) and not b[key][:, n:].any()
        assert torch.equal(b["labels"][:, :p], a["labels"]) and (b["labels"][:, p:] == -100).all()
    assert min(widths) < 48  # the unfixed batches did vary
