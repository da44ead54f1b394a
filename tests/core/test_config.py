import json

import pytest
import torch

from bertkit import BertConfig, BertForPreTraining
from bertkit.core.config import PRESETS

from helpers import tiny_bert_config

# Google's released sizes as its README names them (L/H; A = H/64 throughout, intermediate 4H)
GOOGLE_SIZES = "2/128 tiny, 4/256 mini, 4/512 small, 8/512 medium, 12/768 base, 24/1024 large"


def test_presets_are_googles_released_sizes():
    sizes = dict(reversed(size.split()) for size in GOOGLE_SIZES.split(", "))
    assert list(PRESETS) == list(sizes)
    for name, size in sizes.items():
        config = BertConfig.from_preset(name)
        assert f"{config.num_hidden_layers}/{config.hidden_size}" == size
        assert config.num_attention_heads == config.hidden_size // 64
        assert config.intermediate_size == 4 * config.hidden_size
    # the paper's sizes (Sec. 3): BERT-Base 110M parameters, BERT-Large 340M, with its two heads
    for name, millions in (("base", 110), ("large", 340)):
        with torch.device("meta"):
            model = BertForPreTraining(BertConfig.from_preset(name))
        count = sum(p.numel() for p in model.parameters()) / 1e6
        assert count == pytest.approx(millions, rel=0.015), name
    assert BertConfig.from_preset("base") == BertConfig()  # the dataclass defaults are BERT-Base
    assert BertConfig.from_preset("mini", vocab_size=100).vocab_size == 100
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        BertConfig.from_preset("huge")


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("num_attention_heads", 5, "divisible by num_attention_heads"),
        ("hidden_size", 0, "hidden_size must be a positive integer"),
        ("num_hidden_layers", -1, "num_hidden_layers must be a positive integer"),
        ("vocab_size", 2.5, "vocab_size must be a positive integer"),
        ("hidden_act", "gelu2", "hidden_act 'gelu2' is unknown"),
        ("hidden_dropout_prob", 1.5, "hidden_dropout_prob must be in"),
        ("pad_token_id", 30522, "pad_token_id"),
        ("position_embedding_type", "relative_key", "position_embedding_type"),
    ],
)
def test_invalid_configs_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        BertConfig(**{field: value})


def test_google_bert_config_round_trip(tmp_path):
    google = {
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": 768,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "max_position_embeddings": 512,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
        "type_vocab_size": 2,
        "vocab_size": 30522,
    }
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(google))
    config = BertConfig.from_json_file(path)
    assert config == BertConfig.from_preset("base")
    config.to_json_file(tmp_path / "out.json", flavour="google")
    assert json.loads((tmp_path / "out.json").read_text()) == google


def test_google_multilingual_pooler_keys_are_accepted():
    config = BertConfig.from_dict(
        {"vocab_size": 105879, "directionality": "bidi", "pooler_type": "first_token_transform"}
    )
    assert config.vocab_size == 105879


def test_hf_config_round_trip_with_extras(tmp_path, minilm_dir):
    config = BertConfig.from_json_file(minilm_dir / "config.json")
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (
        6,
        384,
        12,
    )
    config.to_json_file(tmp_path / "config.json", architectures=["BertModel"])
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["model_type"] == "bert" and data["architectures"] == ["BertModel"]
    assert BertConfig.from_json_file(tmp_path / "config.json") == config
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertConfig.from_pretrained(tmp_path)
    assert hf.hidden_size == 384 and hf.layer_norm_eps == config.layer_norm_eps


def test_labels_round_trip_and_hf_num_labels():
    config = BertConfig.from_preset("tiny").with_labels(["neg", "neu", "pos"])
    assert config.num_labels == 3 and config.label2id == {"neg": 0, "neu": 1, "pos": 2}
    data = config.to_dict()
    assert data["id2label"] == {"0": "neg", "1": "neu", "2": "pos"}
    assert BertConfig.from_dict(data) == config
    assert BertConfig.from_dict({"vocab_size": 10, "num_labels": 5}).num_labels == 5
    assert BertConfig.from_preset("tiny").num_labels == 2


def test_unknown_keys_rejected_unless_lenient(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"vocab_size": 10, "rotary_dim": 64}))
    with pytest.raises(ValueError, match=r"config.json: unknown config keys \['rotary_dim'\]"):
        BertConfig.from_json_file(path)
    config = BertConfig.from_json_file(path, strict=False)
    assert config.extra == {"rotary_dim": 64}
    assert config.to_dict()["rotary_dim"] == 64


def test_bad_json_names_file_and_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "vocab_size": 10,\n  "hidden_size": ,\n}')
    with pytest.raises(ValueError, match=r"config.json:3:\d+: invalid JSON"):
        BertConfig.from_json_file(path)
    path.write_text(json.dumps({"hidden_size": 10}))
    with pytest.raises(ValueError, match="missing required config key 'vocab_size'"):
        BertConfig.from_json_file(path)
    path.write_text(json.dumps({"vocab_size": 10, "model_type": "t5"}))
    from bertkit.core.family import FAMILIES

    runs = ", ".join(FAMILIES)  # bert, roberta, xlm-roberta, mpnet, modernbert, electra, ...
    with pytest.raises(ValueError, match=f"model_type 't5' is not an architecture bertkit runs; it runs {runs}$"):  # fmt: skip
        BertConfig.from_json_file(path)
    path.write_text(json.dumps({"vocab_size": 10, "hidden_size": 30, "num_attention_heads": 4}))
    with pytest.raises(ValueError, match=r"config.json: BertConfig.hidden_size \(30\)"):
        BertConfig.from_json_file(path)


def test_an_unknown_model_type_is_refused_by_name_wherever_a_folder_is_read(tmp_path):
    """A folder's family is read in one place (`family_of_folder`): the tokenizer, the head
    the loader picks, the weights and the config all refuse a model_type bertkit does not run,
    naming the file and listing what it runs — none falls back to BERT."""
    from bertkit.core.checkpoint import read_state_dict
    from bertkit.core.family import FAMILIES
    from bertkit.core.model import BertModel
    from bertkit.core.tokenizer import BertTokenizer
    from bertkit.inference.loader import head_of

    folder = tmp_path / "t5"
    BertModel(tiny_bert_config()).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"model_type": "t5"}))
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    (folder / "tokenizer.json").write_text("{}")
    refused = (f"config.json: model_type 't5' is not an architecture bertkit runs; it runs "
               f"{', '.join(FAMILIES)}$")  # fmt: skip
    for read in (lambda: BertTokenizer.from_pretrained(folder), lambda: head_of(folder, {}),
                 lambda: read_state_dict(folder), lambda: BertModel.from_pretrained(folder)):  # fmt: skip
        with pytest.raises(ValueError, match=refused):
            read()


def test_absurd_sizes_are_refused_with_the_figures_before_any_allocation():
    from bertkit import BertModel

    base = BertConfig.from_preset("base")
    assert base.parameter_estimate() == sum(p.numel() for p in BertModel(base).parameters())
    for huge in (
        dict(hidden_size=10**6, num_attention_heads=1),
        dict(num_hidden_layers=10**6),
        dict(vocab_size=10**10),
    ):
        with pytest.raises(ValueError, match=r"B parameters: .* GiB in fp32 .* more than this"):
            BertConfig(**{"vocab_size": 30522, **huge}).validate()
