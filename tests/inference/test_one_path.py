"""One path from text to vectors: the same text gets the same vector through every door — the
Python `Embedder`, `bertkit embed`, serve's /embed and /v1/embeddings, and search's query
embedder — equal to `SentenceTransformer(path).encode`, for a sentence-transformers folder, a
plain BERT folder (no sentence-transformers files: cut where its tokenizer and positions
allow) and a family folder (RoBERTa, its positions offset by two)."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
import torch

from bertkit import cli
from bertkit.inference.embedder import Embedder
from bertkit.jobs import shards
from bertkit.jobs.embed import query_embedder
from bertkit.serve.engine import ServedModel

from helpers import WORDS

st = pytest.importorskip("sentence_transformers")
T = pytest.importorskip("transformers")

PLAIN_FILES = ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json")  # fmt: skip


def _texts() -> list[str]:
    """A text over 512 pieces, one between 128 and 256 (over the API's former 128), one between
    256 and 512 (over all-MiniLM-L6-v2's declared 256), short ones."""
    rng = random.Random(7)
    words = [w for w in WORDS if w.isalpha()]
    return [
        " ".join(rng.choices(words, k=700)),
        " ".join(rng.choices(words, k=180)),
        " ".join(rng.choices(words, k=330)),
        "A man is eating food.",
        "The bank raised its rates on Monday.",
        "cats",
    ]


def _roberta(folder):
    """A tiny random RoBERTa with 512 real positions (514 in its config), saved by
    transformers with a byte-level BPE tokenizer.json."""
    from tokenizers import ByteLevelBPETokenizer, processors

    folder.mkdir()
    bpe = ByteLevelBPETokenizer()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    bpe.train_from_iterator(WORDS * 3, vocab_size=400, min_frequency=1, special_tokens=specials)
    bpe._tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>"))
    )
    bpe.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "RobertaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "cls_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
        "mask_token": "<mask>", "model_max_length": 512}))  # fmt: skip
    torch.manual_seed(0)
    config = T.RobertaConfig(vocab_size=bpe.get_vocab_size(), type_vocab_size=1, hidden_size=32,
                             num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                             max_position_embeddings=514)  # fmt: skip
    T.RobertaModel(config).eval().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("one_path")
    plain = root / "plain"
    plain.mkdir()
    for name in PLAIN_FILES:
        shutil.copy(minilm_dir / name, plain / name)
    return {"sentence-transformers": minilm_dir, "plain": plain,
            "family": _roberta(root / "roberta")}  # fmt: skip


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["sentence-transformers", "plain", "family"])
def test_every_door_gives_sentence_transformers_vector(folders, kind, tmp_path, capsys):
    """Each door's vectors equal SentenceTransformer(path).encode's at fp32 (1e-5): unit length
    where the door normalises (the Python API, TEI's /embed, OpenAI's /v1/embeddings), as the
    folder declares where it follows the folder (`bertkit embed`, search's queries)."""
    folder, texts = folders[kind], _texts()
    model = st.SentenceTransformer(str(folder), device="cpu")
    wanted = model.encode(texts, convert_to_numpy=True)
    declared = kind == "sentence-transformers"  # the only one with a Normalize module
    # the length rule is sentence-transformers': the one text over 512 is cut everywhere
    embedder = Embedder(folder, precision="fp32", device="cpu", batch_size=4)
    assert embedder.max_seq_length == model.max_seq_length == (256 if declared else 512)
    assert embedder.inputs(texts)[1][0] > 512  # the long one was long enough to be cut
    np.testing.assert_allclose(embedder(texts), _unit(wanted), atol=1e-5)

    out = tmp_path / "vectors"
    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    argv = ["embed", "--model", str(folder), "--input", str(source), "--out", str(out),
            "--precision", "fp32", "--device", "cpu", "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    corpus = np.array(shards.vectors(out).column("vector").to_pylist(), np.float32)
    np.testing.assert_allclose(corpus, wanted, atol=1e-5)
    plan = json.loads((out / "manifest.json").read_text())["plan"]
    assert plan["max_seq_length"] == model.max_seq_length and plan["normalize"] == declared
    queries = query_embedder(plan, device="cpu").embed_texts(texts)
    np.testing.assert_allclose(queries, wanted, atol=1e-5)

    served = ServedModel(folder, precision="fp32", device="cpu")
    assert served.max_seq_length == model.max_seq_length
    items = served.parse("embed", {"inputs": texts, "truncate": True})
    np.testing.assert_allclose(np.array(served.run("embed", items)), _unit(wanted), atol=1e-5)
    items = served.parse("v1/embeddings", {"input": texts, "truncate": True})
    answer = served.shape("v1/embeddings", items, served.run("v1/embeddings", items))
    got = np.array([d["embedding"] for d in answer["data"]], np.float32)
    np.testing.assert_allclose(got, _unit(wanted), atol=1e-5)
