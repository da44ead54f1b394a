"""The pre-training data stream (bertkit.pretraining.dataset): masks per epoch, ranks."""

import numpy as np
import pytest
import torch

from bertkit.pretraining.dataset import MaskingConfig, PretrainingData

from helpers import synthetic_shards, synthetic_tokenizer


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

    # the same instance (the same tokens) is masked anew in each epoch: its masks' version is
    # the epoch's (static masking: the epoch modulo dupe_factor)
    for masking, same in ((MaskingConfig(), False), (MaskingConfig(static_masking=True,
                                                                   dupe_factor=2), True)):  # fmt: skip
        data = PretrainingData(shards, tokenizer, batch_size=4, masking=masking, seed=0)
        spans = data.plan(0)[:20]
        changed = [
            data.instance(span, (0, data._version(0), r))["positions"].tolist()
            != data.instance(span, (0, data._version(2), r))["positions"].tolist()
            for r, span in enumerate(spans)
        ]
        assert (sum(changed) == 0) if same else (sum(changed) >= 15), changed
    static = first_batches(MaskingConfig(static_masking=True, dupe_factor=2), [0, 1, 2])
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
