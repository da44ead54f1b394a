"""The default dropout masks (bertkit.core.dropout): drawn by a parallel counter-based generator, the
same distribution as torch's, governed by torch's seed; and the encoder under them: unpadded
training draws masks for real tokens only, and `set_dropout_parity` brings torch's draws back."""

import pytest
import torch

from bertkit import BertModel
from bertkit.core.dropout import dropout, keep_mask
from bertkit.core.model import set_dropout_parity


def test_the_masks_have_the_rate_and_independence_asked_for():
    torch.manual_seed(0)
    n = 2_000_000
    for p in (0.1, 0.5):
        dropped = ~keep_mask((n,), p)
        rate = dropped.float().mean().item()
        sigma = (p * (1 - p) / n) ** 0.5
        assert abs(rate - round(p * 65536) / 65536) < 5 * sigma, (p, rate)
        for lag in (1, 2, 3, 4, 5, 64):  # within a 64-bit word, across words
            both = (dropped[:-lag] & dropped[lag:]).float().mean().item()
            assert abs(both - rate * rate) < 5 * (rate * rate / n) ** 0.5 * 2, (p, lag, both)
    first, second = keep_mask((n,), 0.1), keep_mask((n,), 0.1)
    assert abs((~first & ~second).float().mean().item() - 0.01) < 0.0005  # calls independent


def test_torch_seed_governs_the_draws_and_the_expectation_is_kept():
    torch.manual_seed(3)
    a = keep_mask((64, 33), 0.1)
    torch.manual_seed(3)
    assert torch.equal(a, keep_mask((64, 33), 0.1))
    assert not torch.equal(a, keep_mask((64, 33), 0.1))
    x = torch.ones(1_000_000)
    assert abs(dropout(x, 0.1, True).mean().item() - 1.0) < 0.002  # kept values scaled
    assert torch.equal(dropout(x, 0.1, False), x) and torch.equal(dropout(x, 0.0, True), x)
    assert dropout(x[:10], 1.0, True).abs().sum() == 0


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_a_trained_encoder_sees_the_same_distribution_as_with_torchs_masks(tiny_config, p):
    """Hidden states of a training forward: mean and spread under bertkit's masks equal those
    under torch's masks (parity), over many seeds; the draws themselves differ."""
    import dataclasses

    config = dataclasses.replace(tiny_config, hidden_dropout_prob=p, attention_probs_dropout_prob=p)
    torch.manual_seed(0)
    model = BertModel(config).train()
    ids = torch.randint(5, config.vocab_size, (4, 16))
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0

    def stats(parity):
        set_dropout_parity(model, parity)
        outs = []
        with torch.no_grad():
            for seed in range(40):
                torch.manual_seed(seed)
                outs.append(model(ids, attention_mask=mask, unpad=True).last_hidden_state)
        out = torch.stack(outs)[:, mask.bool()]
        return out.mean(0), out.std(0)

    (fast_mean, fast_std), (torch_mean, torch_std) = stats(False), stats(True)
    assert not torch.allclose(fast_mean, torch_mean, atol=1e-6)
    # the per-element means over 40 draws agree within their standard error
    error = (fast_std.square() / 40 + torch_std.square() / 40).sqrt()
    assert ((fast_mean - torch_mean).abs() / error).mean() < 1.0
    assert abs(fast_std.mean() / torch_std.mean() - 1) < 0.05


def test_unpadded_training_draws_masks_for_real_tokens_only(tiny_config, monkeypatch):
    from bertkit.core import dropout as module

    drawn = []
    real = module._draw

    def counting(shape, p, dtype, kept):
        drawn.append(shape)
        return real(shape, p, dtype, kept)

    monkeypatch.setattr(module, "_draw", counting)
    model = BertModel(tiny_config).train()
    ids = torch.randint(5, tiny_config.vocab_size, (3, 20))
    mask = torch.zeros_like(ids)
    mask[:, :5] = 1  # a quarter of the grid is real
    model(ids, attention_mask=mask, unpad=True).last_hidden_state.sum().backward()
    hidden = [s for s in drawn if len(s) == 2]
    assert hidden and all(s == (15, tiny_config.hidden_size) for s in hidden)


def test_the_draw_does_not_depend_on_how_the_words_are_chunked(monkeypatch):
    """The words are hashed a chunk at a time (cache-sized passes); chunks of 3 words, ending
    anywhere in the mask, give the very mask one pass gives, bool and scaled float alike."""
    from bertkit.core import dropout as module

    def draws():
        torch.manual_seed(11)
        return keep_mask((7, 13), 0.3), module.dropout_mask((5, 9), 0.1, torch.bfloat16)

    whole = draws()
    monkeypatch.setattr(module, "_CHUNK", 3)
    chunked = draws()
    assert all(torch.equal(a, b) for a, b in zip(whole, chunked, strict=True))
    assert set(whole[1].unique().tolist()) == {0.0, torch.tensor(65536 / 58982).bfloat16().item()}
    assert module.dropout_mask((4, 4), 1.0, torch.float32).abs().sum() == 0


def test_a_last_layers_subset_mask_follows_the_rows_device_and_compiles_whole():
    """The last layer of a pre-training forward computes only the rows read after it and takes
    their dropout from a mask of all the layout's rows. That mask must be drawn where the rows
    are (a CPU mask for rows on a GPU failed there; `meta` stands in for the GPU here) and, in
    compiled code, by torch (the CPU draw's seed broke the graph at that dropout)."""
    from bertkit.core.unpad import TokenLayout

    layout = TokenLayout.unpadded(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]))
    within = torch.tensor([0, 4, 6])
    rows = torch.ones(3, 8, device="meta")
    assert layout.dropout(rows, 0.1, True, within.to("meta")).device.type == "meta"

    def drop(rows: torch.Tensor) -> torch.Tensor:
        return layout.dropout(rows, 0.5, True, within)

    torch._dynamo.reset()
    out = torch.compile(drop, backend="eager", fullgraph=True)(torch.ones(3, 8))
    assert set(out.unique().tolist()) <= {0.0, 2.0}


def test_a_masks_elements_drawn_alone_are_the_whole_masks():
    """`dropout_mask_at` draws only the elements asked for (a last layer's few query rows of
    the attention probabilities), and they are the elements the whole mask has there, from
    the same one draw of torch's generator, whatever the positions' order, shape and lanes."""
    from bertkit.core import dropout as module

    for shape, p in [((3, 4, 11, 11), 0.1), ((2, 3, 5, 7), 0.3), ((1001,), 0.5)]:
        torch.manual_seed(1)
        whole, after = module.dropout_mask(shape, p, torch.float32), torch.rand(1)
        positions = torch.randperm(whole.numel(), generator=torch.Generator().manual_seed(2))
        positions = positions[:15].view(5, 1, 3)
        torch.manual_seed(1)
        some = module.dropout_mask_at(shape, positions, p, torch.float32)
        assert some.shape == positions.shape
        assert torch.equal(some, whole.reshape(-1)[positions]) and torch.equal(torch.rand(1), after)
    assert module.dropout_mask_at((4, 4), torch.arange(3), 1.0, torch.float32).abs().sum() == 0
    on_card = torch.ones(2, device="meta")  # where torch draws (`meta` stands in for a GPU)
    assert module.mask_at(on_card, (4, 4), torch.arange(3), 0.1).device.type == "meta"
