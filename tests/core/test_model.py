"""The encoder and every head against Hugging Face transformers (same weights, eval mode), and the
left-to-right mask against an independent reference forward written here."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import bertkit
from bertkit import (
    BertConfig,
    BertModel,
)
from bertkit.core import model as model_module
from bertkit.core import unpad as unpad_module
from bertkit.core.checkpoint import load_state_dict_into
from bertkit.core.model import set_dropout_parity
from bertkit.core.unpad import TokenLayout

from helpers import close, hf_config, pair


@torch.no_grad()
def test_bert_model_matches_hf_with_hidden_states_and_attentions(tiny_config, tiny_batch):
    ours, hf = pair("BertModel", tiny_config)
    a = ours(**tiny_batch, output_hidden_states=True, output_attentions=True)
    b = hf(**tiny_batch, output_hidden_states=True, output_attentions=True)
    close(a.last_hidden_state, b.last_hidden_state)
    close(a.pooler_output, b.pooler_output)
    assert len(a.hidden_states) == tiny_config.num_hidden_layers + 1
    for x, y in zip(a.hidden_states, b.hidden_states, strict=True):
        close(x, y)
    for x, y in zip(a.attentions, b.attentions, strict=True):
        assert x.shape == (3, 4, 11, 11)
        close(x, y)
    # the fast (SDPA) path and the explicit path agree
    close(ours(**tiny_batch).last_hidden_state, a.last_hidden_state)


# ----------------------------------------------------------------------------- causal mask
def reference_forward(model: BertModel, input_ids, token_type_ids, attention_mask, causal):
    """BERT written out from the paper with explicit loops over heads: an independent check."""
    p = {k: v for k, v in model.state_dict().items()}
    config = model.config
    batch, seq_len = input_ids.shape
    eps = config.layer_norm_eps

    def ln(x, name):
        return F.layer_norm(x, (x.shape[-1],), p[f"{name}.weight"], p[f"{name}.bias"], eps)

    def dense(x, name):
        return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]

    x = (
        p["embeddings.word_embeddings.weight"][input_ids]
        + p["embeddings.token_type_embeddings.weight"][token_type_ids]
        + p["embeddings.position_embeddings.weight"][torch.arange(seq_len)]
    )
    x = ln(x, "embeddings.LayerNorm")
    allowed = attention_mask[:, None, :].bool().expand(batch, seq_len, seq_len).clone()
    if causal:
        allowed &= torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    heads, size = config.num_attention_heads, config.head_size
    for i in range(config.num_hidden_layers):
        pre = f"encoder.layer.{i}"
        q = dense(x, f"{pre}.attention.self.query")
        k = dense(x, f"{pre}.attention.self.key")
        v = dense(x, f"{pre}.attention.self.value")
        outputs = []
        for h in range(heads):
            part = slice(h * size, (h + 1) * size)
            scores = q[..., part] @ k[..., part].transpose(1, 2) / math.sqrt(size)
            scores = scores.masked_fill(~allowed, float("-inf"))
            outputs.append(scores.softmax(-1) @ v[..., part])
        context = torch.cat(outputs, dim=-1)
        x = ln(
            x + dense(context, f"{pre}.attention.output.dense"), f"{pre}.attention.output.LayerNorm"
        )
        hidden = F.gelu(dense(x, f"{pre}.intermediate.dense"))
        x = ln(x + dense(hidden, f"{pre}.output.dense"), f"{pre}.output.LayerNorm")
    return x


@pytest.mark.parametrize("causal", [False, True])
@torch.no_grad()
def test_matches_reference_forward_with_and_without_causal_mask(tiny_config, tiny_batch, causal):
    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    expected = reference_forward(model, **tiny_batch, causal=causal)
    got = model(**tiny_batch, causal=causal)
    close(got.last_hidden_state, expected)
    explicit = model(**tiny_batch, causal=causal, output_attentions=True)
    close(explicit.last_hidden_state, expected)
    if causal:  # no probability mass on later tokens
        assert torch.all(explicit.attentions[0].triu(diagonal=1) == 0)


@torch.no_grad()
def test_causal_config_matches_hf_decoder_and_ignores_the_future(tiny_config, tiny_batch):
    tiny_config.is_decoder = True
    ours, hf = pair("BertModel", tiny_config)
    a = ours(**tiny_batch).last_hidden_state
    close(a, hf(**tiny_batch).last_hidden_state)
    changed = tiny_batch["input_ids"].clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 99
    b = ours(changed, tiny_batch["token_type_ids"], tiny_batch["attention_mask"]).last_hidden_state
    close(a[:, :6], b[:, :6])  # left context only
    assert not torch.allclose(a[0, 6:], b[0, 6:])


def test_dropout_is_active_only_in_training(tiny_config, tiny_batch):
    torch.manual_seed(0)
    model = BertModel(tiny_config)
    model.train()
    a = model(**tiny_batch).last_hidden_state
    b = model(**tiny_batch).last_hidden_state
    assert not torch.allclose(a, b)
    model.eval()
    close(model(**tiny_batch).last_hidden_state, model(**tiny_batch).last_hidden_state)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_config, tiny_batch):
    tiny_config.hidden_dropout_prob = tiny_config.attention_probs_dropout_prob = 0.0
    torch.manual_seed(0)
    model = BertModel(tiny_config).train()
    out = model(**tiny_batch)
    (out.last_hidden_state.sum() + out.pooler_output.sum()).backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.encoder.gradient_checkpointing = True
    out = model(**tiny_batch)
    (out.last_hidden_state.sum() + out.pooler_output.sum()).backward()
    for g, p in zip(plain, model.parameters(), strict=True):
        close(p.grad, g)


def test_initialisation_is_googles_truncated_normal():
    torch.manual_seed(0)
    model = BertModel(BertConfig.from_preset("mini", vocab_size=5000))
    weights = model.embeddings.word_embeddings.weight
    assert weights.abs().max() <= 0.04 + 1e-7  # truncated at 2 sigma
    assert 0.015 < weights.std() < 0.02  # a 2-sigma truncated N(0, 0.02) has std 0.0176
    assert torch.all(model.encoder.layer[0].attention.self.query.bias == 0)
    assert torch.all(model.encoder.layer[0].output.LayerNorm.weight == 1)


@pytest.mark.parametrize("preset,paper_millions", [("base", 110), ("large", 340)])
def test_parameter_counts_match_the_paper(preset, paper_millions):
    config = BertConfig.from_preset(preset)
    with torch.device("meta"):
        model = BertModel(config)
    count = model.num_parameters
    formula = 30_000 * config.hidden_size + 12 * config.num_hidden_layers * config.hidden_size**2
    print(
        f"\nBERT-{preset}: {count / 1e6:.1f}M parameters; 30k*H + 12*L*H^2 = {formula / 1e6:.1f}M; "
        f"paper {paper_millions}M"
    )
    assert abs(count / (paper_millions * 1e6) - 1) <= 0.015


@pytest.mark.parametrize(
    "bad,message",
    [
        (
            {"input_ids": torch.zeros(2, 65, dtype=torch.long)},
            "sequence length 65 exceeds max_position_embeddings",
        ),
        (
            {"input_ids": torch.full((1, 4), 99)},
            r"ids in \[99, 99\] but the model's vocab_size is 99",
        ),
        ({"input_ids": torch.zeros(4, dtype=torch.long)}, r"input_ids must be \(batch, seq_len\)"),
        (
            {
                "input_ids": torch.zeros(1, 4, dtype=torch.long),
                "token_type_ids": torch.full((1, 4), 2),
            },
            "type_vocab_size",
        ),
        (
            {"input_ids": torch.zeros(1, 4, dtype=torch.long), "attention_mask": torch.ones(1, 5)},
            r"attention_mask must be \(batch, 4\)",
        ),
    ],
)
def test_bad_inputs_get_clear_errors(tiny_config, bad, message):
    model = BertModel(tiny_config)
    with pytest.raises(ValueError, match=message):
        model(**bad)


# ----------------------------------------------------------------------------- unpadded path
def test_unpadded_encoder_equals_padded_on_real_tokens(tiny_config, tiny_batch):
    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    real = tiny_batch["attention_mask"].bool()
    with torch.no_grad():
        padded = model(**tiny_batch, output_hidden_states=True)
        packed = model(**tiny_batch, output_hidden_states=True, unpad=True)
        causal = model(**tiny_batch, unpad=True, causal=True)
    close(packed.last_hidden_state[real], padded.last_hidden_state[real])
    assert torch.all(packed.last_hidden_state[~real] == 0)
    close(packed.pooler_output, padded.pooler_output)
    for x, y in zip(packed.hidden_states, padded.hidden_states, strict=True):
        close(x[real], y[real])
    close(causal.last_hidden_state[real], model(**tiny_batch, causal=True).last_hidden_state[real])
    # gradients flow the same way
    model.train()
    tiny_config.hidden_dropout_prob = 0
    grads = []
    for unpad in (False, True):
        model = BertModel(
            dataclasses.replace(
                tiny_config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
            )
        )
        torch.manual_seed(0)
        model.init_weights()
        out = model(**tiny_batch, unpad=unpad)
        (out.last_hidden_state[real].sum() + out.pooler_output.sum()).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        close(a, b)


def test_a_batch_without_padding_attends_without_a_mask_and_gathers_nothing(
    tiny_config, tiny_batch, monkeypatch
):
    """Every cell real (SQuAD's windows): the unpadded path keeps the grid and gives SDPA no
    mask (with one, CUDA cannot take its flash kernel); the outputs are the padded path's."""
    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    full = {**tiny_batch, "attention_mask": torch.ones_like(tiny_batch["attention_mask"])}
    masks = []
    sdpa = model_module.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attn_mask"))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        padded = model(**full)
        assert masks and all(m is not None for m in masks)
        masks.clear()
        packed = model(**full, unpad=True)
        assert masks and all(m is None for m in masks)
        masks.clear()
        model(**tiny_batch, unpad=True)  # padding: masked as before
        assert masks and all(m is not None for m in masks)
        causal = model(**full, unpad=True, causal=True)
    close(packed.last_hidden_state, padded.last_hidden_state)
    close(causal.last_hidden_state, model(**full, causal=True).last_hidden_state)
    layout = TokenLayout.unpadded(full["attention_mask"], multiple=64)
    assert layout.index is None and layout.rows == full["input_ids"].numel()


def test_rows_rounded_for_few_shapes_change_nothing_at_real_tokens(
    tiny_config, tiny_batch, monkeypatch
):
    """Under CPU autocast the unpadded row count is rounded up (padding cells added) so that
    oneDNN sees few shapes; outputs at real tokens are unchanged and padding stays zero."""
    mask = tiny_batch["attention_mask"]
    real = mask.bool()
    layout = TokenLayout.unpadded(mask, multiple=8)  # 23 real tokens -> 24 rows
    assert len(layout.index) == 24 and set(real.reshape(-1).nonzero().squeeze(1).tolist()) < set(
        layout.index.tolist()
    )
    assert len(TokenLayout.unpadded(mask, multiple=64).index) == mask.numel()  # grid is full
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert unpad_module.row_multiple(torch.device("cpu")) == 64
    assert unpad_module.row_multiple(torch.device("cpu")) == 1
    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    with torch.no_grad():
        exact = model(**tiny_batch, output_hidden_states=True, unpad=True)
        rows = []
        model.encoder.layer[0].intermediate.dense.register_forward_hook(
            lambda module, args, output: rows.append(args[0].shape[:-1].numel())
        )
        monkeypatch.setattr(model_module, "row_multiple", lambda device: 8)
        rounded = model(**tiny_batch, output_hidden_states=True, unpad=True)
        last = []
        model.encoder.layer[-1].intermediate.dense.register_forward_hook(
            lambda module, args, output: last.append(args[0].shape[0])
        )
        positions = torch.tensor([[3, 5], [7, 1], [2, 1]])
        read = model(**tiny_batch, unpad=True, read_positions=positions)
    assert rows == [24, 24] and last == [16]  # 9 cells read, 7 rows added for the shape
    picked = torch.zeros_like(real)
    picked[:, 0] = True
    picked.scatter_(1, positions, True)
    close(read.last_hidden_state[picked], exact.last_hidden_state[picked])
    assert torch.all(read.last_hidden_state[~picked] == 0)
    close(rounded.last_hidden_state[real], exact.last_hidden_state[real])
    assert torch.all(rounded.last_hidden_state[~real] == 0)
    for x, y in zip(rounded.hidden_states, exact.hidden_states, strict=True):
        close(x[real], y[real])
        assert torch.all(x[~real] == 0)
    close(rounded.pooler_output, exact.pooler_output)


def test_rows_rounded_to_a_chosen_multiple(tiny_config, tiny_batch):
    """`rows_rounded_to` rounds the unpadded rows up on any device (CUDA graphs of a few row
    counts): the layers see the rounded count, real tokens' outputs and gradients unchanged."""
    torch.manual_seed(0)
    model = BertModel(tiny_config).eval()
    real = tiny_batch["attention_mask"].bool()
    rows = []
    model.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda module, args, output: rows.append(args[0].shape[:-1].numel())
    )
    outputs = []
    for multiple in (None, 8):
        model.rows_rounded_to = multiple
        model.zero_grad()
        out = model(**tiny_batch, unpad=True).last_hidden_state
        out[real].square().sum().backward()
        grad = model.encoder.layer[0].intermediate.dense.weight.grad.clone()
        outputs.append((out.detach(), grad))
    assert rows == [23, 24]  # 23 real tokens, one padding cell added
    close(outputs[1][0][real], outputs[0][0][real])
    assert torch.all(outputs[1][0][~real] == 0)
    close(outputs[1][1], outputs[0][1])


def _wide_batch(lengths: list[int], width: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, 99, (len(lengths), width), generator=generator)
    attention_mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    input_ids[attention_mask == 0] = 0
    token_type_ids = (torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None] // 2).long()
    return {"input_ids": input_ids, "token_type_ids": token_type_ids * attention_mask,
            "attention_mask": attention_mask}  # fmt: skip


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_inference_attends_sequence_by_sequence_on_the_cpu(tiny_config, precision):
    """Unpadded inference on a CPU, on a grid wide enough, attends over each sequence's own
    rows (`TokenLayout.spans`): no grid, no padded keys; what comes out at real tokens is the
    grid's, in fp32 and under bf16 autocast (rows rounded up to 64: added rows in the spans)."""
    torch.manual_seed(0)
    model = BertModel(dataclasses.replace(tiny_config, max_position_embeddings=128)).eval()
    bf16 = precision == "bf16"
    width = 100 if bf16 else 50  # at least by_sequence_from's width
    batch = _wide_batch([width, 37, width - 3, 1], width)
    real = batch["attention_mask"].bool()
    mask = batch["attention_mask"]
    outputs = {}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        assert unpad_module.by_sequence_from(torch.device("cpu")) <= width
        layout = model.layouts(mask, tuple(mask.shape), "cpu", unpad=True, causal=False).rows
        assert layout.spans is not None
        firsts, counts, keys = zip(*layout.spans, strict=True)
        assert list(keys) == mask.sum(1).tolist() and sum(counts) == layout.rows
        assert list(firsts) == [0, *torch.tensor(counts).cumsum(0)[:-1].tolist()]
        assert (layout.rows % 64 == 0 and counts[1] > keys[1]) == bf16  # rows added after 37
        for by_sequence in (True, False):
            model.attention_by_sequence = by_sequence
            outputs[by_sequence] = model(**batch, unpad=True)
            grid = model.layouts(mask, tuple(mask.shape), "cpu", unpad=True, causal=False)
            assert (grid.rows.spans is not None) == by_sequence
    tolerance = {"atol": 5e-2} if bf16 else {}
    ours, theirs = outputs[True], outputs[False]
    close(ours.last_hidden_state[real].float(), theirs.last_hidden_state[real].float(),
          **tolerance)  # fmt: skip
    assert torch.all(ours.last_hidden_state[~real] == 0)
    close(ours.pooler_output.float(), theirs.pooler_output.float(), **tolerance)


def test_attention_by_products_is_sdpa_s_in_fp32_within_bf16_rounding():
    """`_attention_by_products` on bf16 queries, keys and values: SDPA's output on the same
    values in fp32, to bf16's rounding of the result, for a padding mask, a left-to-right one,
    an additive bias (MPNet's) and none; a query grid narrower than the keys' too."""
    torch.manual_seed(0)
    batch, heads, width, size = 4, 4, 20, 8
    q, k, v = (torch.randn(batch, heads, width, size).mul(2).bfloat16() for _ in range(3))
    keys = (torch.arange(width)[None] < torch.tensor([20, 17, 5, 1])[:, None])[:, None, None, :]
    masks = {"padding": keys, "left to right": torch.ones(width, width).bool().tril() & keys,
             "bias": torch.randn(1, heads, width, width), "none": None}  # fmt: skip
    for name, mask in masks.items():
        ours = model_module._attention_by_products(q, k, v, mask, size**-0.5).float()
        fp32 = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                              scale=size**-0.5)  # fmt: skip
        torch.testing.assert_close(ours, fp32, rtol=1e-2, atol=2e-2, msg=name)
    asked = model_module._attention_by_products(q[:, :, :3], k, v, keys, size**-0.5).float()
    fp32 = F.scaled_dot_product_attention(q[:, :, :3].float(), k.float(), v.float(),
                                          attn_mask=keys, scale=size**-0.5)  # fmt: skip
    torch.testing.assert_close(asked, fp32, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_narrow_grids_attend_by_products_under_bf16(tiny_config, monkeypatch, causal):
    """CPU inference under bf16 autocast on a grid up to GRID_PRODUCTS_UNTIL wide attends by
    batched products with fp32 scores instead of SDPA's kernel: each layer's attention (its
    output projection's input), and every output, [CLS] alone read too, are SDPA's within
    bf16's rounding. With a gradient, in fp32, on a wider grid or a CPU with AMX, SDPA runs."""
    torch.manual_seed(0)
    model = BertModel(dataclasses.replace(tiny_config, max_position_embeddings=128)).eval()
    with torch.no_grad():  # scores of a few units, not the initial weights' near-zero ones
        for layer in model.encoder.layer:
            layer.attention.self.query.weight.mul_(20)
            layer.attention.self.key.weight.mul_(20)
    batch = _wide_batch([40, 37, 12, 1], 40)
    real = batch["attention_mask"].bool()
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention", counted)
    monkeypatch.setattr(model_module, "_has_amx", lambda: False)  # (as on this test's CPUs)
    contexts: list[torch.Tensor] = []
    for layer in model.encoder.layer:
        layer.attention.output.dense.register_forward_hook(
            lambda module, args, output: contexts.append(args[0].float())
        )
    outputs, attended = {}, {}
    widest = model_module.GRID_PRODUCTS_UNTIL
    for until in (widest, 39):  # 39: below this grid's width
        monkeypatch.setattr(model_module, "GRID_PRODUCTS_UNTIL", until)
        calls.clear()
        contexts.clear()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            outputs[until] = [model(**batch, unpad=True, causal=causal),
                              model(**batch, unpad=True, causal=causal, read_cls_only=True)]  # fmt: skip
        assert len(calls) == (0 if until >= 40 else 2 * tiny_config.num_hidden_layers)
        attended[until] = list(contexts)
    products, grid = outputs[widest], outputs[39]
    for ours, theirs in zip(attended[widest], attended[39], strict=True):
        assert ours.abs().max() > 0.2  # (attention that differs from a plain average)
        close(ours, theirs, atol=1e-2)
    close(products[0].last_hidden_state[real].float(), grid[0].last_hidden_state[real].float(),
          atol=5e-2)  # fmt: skip
    assert torch.all(products[0].last_hidden_state[~real] == 0)
    for ours, theirs in zip(products, grid, strict=True):
        close(ours.pooler_output.float(), theirs.pooler_output.float(), atol=5e-2)
    monkeypatch.setattr(model_module, "GRID_PRODUCTS_UNTIL", 96)
    for grad, autocast, amx in ((True, True, False), (False, False, False), (False, True, True)):
        monkeypatch.setattr(model_module, "_has_amx", lambda amx=amx: amx)
        calls.clear()
        with torch.set_grad_enabled(grad), torch.autocast("cpu", torch.bfloat16, autocast):
            model(**batch, unpad=True, causal=causal)
        assert len(calls) == tiny_config.num_hidden_layers, (grad, autocast, amx)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_last_layer_asks_only_where_read_when_attending_by_sequence(tiny_config, precision):
    """By sequence, the last layer computes queries and attention only at the rows read after
    it ([CLS], read positions; under autocast rounded up to 64 rows): what is read equals the
    full forward's."""
    torch.manual_seed(0)
    config = dataclasses.replace(tiny_config, max_position_embeddings=128)
    model = BertModel(config).eval()
    bf16 = precision == "bf16"
    batch = _wide_batch([100, 37, 97, 1], 100)
    real = batch["attention_mask"].bool()
    positions = torch.tensor([[3, 50], [7, 9], [2, 96], [0, 0]])
    picked = torch.zeros_like(real)
    picked[:, 0] = True
    picked.scatter_(1, positions, True)
    queries = []
    model.encoder.layer[-1].attention.self.query.register_forward_hook(
        lambda module, args, output: queries.append(args[0].shape[0])
    )
    tolerance = {"atol": 5e-2} if bf16 else {}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        full = model(**batch, unpad=True)
        cls = model(**batch, unpad=True, read_cls_only=True)
        read = model(**batch, unpad=True, read_positions=positions)
    rows = int(real.sum())
    assert queries == ([rows + (-rows % 64), 64, 64] if bf16 else [rows, 4, int(picked.sum())])
    close(cls.pooler_output.float(), full.pooler_output.float(), **tolerance)
    close(read.last_hidden_state[picked & real].float(),
          full.last_hidden_state[picked & real].float(), **tolerance)  # fmt: skip


def test_attention_by_sequence_only_where_it_applies(tiny_config):
    """The grid stays where attention by sequence is not measured faster or not the same
    attention: training, narrow grids (under 48, under autocast too), left-to-right models, parity,
    exported models, other devices, and masks with a token after padding (their spans would not
    be a prefix)."""
    model = BertModel(tiny_config).eval()

    def spans(width=60, **overrides):
        mask = _wide_batch([width, 20], width)["attention_mask"]
        kwargs = {"unpad": True, "causal": False, **overrides}
        return model.layouts(mask, tuple(mask.shape), "cpu", **kwargs).rows.spans

    assert spans() == ((0, 60, 60), (60, 20, 20))
    assert spans(causal=True) is None
    assert spans(40) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert spans(40) is None and spans(60) is not None
    left = _wide_batch([60, 20], 60)["attention_mask"].flip(1)  # real tokens last
    assert model.layouts(left, (2, 60), "cpu", unpad=True, causal=False).rows.index is not None
    assert model.layouts(left, (2, 60), "cpu", unpad=True, causal=False).rows.spans is None
    assert unpad_module.by_sequence_from(torch.device("meta")) is None
    model.train()  # the loop's backward lost to the grid in the fine-tuning loop
    assert spans() is None and spans(300) is None
    model.eval()
    set_dropout_parity(model)
    assert spans() is None
    set_dropout_parity(model, False)
    model.padded_only = True
    assert spans() is None


def test_attention_by_sequence_drops_probabilities_keeping_their_expectation():
    """`attend`'s dropout (what benchmarks/attention_by_sequence.py --training times against
    the grid): each sequence's probabilities dropped with bertkit.core.dropout's masks, the kept ones
    scaled, so the expectation holds and the masks differ from row to row."""
    lengths = [170, 90]
    mask = (torch.arange(170)[None, :] < torch.tensor(lengths)[:, None]).long()
    layout = TokenLayout.unpadded(mask, by_sequence=True)
    q = k = torch.zeros(sum(lengths), 32)  # uniform probabilities: 1/keys each
    v = torch.ones(sum(lengths), 32)
    torch.manual_seed(0)
    dropped = layout.attend(q, k, v, 4, 8**-0.5, dropout_p=0.3)
    assert 0.97 < dropped.mean().item() < 1.03  # each row: kept probabilities / 0.7
    assert dropped.std().item() > 0.02  # and the masks differ from row to row


def test_attention_by_sequence_passes_gradients_as_the_grid():
    """With gradients (an eval-mode forward that is differentiated: saliency, adversarial
    inputs) the rows' attention gives the grid's gradients."""
    generator = torch.Generator().manual_seed(0)
    lengths = [50, 12, 31]
    mask = (torch.arange(50)[None, :] < torch.tensor(lengths)[:, None]).long()
    by_sequence = TokenLayout.unpadded(mask, by_sequence=True)
    grid = TokenLayout.unpadded(mask)
    layer = BertModel(BertConfig(vocab_size=10, hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=4, intermediate_size=37)).encoder.layer[0]  # fmt: skip
    gradients = []
    for layout in (by_sequence, grid):
        q, k, v = (torch.randn(sum(lengths), 32, generator=generator.manual_seed(i),
                               requires_grad=True) for i in range(3))  # fmt: skip
        if layout is by_sequence:
            out = layout.attend(q, k, v, 4, 8**-0.5)
        else:
            out, _ = layer._grid_attention(q, k, v, mask.bool()[:, None, None, :], layout, 0.0,
                                           False)  # fmt: skip
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        gradients.append((out.detach(), q.grad, k.grad, v.grad))
    for ours, theirs in zip(*gradients, strict=True):
        close(ours, theirs)


@pytest.mark.parametrize("gather", [False, True])
def test_rows_gradient_is_index_selects_without_atomic_adds(gather):
    """`to_rows`' gradient is index_select's, bit for bit, though written by a copy (the
    atomic `index_add` was 5% of a compiled GPU step); with spare rows (`gather`), those that
    read the grid's last cell, a real token here, leave its gradient alone."""
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])  # 7 real: one row more for 4
    layout = TokenLayout.unpadded(mask, multiple=4, gather=gather)
    assert layout.spare == (3 if gather else 0) and layout.rows == 8
    assert layout._sources()[-1] == 9 and (layout.index[-1] == 10) == gather
    grid = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(layout.rows, 6, dtype=torch.float64)
    (layout.to_rows(grid) * weights).sum().backward()
    fast = grid.grad.clone()
    grid.grad = None
    reference = grid.reshape(10, 6).index_select(0, layout._sources())
    if gather:  # the spare row's product is dropped: it is past the grid's end
        reference = reference[: layout.rows - 1]
        weights = weights[: layout.rows - 1]
    (reference * weights).sum().backward()
    assert torch.equal(fast, grid.grad) and fast[1, 4].ne(0).all()
    with torch.no_grad():  # inference keeps the plain select (and what ONNX export traces)
        assert torch.equal(layout.to_rows(grid), grid.reshape(10, 6)[layout._sources()])
    torch._dynamo.reset()  # and compiled training traces it whole (no graph break there)
    rows = torch.compile(layout.to_rows, backend="eager", fullgraph=True)(grid)
    assert torch.equal(rows, grid.reshape(10, 6)[layout._sources()])


@pytest.mark.parametrize("unpad", [False, True])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("training", [True, False])
def test_last_layer_runs_only_where_read(tiny_config, tiny_batch, unpad, checkpointing, training):
    """`read_positions`: the same states and gradients at [CLS] and the read positions, zeros
    elsewhere, and the last layer's queries and feed-forward see only those rows; in training
    with the same dropout masks (attention's too) as the full forward."""
    torch.manual_seed(0)
    model = BertModel(tiny_config).train(training)
    assert tiny_config.attention_probs_dropout_prob > 0
    model.encoder.gradient_checkpointing = checkpointing
    positions = torch.tensor([[3, 5], [7, 9], [2, 1]])  # (2, 9) is padding in the unpadded path
    picked = torch.zeros(3, 11, dtype=torch.bool)
    picked[:, 0] = True
    picked.scatter_(1, positions, True)

    def run(**flags):
        model.zero_grad()
        torch.manual_seed(5)  # dropout on: the masks must not depend on what is read
        out = model(**tiny_batch, unpad=unpad, **flags)
        seen = out.last_hidden_state[picked & tiny_batch["attention_mask"].bool()]
        (seen.square().sum() + out.pooler_output.sum()).backward()
        return out, [p.grad.clone() for p in model.parameters()]

    rows, asked = [], []
    last = model.encoder.layer[-1]
    hooks = [
        last.intermediate.dense.register_forward_hook(
            lambda module, args, output: rows.append(args[0].shape[:-1].numel())
        ),
        last.attention.self.query.register_forward_hook(
            lambda module, args, output: asked.append(args[0].shape[:-1].numel())
        ),
    ]
    full, full_grads = run()
    part, part_grads = run(read_positions=positions)
    for hook in hooks:
        hook.remove()
    real = tiny_batch["attention_mask"].bool()
    close(part.last_hidden_state[picked & real], full.last_hidden_state[picked & real])
    assert torch.all(part.last_hidden_state[~picked] == 0)
    close(part.pooler_output, full.pooler_output)
    for a, b in zip(part_grads, full_grads, strict=True):
        close(a, b)
    read = int((picked & real).sum()) if unpad else int(picked.sum())
    assert rows[-1] == asked[-1] == read
    assert rows[0] == asked[0] == (int(real.sum()) if unpad else real.numel())


@pytest.mark.parametrize("cls", ["BertForSequenceClassification", "BertForTokenClassification"])
def test_training_with_dropout_draws_the_same_masks_padded_unpadded_and_in_hf(
    cls, tiny_config, tiny_batch, transformers
):
    """In parity mode, with dropout on, a seeded training step gives the same loss and
    gradients on the unpadded path (what training uses), the padded path and transformers: the
    masks do not depend on unpadding, so a fine-tuning run can be compared with transformers'
    step by step."""
    config = tiny_config.with_labels(3)
    torch.manual_seed(0)
    hf = getattr(transformers, cls)(hf_config(config))
    ours = set_dropout_parity(getattr(bertkit, cls)(config))
    load_state_dict_into(ours, hf.state_dict(), strict=True)
    real = tiny_batch["attention_mask"].bool()
    if cls == "BertForSequenceClassification":
        labels = torch.tensor([0, 2, 1])
    else:
        labels = torch.randint(0, 3, real.shape).masked_fill(~real, -100)

    def step(model, **flags):
        model.train().zero_grad()
        torch.manual_seed(123)
        loss = model(**tiny_batch, labels=labels, **flags).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    unpadded = step(ours)  # heads unpad in training
    encode = ours.bert.forward
    ours.bert.forward = lambda *args, **kwargs: encode(*args, **{**kwargs, "unpad": False})
    padded = step(ours)
    theirs = step(hf)
    for other in (padded, theirs):
        close(unpadded[0], other[0])
        for a, b in zip(unpadded[1], other[1], strict=True):
            close(a, b)


def test_left_to_right_model_pools_its_last_real_token(tiny_config, tiny_batch):
    """A causal model's [CLS] sees only itself, so the pooler (and every classifier on it) reads
    the last real token: a pooled vector that depends on the input, the same on the unpadded
    path a classifier takes."""
    config = dataclasses.replace(tiny_config, is_decoder=True)
    torch.manual_seed(0)
    model = BertModel(config).eval()
    with torch.no_grad():
        out = model(**tiny_batch)
        last = tiny_batch["attention_mask"].sum(1) - 1  # (3,): 10, 7, 3
        expected = torch.tanh(model.pooler.dense(out.last_hidden_state[torch.arange(3), last]))
        close(out.pooler_output, expected)
        changed = dict(tiny_batch, input_ids=tiny_batch["input_ids"].clone())
        changed["input_ids"][:, 2] += 1  # after [CLS]: invisible to it left to right
        assert not torch.allclose(model(**changed).pooler_output, out.pooler_output)
        unpadded = model(**tiny_batch, unpad=True, read_cls_only=True)
        close(unpadded.pooler_output, out.pooler_output)
    classifier = bertkit.BertForSequenceClassification(config.with_labels(2)).eval()
    with torch.no_grad():
        padded = classifier(**tiny_batch, output_hidden_states=True).logits  # the padded path
        close(classifier(**tiny_batch).logits, padded)


def test_read_rows_take_a_narrow_grid_of_queries():
    """A read layout's `queries`: every read row in its own sequence's line of a (B, width) grid
    (so it attends over its own keys), rows that only round the count up in cells left over
    without widening it, all cells distinct; the grid round-trips the rows and moves with the
    layout (as `host_layouts` moves it to a GPU)."""
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    layout = TokenLayout.unpadded(mask)
    keep = torch.zeros(3, 6, dtype=torch.bool)
    keep[:, 0] = True
    keep[2, [2, 5]] = True  # sequence 2 is read at three rows: the width is 3
    rows, read = layout.subset(keep, multiple=8, queries=True)  # 5 read rows + 3 added
    cells, width = read.queries
    assert len(rows) == 8 and width == 3 and len(set(cells.tolist())) == 8
    lines = cells // width
    added = torch.isin(read.index, read.added)
    assert torch.equal(lines[~added], read.index[~added] // 6)  # each read row in its line
    values = torch.randn(8, 4)
    grid = read.to_queries(values)
    assert grid.shape == (3, 3, 4) and torch.equal(read.from_queries(grid), values)
    moved = read.to("meta")
    assert moved.queries[0].device.type == "meta" and moved.queries[1] == width
    assert layout.subset(keep)[1].queries is None  # asked for only where the grid attends
