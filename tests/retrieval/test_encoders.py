"""Retrieval encoders as sentence-transformers saves them: prompts and Matryoshka dimensions
through every door — `Embedder`, `bertkit embed` with its manifest, `index` and `search`'s
queries, serve's /embed and /v1/embeddings — each equal to sentence-transformers' own
`encode_document` / `encode_query` / `truncate_dim` at fp32 (1e-5)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertkit import cli
from bertkit.errors import InputError
from bertkit.inference.embedder import Embedder
from bertkit.jobs import shards
from bertkit.serve.engine import ServedModel

st = pytest.importorskip("sentence_transformers")
from sentence_transformers.sentence_transformer import modules as st_models  # noqa: E402

T = pytest.importorskip("transformers")

PROMPTS = {"query": "query: ", "document": "passage: "}
TEXTS = ["how many people live in paris", "the capital of france is paris",
         "a cat sat on the mat", "stock markets fell on monday " * 4]  # fmt: skip
QUERIES = ["where is paris", "what fell on monday"]
WIDTH, CUT = 32, 16


@pytest.fixture(scope="module")
def prompted(tmp_path_factory, minilm_dir):
    """A tiny random encoder (a real uncased vocabulary) saved by sentence-transformers 6 with
    a query and a document prompt, mean pooling and a Normalize module."""
    root = tmp_path_factory.mktemp("prompted")
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(0)
    config = T.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=WIDTH, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=37)  # fmt: skip
    T.BertModel(config).save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    modules = [st_models.Transformer(str(root / "base"), max_seq_length=64),
               st_models.Pooling(WIDTH, "mean"), st_models.Normalize()]  # fmt: skip
    st.SentenceTransformer(modules=modules, prompts=PROMPTS, device="cpu").save(str(root / "st"))
    return root / "st"


def theirs(folder, **kwargs):
    return st.SentenceTransformer(str(folder), device="cpu", **kwargs)


def test_the_embedder_takes_prompts_by_role_and_cuts_dimensions(prompted):
    reference = theirs(prompted, truncate_dim=CUT)
    embedder = Embedder(prompted, precision="fp32", truncate_dim=CUT)
    assert embedder.dimension == CUT and embedder.prompt_name is None  # no default declared
    assert embedder.prompt_for("query") == "query"
    assert embedder.prompt_for("document") == "document"
    for role, name in (("query", "query"), ("document", "document")):
        wanted = getattr(reference, f"encode_{role}")(TEXTS, normalize_embeddings=True)
        np.testing.assert_allclose(embedder(TEXTS, prompt_name=name), wanted, atol=1e-5)
    # the direction of sentence-transformers' own cut (which leaves a cut unit vector short)
    cut = reference.encode(TEXTS)
    np.testing.assert_allclose(embedder(TEXTS), cut / np.linalg.norm(cut, axis=1, keepdims=True),
                               atol=1e-5)  # fmt: skip
    assert np.linalg.norm(cut, axis=1).max() < 0.999
    with pytest.raises(ValueError, match=f"truncate_dim must be from 1 to the model's {WIDTH} "):
        Embedder(prompted, truncate_dim=WIDTH + 1)
    with pytest.raises(ValueError, match="no prompt named 'passage' .*declares document, query"):
        embedder(TEXTS, prompt_name="passage")


def test_embed_index_and_search_with_prompts_and_dimensions(prompted, tmp_path, capsys):
    """`bertkit embed --dimensions` embeds the corpus with the document prompt, records both in
    the manifest; `index` keeps them, and search embeds its queries with the query prompt at
    the same size: the stored vectors and the queries equal sentence-transformers'."""
    pytest.importorskip("lancedb")
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    out = tmp_path / "vectors"
    argv = ["embed", "--model", str(prompted), "--input", str(source), "--out", str(out),
            "--dimensions", str(CUT), "--precision", "fp32", "--device", "cpu", "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    reference = theirs(prompted, truncate_dim=CUT)
    stored = np.array(shards.vectors(out).column("vector").to_pylist(), np.float32)
    np.testing.assert_allclose(stored, reference.encode_document(TEXTS, normalize_embeddings=True),
                               atol=1e-5)  # fmt: skip
    plan = json.loads((out / "manifest.json").read_text())["plan"]
    assert (plan["prompt_name"], plan["prompt"]) == ("document", "passage: ")
    assert (plan["dimensions"], plan["dimension"]) == (CUT, CUT)

    table = tmp_path / "docs.lance"
    assert cli.main(["index", str(out), "--out", str(table)]) == 0
    from bertkit.retrieval.index import Searcher

    searcher = Searcher(table)
    queries = reference.encode_query(QUERIES, normalize_embeddings=True)
    np.testing.assert_allclose(searcher.embed_queries(QUERIES), queries, atol=1e-5)
    hits = searcher(QUERIES[0], top=4)
    scores = stored @ queries[0]
    assert [h["score"] for h in hits] == pytest.approx(sorted(scores, reverse=True), abs=1e-5)

    # an explicit prompt is recorded, and a model without a query prompt's queries take it
    again = tmp_path / "again"
    assert cli.main([*argv[:6], str(again), "--prompt-name", "query", "--quiet"]) == 0
    assert json.loads((again / "manifest.json").read_text())["plan"]["prompt_name"] == "query"
    assert cli.main([*argv[:6], str(tmp_path / "no"), "--prompt-name", "title"]) == 2
    assert "no prompt named 'title'" in capsys.readouterr().err


def test_serve_takes_a_prompt_name_and_dimensions(prompted):
    """/embed and /v1/embeddings: "prompt_name" and "dimensions" as text-embeddings-inference
    and OpenAI take them; an unknown name is refused listing the folder's; the length check
    counts the prompt."""
    served = ServedModel(prompted, precision="fp32", device="cpu")
    reference = theirs(prompted)
    body = {"inputs": TEXTS, "prompt_name": "query", "dimensions": CUT}
    got = np.array(served.run("embed", served.parse("embed", body)))
    wanted = theirs(prompted, truncate_dim=CUT).encode_query(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(got, wanted, atol=1e-5)
    # not normalised: the pooled vector's first coordinates, as they are
    raw = np.array(served.run("embed", served.parse("embed", {**body, "normalize": False})))
    full = served.run("embed", served.parse("embed", {"inputs": TEXTS, "prompt_name": "query",
                                                      "normalize": False}))  # fmt: skip
    np.testing.assert_array_equal(raw, np.array(full)[:, :CUT])
    items = served.parse("v1/embeddings", {"input": TEXTS, "prompt_name": "document"})
    answer = served.shape("v1/embeddings", items, served.run("v1/embeddings", items))
    np.testing.assert_allclose(np.array([d["embedding"] for d in answer["data"]]),
                               reference.encode_document(TEXTS), atol=1e-5)  # fmt: skip
    assert answer["usage"]["prompt_tokens"] > sum(
        len(served.tokenizer.encode_ids([t])[0]) + 2 for t in TEXTS
    )  # the prompts counted
    with pytest.raises(InputError, match="'title' is not a prompt of this model .*document, query"):
        served.parse("embed", {"inputs": ["x"], "prompt_name": "title"})
    with pytest.raises(InputError, match='"dimensions" must be a whole number from 1 to 32'):
        served.parse("embed", {"inputs": ["x"], "dimensions": 33})
    # 62 pieces fit 64 alone; with "passage: " (2 pieces) before them they do not
    text = " ".join(["cat"] * 62)
    served.parse("embed", {"inputs": [text]})
    with pytest.raises(InputError, match="inputs\\[0\\]: 66 pieces; the model reads 64") as err:
        served.parse("embed", {"inputs": [text], "prompt_name": "document"})
    assert err.value.status == 413
