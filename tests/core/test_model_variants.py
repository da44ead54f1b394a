"""Beyond the paper: pre-LN layers and the GLU feed-forward (`BertConfig.layer_norm_position`,
`feed_forward`), against a forward written here from the weights alone, on every path of the
encoder, and through config.json."""

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from bertkit import BertConfig, BertForPreTraining, BertModel
from bertkit.pretraining.train import resolve_config, run_pretraining

from helpers import close, tiny_bert_config, tiny_settings

VARIANTS = [("pre", "mlp"), ("post", "glu"), ("pre", "glu")]


def variant(layer_norm: str, feed_forward: str, **overrides) -> BertConfig:
    return tiny_bert_config(layer_norm_position=layer_norm, feed_forward=feed_forward, **overrides)


def reference_forward(model: BertModel, batch: dict) -> torch.Tensor:
    """The encoder's last hidden state from the state dict, padded, eval mode."""
    c, w = model.config, model.state_dict()
    ids, segments, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.token_type_embeddings.weight"][segments]
        + w["embeddings.position_embeddings.weight"][: ids.shape[1]]
    )
    x = F.layer_norm(
        x, (c.hidden_size,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], 1e-12
    )

    def ln(t, name):
        return F.layer_norm(t, (c.hidden_size,), w[name + ".weight"], w[name + ".bias"], 1e-12)

    def lin(t, name):
        return t @ w[name + ".weight"].T + w[name + ".bias"]

    heads, size = c.num_attention_heads, c.head_size
    bias = (1 - mask[:, None, None, :].float()) * -1e9
    for i in range(c.num_hidden_layers):
        p = f"encoder.layer.{i}."
        inp = ln(x, p + "attention.output.LayerNorm") if c.layer_norm_position == "pre" else x

        def split(t):
            return t.view(*t.shape[:2], heads, size).transpose(1, 2)

        q, k, v = (split(lin(inp, p + "attention.self." + n)) for n in ("query", "key", "value"))
        probs = (q @ k.transpose(-1, -2) / math.sqrt(size) + bias).softmax(-1)
        context = (probs @ v).transpose(1, 2).flatten(2)
        attended = lin(context, p + "attention.output.dense")
        if c.layer_norm_position == "pre":
            x = x + attended
            inp = ln(x, p + "output.LayerNorm")
        else:
            x = inp = ln(x + attended, p + "attention.output.LayerNorm")
        up = lin(inp, p + "intermediate.dense")
        if c.feed_forward == "glu":
            h = F.gelu(up[..., : c.intermediate_size]) * up[..., c.intermediate_size :]
        else:
            h = F.gelu(up)
        down = lin(h, p + "output.dense")
        x = x + down if c.layer_norm_position == "pre" else ln(x + down, p + "output.LayerNorm")
    if c.layer_norm_position == "pre":
        x = ln(x, "encoder.LayerNorm")
    return x


@pytest.mark.parametrize("layer_norm,feed_forward", VARIANTS)
@torch.no_grad()
def test_variant_matches_a_reference_forward_on_every_path(layer_norm, feed_forward, tiny_batch):
    torch.manual_seed(0)
    model = BertModel(variant(layer_norm, feed_forward)).eval()
    for p in model.parameters():  # LayerNorm gains and biases away from 1 and 0 too
        p.add_(torch.randn_like(p) * 0.05)
    real = tiny_batch["attention_mask"].bool()
    expected = reference_forward(model, tiny_batch)
    for unpad in (False, True):
        out = model(**tiny_batch, unpad=unpad)
        close(out.last_hidden_state[real], expected[real])
        positions = torch.tensor([[3, 5], [7, 1], [2, 1]])
        part = model(**tiny_batch, unpad=unpad, read_positions=positions)
        picked = torch.zeros_like(real).scatter_(1, positions, True) & real
        close(part.last_hidden_state[picked], expected[picked])
        close(part.pooler_output, out.pooler_output)
    hidden = model(**tiny_batch, output_hidden_states=True, output_attentions=True)
    close(hidden.hidden_states[-1][real], expected[real])


@pytest.mark.parametrize("layer_norm,feed_forward", VARIANTS + [("post", "mlp")])
def test_parameters_counted_and_config_json_round_trips(layer_norm, feed_forward, tmp_path):
    config = variant(layer_norm, feed_forward)
    model = BertForPreTraining(config)
    assert config.parameter_estimate() == sum(p.numel() for p in model.bert.parameters())
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    paper = (layer_norm, feed_forward) == ("post", "mlp")
    # the paper's model writes what transformers writes; a variant says what it is
    assert ("layer_norm_position" in written) == (layer_norm == "pre")
    assert ("feed_forward" in written) == (feed_forward == "glu")
    assert config.is_paper_architecture == paper
    loaded = BertForPreTraining.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[2, 7, 9, 3, 11, 3]])
    close(loaded(ids).mlm_logits, model.eval()(ids).mlm_logits)
    if not paper:
        with pytest.raises(ValueError, match="cannot be written as a TF checkpoint"):
            config.to_dict("google")


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="layer_norm_position must be one of"):
        tiny_bert_config(layer_norm_position="sandwich")
    with pytest.raises(ValueError, match="feed_forward must be one of"):
        tiny_bert_config(feed_forward="moe")


def test_glu_flag_keeps_the_mlps_parameters():
    """--feed-forward glu cuts the intermediate size to 2/3 (a multiple of 8): BERT-tiny's 512
    becomes 344, within 1% of the MLP's parameters; a config already GLU is kept as it is."""
    mlp = resolve_config("tiny", 1000, 128, "mlm+nsp")
    glu = resolve_config("tiny", 1000, 128, "mlm+nsp", feed_forward="glu")
    assert (glu.feed_forward, glu.intermediate_size) == ("glu", 344)
    assert abs(glu.parameter_estimate() / mlp.parameter_estimate() - 1) < 0.01
    assert resolve_config(glu, 1000, 128, "mlm+nsp", feed_forward="glu") == glu
    with pytest.raises(ValueError, match="give an MLP config"):
        resolve_config(glu, 1000, 128, "mlm+nsp", feed_forward="mlp")
    pre = resolve_config("tiny", 1000, 128, "mlm", layer_norm="pre")
    assert pre.layer_norm_position == "pre" and pre.feed_forward == "mlp"


def test_pretraining_a_variant_learns_and_loads(setup, tmp_path):
    entries = run_pretraining(
        setup / "shards",
        tmp_path / "run",
        tiny_settings(setup, log_every=2),
        max_steps=8,
        warmup_steps=1,
        layer_norm="pre",
        feed_forward="glu",
        attention_init="local",
    )
    train = [e for e in entries if e.get("split") == "train"]
    assert train[-1]["loss"] < train[0]["loss"]
    config = BertConfig.from_json_file(tmp_path / "run" / "config.json")
    assert (config.layer_norm_position, config.feed_forward) == ("pre", "glu")
    model = BertForPreTraining.from_pretrained(tmp_path / "run")
    assert model.bert.encoder.LayerNorm is not None
    assert dataclasses.replace(config) == model.config


def test_a_variant_exports_to_onnx_and_answers_alike(minilm_dir, tmp_path):
    pytest.importorskip("onnxruntime")
    from bertkit.core.heads import BertForSequenceClassification
    from bertkit.core.tokenizer import BertTokenizer
    from bertkit.inference.export import export_onnx
    from bertkit.inference.loader import OnnxModel

    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    config = variant("pre", "glu", vocab_size=tokenizer.vocab_size).with_labels(3)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    export_onnx(tmp_path / "model", tmp_path / "onnx")
    ids = torch.randint(5, 1000, (3, 24))
    mask = torch.ones_like(ids)
    mask[0, 10:] = 0
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
    got = OnnxModel(tmp_path / "onnx")(input_ids=ids, attention_mask=mask).logits
    close(got, expected, atol=1e-4)
