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
    with pytest.raises(ValueError, match=f"must be from 1 to the model's {WIDTH} "):
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


# --------------------------------------------------------------------------- sparse (SPLADE)
@pytest.fixture(scope="module")
def splade(tmp_path_factory, minilm_dir):
    """A tiny random masked LM (a real uncased vocabulary; its output bias lowered so most
    logits are negative and the vectors sparse) saved by sentence-transformers 6 as a
    SparseEncoder with SPLADE pooling (max, relu)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    root = tmp_path_factory.mktemp("splade")
    tokenizer = T.AutoTokenizer.from_pretrained(minilm_dir)
    torch.manual_seed(1)
    config = T.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=WIDTH, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=37)  # fmt: skip
    mlm = T.BertForMaskedLM(config).eval()
    with torch.no_grad():
        mlm.cls.predictions.bias.fill_(-0.25)
    mlm.save_pretrained(root / "mlm")
    tokenizer.save_pretrained(root / "mlm")
    modules = [st_models.Transformer(str(root / "mlm"), transformer_task="fill-mask"),
               SpladePooling("max")]  # fmt: skip
    SparseEncoder(modules=modules, device="cpu").save(str(root / "sparse"))
    return root / "sparse"


def dense_of(vectors, width):
    out = np.zeros((len(vectors), width), np.float32)
    for row, (indices, values) in enumerate(vectors):
        out[row, indices] = values
    return out


@pytest.mark.parametrize("pooling,activation", [("max", "relu"), ("sum", "log1p_relu")])
def test_sparse_vectors_equal_sparse_encoders(splade, tmp_path, pooling, activation):
    from sentence_transformers import SparseEncoder

    folder = tmp_path / "variant"
    import shutil

    shutil.copytree(splade, folder)
    settings = json.loads((folder / "1_SpladePooling" / "config.json").read_text())
    settings |= {"pooling_strategy": pooling, "activation_function": activation}
    (folder / "1_SpladePooling" / "config.json").write_text(json.dumps(settings))
    theirs = SparseEncoder(str(folder), device="cpu").encode(TEXTS).to_dense().numpy()
    embedder = Embedder(folder, precision="fp32", batch_size=3)  # two batches, long first
    mine = embedder.sparse(TEXTS)
    np.testing.assert_allclose(dense_of(mine, theirs.shape[1]), theirs, atol=1e-5, rtol=1e-5)
    assert all(np.all(np.diff(indices) > 0) for indices, _ in mine)  # by index, no zeros
    assert all(np.all(values > 0) for _, values in mine)
    nonzero = (theirs > 0).sum(1)
    assert [len(i) for i, _ in mine] == nonzero.tolist() and nonzero.max() < theirs.shape[1] / 2


def test_sparse_through_serve_and_embed(splade, prompted, tmp_path, capsys):
    """/embed_sparse answers text-embeddings-inference's shape; `bertkit embed` on a
    SparseEncoder folder writes (index, value) lists; a dense model's server refuses the route
    by name."""
    from sentence_transformers import SparseEncoder

    theirs = SparseEncoder(str(splade), device="cpu").encode(TEXTS).to_dense().numpy()
    served = ServedModel(splade, precision="fp32", device="cpu")
    items = served.parse("embed_sparse", {"inputs": TEXTS})
    answer = served.shape("embed_sparse", items, served.run("embed_sparse", items))
    got = [(np.array([e["index"] for e in a]), np.array([e["value"] for e in a])) for a in answer]
    np.testing.assert_allclose(dense_of(got, theirs.shape[1]), theirs, atol=1e-5, rtol=1e-5)
    assert not ServedModel(prompted, device="cpu").endpoints["embed_sparse"]
    assert "no masked-LM head" in ServedModel(prompted, device="cpu").missing("embed_sparse")

    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in [*TEXTS, ""]))
    out = tmp_path / "sparse"
    argv = ["embed", "--model", str(splade), "--input", str(source), "--out", str(out),
            "--precision", "fp32", "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    table = shards.vectors(out, ("id", "indices", "values"))
    assert table.column("indices").to_pylist()[-1] is None  # the empty row: no vector
    indices, values = (table.column(c).to_pylist()[:4] for c in ("indices", "values"))
    indices = [np.array(i) for i in indices]
    stored = [(np.array(i), np.array(v)) for i, v in zip(indices, values, strict=True)]
    np.testing.assert_allclose(dense_of(stored, theirs.shape[1]), theirs, atol=1e-5, rtol=1e-5)
    plan = json.loads((out / "manifest.json").read_text())["plan"]
    assert plan["vectors"] == "sparse" and plan["splade"] == {"pooling": "max",
                                                              "activation": "relu"}  # fmt: skip
    # `bertkit predict` on a SparseEncoder folder: each text's (indices, values), as a file's
    capsys.readouterr()
    assert cli.main(["predict", "--model", str(splade), "--precision", "fp32", *TEXTS[:2]]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["indices"] for p in printed] == [s.tolist() for s in indices[:2]]
    rows = tmp_path / "answers.jsonl"
    assert cli.main(["predict", "--model", str(splade), "--precision", "fp32", "--input",
                     str(source), "--output", str(rows)]) == 0  # fmt: skip
    written = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [w["values"] for w in written[:4]] == values and written[-1]["indices"] is None


def squad_beir(root, documents: int, queries: int):
    """A BEIR folder of real text: SQuAD v1.1 dev's first paragraphs as the documents (their
    article's title beside them), the first question of every other paragraph as a query,
    judged relevant to its own paragraph."""
    from helpers import data_path

    articles = json.loads(data_path("squad", "dev-v1.1.json").read_text())["data"]
    paragraphs = [(a["title"].replace("_", " "), p) for a in articles for p in a["paragraphs"]]
    corpus, asked, qrels = [], [], ["query-id\tcorpus-id\tscore"]
    for n, (title, paragraph) in enumerate(paragraphs[:documents]):
        corpus.append({"_id": f"d{n}", "title": title, "text": paragraph["context"]})
        if n % 2 == 0 and len(asked) < queries:
            asked.append({"_id": f"q{n}", "text": paragraph["qas"][0]["question"]})
            qrels.append(f"q{n}\td{n}\t1")
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in asked))
    (root / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n")
    return root, corpus, asked


def ranked(scores, ids, top=100):
    return [[ids[i] for i in np.argsort(-row, kind="stable")[:top]] for row in scores]


def test_hybrid_retrieval_is_the_fusion_of_both_and_scored_as_trec_eval(prompted, splade,
                                                                         tmp_path, capsys):  # fmt: skip
    """`evaluate --retrieval --sparse-model`: the dense model's ranking (its document prompt on
    the corpus, its query prompt on the queries) and the SPLADE model's, each equal to
    sentence-transformers' own, and BM25's (`--full-text`), fused by reciprocal rank (k = 60);
    the run's measures equal pytrec_eval's, and each part's are reported."""
    pytest.importorskip("pytrec_eval")
    from sentence_transformers import SparseEncoder

    from bertkit.retrieval.beir import read_qrels
    from bertkit.retrieval.ranking import fused

    from helpers import trec_eval_scores

    data, corpus, asked = squad_beir(tmp_path / "beir", documents=60, queries=20)
    out = tmp_path / "scored"
    argv = ["evaluate", "--retrieval", "--model", str(prompted), "--sparse-model", str(splade),
            "--full-text", "--data", str(data), "--out", str(out), "--device", "cpu"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)
    assert result["retrieval"] == "hybrid"
    assert set(result["parts"]) == {"dense", "sparse", "full_text"}
    assert (result["queries"], result["documents"]) == (20, 60)

    documents = [f"{d['title']} {d['text']}" for d in corpus]
    questions = [q["text"] for q in sorted(asked, key=lambda q: q["_id"])]
    ids = [d["_id"] for d in corpus]
    dense = theirs(prompted)
    dense_scores = (dense.encode_query(questions, normalize_embeddings=True)
                    @ dense.encode_document(documents, normalize_embeddings=True).T)  # fmt: skip
    sparse = SparseEncoder(str(splade), device="cpu")
    sparse_scores = (sparse.encode_query(questions).to_dense().numpy()
                     @ sparse.encode_document(documents).to_dense().numpy().T)  # fmt: skip
    import lancedb
    import pyarrow as pa

    words = lancedb.connect(str(tmp_path / "words")).create_table(
        "t", data=pa.table({"id": ids, "text": documents}))  # fmt: skip
    from lancedb.index import FTS

    words.create_index("text", config=FTS())
    by_words = []
    for question in questions:
        found = words.search(question, query_type="fts").limit(100).to_arrow()
        order = np.argsort(-found.column("_score").to_numpy(), kind="stable")
        by_words.append([found.column("id")[int(i)].as_py() for i in order])
    expected, _ = fused([ranked(dense_scores, ids), ranked(sparse_scores, ids), by_words],
                        top=100)  # fmt: skip
    run: dict[str, list[str]] = {}
    for line in (out / "run.tsv").read_text().splitlines():
        run.setdefault(line.split()[0], []).append(line.split()[2])
    assert [run[q] for q in sorted(run)] == expected
    qrels = read_qrels(data / "qrels" / "test.tsv")
    theirs_scores = trec_eval_scores(out / "run.tsv", qrels)
    assert {name: result[name] for name in theirs_scores} == theirs_scores


def test_hybrid_search_fuses_dense_sparse_and_full_text(prompted, splade, tmp_path, capsys):
    """`bertkit search --sparse-index --full-text`: the dense table's ranking, the sparse
    table's and the BM25 index's, fused by reciprocal rank; each hit carries each side's
    score; a table without a full-text index is refused by name."""
    pytest.importorskip("lancedb")
    from sentence_transformers import SparseEncoder

    from bertkit.retrieval.index import Searcher
    from bertkit.retrieval.ranking import fused

    _, corpus, asked = squad_beir(tmp_path / "beir", documents=60, queries=5)
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": d["_id"], "text": d["text"]}) + "\n"
                              for d in corpus))  # fmt: skip
    for model, name in ((prompted, "dense"), (splade, "sparse")):
        argv = ["embed", "--model", str(model), "--input", str(source), "--out",
                str(tmp_path / name), "--id-column", "id", "--keep-columns", "text",
                "--precision", "fp32", "--quiet"]  # fmt: skip
        assert cli.main(argv) == 0, capsys.readouterr().err
    assert cli.main(["index", str(tmp_path / "dense"), "--out", str(tmp_path / "dense.lance"),
                     "--full-text"]) == 0  # fmt: skip
    assert cli.main(["index", str(tmp_path / "sparse"), "--out",
                     str(tmp_path / "sparse.lance")]) == 0  # fmt: skip
    query = asked[3]["text"]
    argv = ["search", "--index", str(tmp_path / "dense.lance"), "--sparse-index",
            str(tmp_path / "sparse.lance"), "--full-text", query, "--top", "10"]  # fmt: skip
    capsys.readouterr()
    assert cli.main(argv) == 0
    hits = [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    texts, ids = [d["text"] for d in corpus], [d["_id"] for d in corpus]
    dense = theirs(prompted)
    by_dense = ranked(dense.encode_query([query], normalize_embeddings=True)
                      @ dense.encode_document(texts, normalize_embeddings=True).T, ids)  # fmt: skip
    sparse = SparseEncoder(str(splade), device="cpu")
    by_sparse = ranked(sparse.encode_query([query]).to_dense().numpy()
                       @ sparse.encode_document(texts).to_dense().numpy().T, ids)  # fmt: skip
    table = Searcher(tmp_path / "dense.lance").table
    bm25 = table.search(query, query_type="fts").limit(100).to_arrow()
    by_words = [[bm25.column("id")[int(i)].as_py()
                 for i in np.argsort(-bm25.column("_score").to_numpy(), kind="stable")]]  # fmt: skip
    assert by_words[0]  # the question shares words with some paragraphs
    expected, scores = fused([by_dense, by_sparse, by_words], top=10)
    assert [h["id"] for h in hits] == expected[0]
    assert [h["score"] for h in hits] == pytest.approx(scores[0].tolist(), abs=1e-6)
    assert all(set(h["scores"]) <= {"dense", "sparse", "full_text"} and h["text"] for h in hits)
    assert cli.main(["search", "--index", str(tmp_path / "sparse.lance"), "--full-text",
                     query]) == 2  # fmt: skip
    assert "no full-text index" in capsys.readouterr().err


# --------------------------------------------------------------------------- multi-vector
@pytest.fixture(scope="module")
def colbert(prompted, tmp_path_factory):
    """A tiny random ColBERT saved by sentence-transformers 6 as a MultiVectorEncoder: a linear
    projection to 24 dimensions, punctuation skipped in documents, [unused0]/[unused1] prompts,
    queries cut or [MASK]-padded to 16 pieces that nothing attends to, documents cut at 48."""
    import string

    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    root = tmp_path_factory.mktemp("colbert")
    torch.manual_seed(2)
    tokens = {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}
    modules = [
        Transformer(str(prompted.parent / "base"), query_length=16, document_length=48,
                    query_expansion={"strategy": "fixed", "length": 16}),
        Dense(WIDTH, 24, bias=False, activation_function=torch.nn.Identity(), **tokens),
        MultiVectorMask(list(string.punctuation)), Normalize(**tokens),
    ]  # fmt: skip
    MultiVectorEncoder(modules=modules, device="cpu",
                       prompts={"query": "[unused0] ", "document": "[unused1] "}
                       ).save(str(root / "colbert"))  # fmt: skip
    return root / "colbert"


QUESTIONS = ["where is paris?", "what did the stock markets do on monday, and why?"]
DOCUMENTS = [*TEXTS, "Paris, the capital; of France!", "x"]


@pytest.mark.parametrize("expansion", [{"strategy": "fixed", "length": 16},
                                       {"strategy": "min", "length": 12, "attend": True}])  # fmt: skip
def test_multi_vectors_and_maxsim_equal_multi_vector_encoders(colbert, tmp_path, expansion):
    import shutil

    from sentence_transformers import MultiVectorEncoder

    from bertkit.core.embedding import maxsim

    folder = tmp_path / "variant"
    shutil.copytree(colbert, folder)
    settings = json.loads((folder / "sentence_bert_config.json").read_text())
    settings["query_expansion"] = {"attend": False, "token": None, **expansion}
    (folder / "sentence_bert_config.json").write_text(json.dumps(settings))
    reference = MultiVectorEncoder(str(folder), device="cpu")
    embedder = Embedder(folder, precision="fp32", batch_size=2)
    assert embedder.token_dimension == 24
    for role, texts in (("query", QUESTIONS), ("document", DOCUMENTS)):
        wanted = getattr(reference, f"encode_{role}")(texts, convert_to_numpy=True)
        got = embedder.multi_vector(texts, role=role)
        assert [g.shape for g in got] == [w.shape for w in wanted]
        for g, w in zip(got, wanted, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5)
    # the skip list: a document's punctuation has no vector (a query's has)
    # [CLS] [ unused ##1 ] paris , . [SEP]: the brackets, comma and full stop have none
    assert len(embedder.multi_vector(["paris , ."])[0]) == 5
    assert len(embedder.multi_vector(["paris , ."], role="document", prompt_name="query")[0]) == 5
    scores = reference.similarity(reference.encode_query(QUESTIONS),
                                  reference.encode_document(DOCUMENTS))  # fmt: skip
    queries, documents = (embedder.multi_vector(QUESTIONS, role="query"),
                          embedder.multi_vector(DOCUMENTS))  # fmt: skip
    mine = torch.stack([maxsim(torch.from_numpy(q), [torch.from_numpy(d) for d in documents])
                        for q in queries])  # fmt: skip
    np.testing.assert_allclose(mine.numpy(), scores.numpy(), atol=1e-4)


def test_multi_vectors_through_serve_embed_index_and_search(colbert, prompted, tmp_path, capsys):
    """/embed_all and /rerank (MaxSim) answer as MultiVectorEncoder scores; `bertkit embed`
    on a MultiVectorEncoder folder writes each row's per-token vectors; `index` puts them in
    LanceDB, `search` over that table ranks every row by MaxSim, and `search --maxsim` reorders
    a dense table's hits by it."""
    pytest.importorskip("lancedb")
    from sentence_transformers import MultiVectorEncoder

    reference = MultiVectorEncoder(str(colbert), device="cpu")
    scores = reference.similarity(reference.encode_query(QUESTIONS[:1]),
                                  reference.encode_document(DOCUMENTS))[0].numpy()  # fmt: skip
    served = ServedModel(colbert, precision="fp32", device="cpu")
    for task in ("query", "document"):
        texts = QUESTIONS if task == "query" else DOCUMENTS
        items = served.parse("embed_all", {"inputs": texts, "task": task})
        got = served.shape("embed_all", items, served.run("embed_all", items))
        wanted = getattr(reference, f"encode_{task}")(texts, convert_to_numpy=True)
        for g, w in zip(got, wanted, strict=True):
            np.testing.assert_allclose(np.array(g), w, atol=1e-5)
    items = served.parse("rerank", {"query": QUESTIONS[0], "texts": DOCUMENTS})
    answer = served.shape("rerank", items, served.run("rerank", items))
    assert [a["index"] for a in answer] == np.argsort(-scores, kind="stable").tolist()
    assert [a["score"] for a in answer] == pytest.approx(sorted(scores, reverse=True), abs=1e-4)
    with pytest.raises(InputError, match='"task" must be "query" or "document"'):
        served.parse("embed_all", {"inputs": ["x"], "task": "passage"})

    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": f"d{n}", "text": t}) + "\n"
                              for n, t in enumerate(DOCUMENTS)))  # fmt: skip
    for model, name in ((colbert, "late"), (prompted, "dense")):
        argv = ["embed", "--model", str(model), "--input", str(source), "--out",
                str(tmp_path / name), "--id-column", "id", "--keep-columns", "text",
                "--precision", "fp32", "--quiet", "--index", str(tmp_path / f"{name}.lance")]  # fmt: skip
        assert cli.main(argv) == 0, capsys.readouterr().err
    stored = shards.vectors(tmp_path / "late", ("id", "vectors")).column("vectors").to_pylist()
    for row, wanted in zip(stored, reference.encode_document(DOCUMENTS, convert_to_numpy=True),
                           strict=True):  # fmt: skip
        np.testing.assert_allclose(np.array(row, np.float32), wanted, atol=1e-5)
    plan = json.loads((tmp_path / "late" / "manifest.json").read_text())["plan"]
    assert (plan["vectors"], plan["dimension"]) == ("multi-vector", 24)
    capsys.readouterr()
    assert cli.main(["predict", "--model", str(colbert), "--precision", "fp32", DOCUMENTS[4]]) == 0
    printed = json.loads(capsys.readouterr().out)["vectors"]
    np.testing.assert_allclose(np.array(printed, np.float32),
                               reference.encode_document(DOCUMENTS[4:5], convert_to_numpy=True)[0],
                               atol=1e-5)  # fmt: skip
    # a resumed job's plan (read back from JSON) equals the one it makes
    assert cli.main(["embed", "--model", str(colbert), "--input", str(source), "--out",
                     str(tmp_path / "late"), "--id-column", "id", "--keep-columns", "text",
                     "--precision", "fp32", "--quiet", "--resume"]) == 0, capsys.readouterr().err  # fmt: skip

    capsys.readouterr()
    assert cli.main(["search", "--index", str(tmp_path / "late.lance"), QUESTIONS[0],
                     "--top", "6"]) == 0  # fmt: skip
    hits = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [h["id"] for h in hits] == [f"d{i}" for i in np.argsort(-scores, kind="stable")]
    assert [h["score"] for h in hits] == pytest.approx(sorted(scores, reverse=True), abs=1e-4)
    assert cli.main(["search", "--index", str(tmp_path / "dense.lance"), "--maxsim",
                     str(tmp_path / "late.lance"), QUESTIONS[0], "--top", "3"]) == 0  # fmt: skip
    hits = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [h["id"] for h in hits] == [f"d{i}" for i in np.argsort(-scores, kind="stable")[:3]]
    assert all("retrieval_score" in h for h in hits)  # the dense cosine, kept beside


def test_retrieval_reranked_by_maxsim_is_scored_as_trec_eval(prompted, colbert, tmp_path,
                                                             capsys):  # fmt: skip
    """`evaluate --retrieval --maxsim-model`: each query's dense top 100 reordered by a
    ColBERT's MaxSim as MultiVectorEncoder scores it; the run scored as pytrec_eval scores it,
    the ranking before it reported under "parts"."""
    pytest.importorskip("pytrec_eval")
    from sentence_transformers import MultiVectorEncoder

    from bertkit.retrieval.beir import read_qrels

    from helpers import trec_eval_scores

    data, corpus, asked = squad_beir(tmp_path / "beir", documents=60, queries=20)
    out = tmp_path / "scored"
    argv = ["evaluate", "--retrieval", "--model", str(prompted), "--maxsim-model", str(colbert),
            "--data", str(data), "--out", str(out), "--device", "cpu"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)
    assert result["retrieval"] == "dense+maxsim" and set(result["parts"]) == {"dense"}
    documents = [f"{d['title']} {d['text']}" for d in corpus]
    questions = [q["text"] for q in sorted(asked, key=lambda q: q["_id"])]
    late = MultiVectorEncoder(str(colbert), device="cpu")
    scores = late.similarity(late.encode_query(questions),
                             late.encode_document(documents)).numpy()  # fmt: skip
    dense = theirs(prompted)
    candidates = ranked(dense.encode_query(questions, normalize_embeddings=True)
                        @ dense.encode_document(documents, normalize_embeddings=True).T,
                        list(range(len(corpus))))  # fmt: skip
    run: dict[str, list[str]] = {}
    for line in (out / "run.tsv").read_text().splitlines():
        run.setdefault(line.split()[0], []).append(line.split()[2])
    for q, (query, found) in enumerate(sorted(run.items())):
        wanted = sorted(candidates[q], key=lambda d: -scores[q, d])
        assert found == [corpus[d]["_id"] for d in wanted], query
    theirs_scores = trec_eval_scores(out / "run.tsv", read_qrels(data / "qrels" / "test.tsv"))
    assert {name: result[name] for name in theirs_scores} == theirs_scores


def test_all_minilm_embedded_indexed_and_searched_at_128_dimensions(minilm_dir, tmp_path, capsys):
    """The real all-MiniLM-L6-v2 at 128 of its 384 dimensions: the stored vectors and search's
    query equal `SentenceTransformer(truncate_dim=128)`'s (unit length); a width above the
    model's is refused by name."""
    pytest.importorskip("lancedb")
    from bertkit.retrieval.index import Searcher

    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    argv = ["embed", "--model", str(minilm_dir), "--input", str(source), "--precision", "fp32",
            "--quiet", "--dimensions"]  # fmt: skip
    assert cli.main([*argv, "128", "--out", str(tmp_path / "v"), "--index",
                     str(tmp_path / "v.lance")]) == 0, capsys.readouterr().err  # fmt: skip
    reference = st.SentenceTransformer(str(minilm_dir), device="cpu", truncate_dim=128)
    stored = np.array(shards.vectors(tmp_path / "v").column("vector").to_pylist(), np.float32)
    np.testing.assert_allclose(stored, reference.encode(TEXTS, normalize_embeddings=True),
                               atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(Searcher(tmp_path / "v.lance").embed_queries(QUERIES),
                               reference.encode(QUERIES, normalize_embeddings=True), atol=1e-5)  # fmt: skip
    assert cli.main([*argv, "385", "--out", str(tmp_path / "w")]) == 2
    assert (
        "truncate_dim (--dimensions) must be from 1 to the model's 384 dimensions"
        in capsys.readouterr().err
    )
