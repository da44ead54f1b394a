"""Starting points for pre-training (bertkit.pretraining.init_schemes): each scheme's effect on a
fresh model, `apply` (what --position-init and --attention-init do), and a short run from each."""

import numpy as np
import pytest
import torch

from bertkit import BertConfig, BertForPreTraining
from bertkit.pretraining import init_schemes
from bertkit.pretraining.train import run_pretraining


def _short_run(setup, out, **settings) -> list[float]:
    """The training losses of 3 steps of the tiny dropout-free model (settings override)."""
    settings = {
        "config": str(setup / "nodrop.json"),
        "max_steps": 3,
        "batch_size": 4,
        "seq_len": 32,
        "warmup_steps": 1,
        "progress": False,
        **settings,
    }
    entries = run_pretraining(setup / "shards", out, **settings)
    return [e["loss"] for e in entries if e["split"] == "train"]


def test_mimetic_attention_starts_near_identity_and_trains(setup, tmp_path):
    model = BertForPreTraining(BertConfig.from_json_file(setup / "nodrop.json")).requires_grad_(
        False
    )
    layer = model.bert.encoder.layer[0]
    init_schemes.mimetic_attention_(layer, qk=(0.0, 1.0), vo=(0.0, 0.5))
    size, attention = layer.head_size, layer.attention
    for head in range(layer.num_heads):  # rank-`size` part of I: a projection, PSD
        rows = slice(head * size, (head + 1) * size)
        product = attention.self.query.weight[rows].T @ attention.self.key.weight[rows]
        assert torch.allclose(product, product.T, atol=1e-5)
        assert torch.allclose(product @ product, product, atol=1e-5)
        assert float(product.trace()) == pytest.approx(size, rel=1e-4)
    value_output = attention.output.dense.weight @ attention.self.value.weight
    assert torch.allclose(value_output, -0.5 * torch.eye(value_output.shape[0]), atol=1e-5)
    assert np.isfinite(_short_run(setup, tmp_path / "run", attention_init="mimetic-qk")).all()


def test_local_attention_starts_on_the_neighbours(setup, tmp_path):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_json_file(setup / "nodrop.json")).eval()
    init_schemes.local_attention_(model)
    ids = torch.randint(10, 400, (4, 40))
    with torch.no_grad():
        maps = model.bert(ids, output_attentions=True).attentions[0][:, :, 1:-1]  # (B, A, S-2, S)
    rows = torch.arange(1, 39)
    left = maps[:, 0, torch.arange(38), rows - 1].mean()
    right = maps[:, 1, torch.arange(38), rows + 1].mean()
    assert left > 0.5 and right > 0.5  # uniform would be 1/40
    embeddings = model.bert.embeddings
    assert embeddings.word_embeddings.weight[:, -16:].abs().max() == 0  # positions own those
    assert embeddings.position_embeddings.weight[:, :-16].abs().max() == 0
    assert np.isfinite(_short_run(setup, tmp_path / "run", attention_init="local")).all()


def _fresh(setup, seed: int = 0) -> BertForPreTraining:
    torch.manual_seed(seed)
    return BertForPreTraining(BertConfig.from_json_file(setup / "nodrop.json"))


def test_apply_normal_leaves_googles_init_and_each_scheme_is_its_function(setup):
    state = {k: v.clone() for k, v in _fresh(setup).state_dict().items()}
    untouched = init_schemes.apply(_fresh(setup))
    assert all(torch.equal(v, state[k]) for k, v in untouched.state_dict().items())
    # sinusoidal: the position table only, scaled to the config's initializer range
    model = init_schemes.apply(_fresh(setup), position_init="sinusoidal")
    positions = model.bert.embeddings.position_embeddings.weight
    assert float(positions.detach().std()) == pytest.approx(
        model.config.initializer_range, rel=1e-3
    )
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, state[k])}
    assert changed == {"bert.embeddings.position_embeddings.weight"}
    # local: the same weights as local_attention_ itself; a left-to-right model looks left twice
    for left_to_right, offsets in ((False, (-1, 1)), (True, (-1, -2))):
        applied = init_schemes.apply(
            _fresh(setup), attention_init="local", left_to_right=left_to_right
        )
        direct = init_schemes.local_attention_(_fresh(setup), offsets=offsets)
        for key, value in direct.state_dict().items():
            assert torch.equal(applied.state_dict()[key], value), key
    # mimetic: every layer's queries and keys change; mimetic-qk leaves values and outputs
    model = init_schemes.apply(_fresh(setup), attention_init="mimetic-qk")
    for number, layer in enumerate(model.bert.encoder.layer):
        prefix = f"bert.encoder.layer.{number}.attention."
        assert not torch.equal(
            layer.attention.self.query.weight, state[prefix + "self.query.weight"]
        )
        assert torch.equal(layer.attention.self.value.weight, state[prefix + "self.value.weight"])
    model = init_schemes.apply(_fresh(setup), attention_init="mimetic")
    value = model.bert.encoder.layer[-1].attention.self.value.weight
    assert not torch.equal(
        value,
        state[
            f"bert.encoder.layer.{len(model.bert.encoder.layer) - 1}.attention.self.value.weight"
        ],
    )


def test_apply_refuses_an_unknown_scheme(setup):
    with pytest.raises(ValueError, match="attention_init must be one of"):
        init_schemes.apply(_fresh(setup), attention_init="diagonal")
    with pytest.raises(ValueError, match="position_init must be one of"):
        init_schemes.apply(_fresh(setup), position_init="rotary")
