"""Retrieval over a corpus job's vectors: a LanceDB table and its search (exact, ANN, reranked),
and retrieval scored in BEIR's layout, equal to trec_eval's own figures (pytrec_eval)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from bertkit import cli
from bertkit.jobs import shards
from bertkit.jobs.embed import embed
from bertkit.retrieval.beir import evaluate_retrieval, read_qrels, scores_of

from helpers import WORDS, trec_eval_scores


def corpus(path: Path, count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(4, 12))) for _ in range(count)]
    path.write_text("".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(texts)))
    return texts


@pytest.fixture
def lancedb():
    return pytest.importorskip("lancedb")


def test_an_index_answers_as_exact_search_does(words_model, lancedb, tmp_path, capsys):
    """`bertkit index` then `bertkit search`: the nearest rows by cosine, as numpy finds them
    over the shards; a row's own text finds it first; kept columns come back; the ANN index
    (IVF-PQ) finds most of the exact top ten; rows without a vector are not in the table."""
    texts = corpus(tmp_path / "docs.jsonl", 1200)
    (tmp_path / "docs.jsonl").open("a").write(json.dumps({"text": " "}) + "\n")
    out = tmp_path / "vectors"
    embed(words_model, [tmp_path / "docs.jsonl"], out, pooling="mean", normalize="yes",
          keep_columns="text", progress=False)  # fmt: skip
    assert cli.main(["index", str(out), "--out", str(tmp_path / "docs.lance"), "--ann",
                     "no"]) == 0  # fmt: skip
    assert "1,200 rows" in capsys.readouterr().err
    table = shards.vectors(out, ("id", "vector"))
    ids = table.column("id").to_pylist()[:1200]
    matrix = np.array(table.column("vector").to_pylist()[:1200], np.float32)
    from bertkit.retrieval.index import Searcher, build_index

    searcher = Searcher(tmp_path / "docs.lance")
    query = texts[17]
    hits = searcher(query, top=5)
    exact = np.argsort(-(matrix @ searcher.embed_queries([query])[0]), kind="stable")[:5]
    assert [h["id"] for h in hits] == [ids[i] for i in exact]
    assert hits[0]["text"] == query and hits[0]["score"] == pytest.approx(1.0, abs=1e-5)
    assert cli.main(["search", "--index", str(tmp_path / "docs.lance"), query, "--top", "2"]) == 0
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [p["id"] for p in printed] == [h["id"] for h in hits[:2]]

    # more partitions than the 32 a search probes: the index must find the rows, not a scan
    assert build_index(out, tmp_path / "ann.lance", ann="yes", partitions=96) == 1200
    ann = Searcher(tmp_path / "ann.lance")
    assert ann.indexed
    found = []
    for i in range(0, 1200, 60):
        exact = set(np.argsort(-(matrix @ matrix[i]), kind="stable")[:10])
        found.append(len(exact & {ids.index(h["id"]) for h in ann(texts[i], top=10)}) / 10)
        # --exact on an indexed table: every row scanned, numpy's top ten
        assert exact == {ids.index(h["id"]) for h in ann(texts[i], top=10, exact=True)}
    assert np.mean(found) >= 0.8, found
    # the table is partitioned for real: a search that probes one partition misses rows
    one_probe = []
    for i in range(0, 1200, 60):
        exact = set(np.argsort(-(matrix @ matrix[i]), kind="stable")[:10])
        got = ann.table.search(matrix[i], vector_column_name="vector").metric("cosine")
        rows = got.limit(10).nprobes(1).to_arrow().column("id").to_pylist()
        one_probe.append(len(exact & {ids.index(r) for r in rows}) / 10)
    assert np.mean(one_probe) < np.mean(found), (one_probe, found)
    assert cli.main(["search", "--index", str(tmp_path / "ann.lance"), query, "--top", "3",
                     "--exact"]) == 0  # fmt: skip
    printed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [p["id"] for p in printed] == [h["id"] for h in hits[:3]]
    with pytest.raises(FileExistsError, match="--overwrite"):
        build_index(out, tmp_path / "ann.lance")


def test_search_reranked_by_a_cross_encoder(words_model, lancedb, tmp_path, capsys):
    """`search --rerank CE`: the nearest rows by cosine, reordered by the cross-encoder's
    relevance of (query, the row's kept text) — each score the Predictor's own, best first, the
    cosine kept as `retrieval_score`; a table without the text column is refused by name."""
    from bertkit.core.tokenizer import BertTokenizer
    from bertkit.finetuning.train import FinetuneConfig, build_model, save_finetuned
    from bertkit.inference.predict import Predictor
    from bertkit.tasks import get_task

    texts = corpus(tmp_path / "docs.jsonl", 60)
    task, reranker = get_task("mrpc"), tmp_path / "ce"  # a random pair classifier
    save_finetuned(build_model(task, words_model, seed=0), BertTokenizer.from_pretrained(
        words_model), reranker, task, FinetuneConfig(max_seq_length=48))  # fmt: skip
    argv = ["embed", "--model", str(words_model), "--input", str(tmp_path / "docs.jsonl"),
            "--pooling", "mean", "--keep-columns", "text", "--out", str(tmp_path / "v"),
            "--index", str(tmp_path / "t.lance"), "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0
    query = texts[5]
    assert cli.main(["search", "--index", str(tmp_path / "t.lance"), query, "--top", "4",
                     "--rerank", str(reranker)]) == 0  # fmt: skip
    hits = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    relevance = Predictor(reranker).relevance([(query, h["text"]) for h in hits])
    assert [h["score"] for h in hits] == pytest.approx(list(relevance), abs=1e-6)
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert all(-1 <= h["retrieval_score"] <= 1 for h in hits) and len(hits) == 4
    assert cli.main(["embed", "--model", str(words_model), "--input",
                     str(tmp_path / "docs.jsonl"), "--pooling", "mean", "--out",
                     str(tmp_path / "bare"), "--index", str(tmp_path / "bare.lance"),
                     "--quiet"]) == 0  # fmt: skip
    assert cli.main(["search", "--index", str(tmp_path / "bare.lance"), query,
                     "--rerank", str(reranker)]) == 2  # fmt: skip
    assert "no text column" in capsys.readouterr().err


def test_embed_then_index_in_one_command(words_model, lancedb, tmp_path, capsys):
    """`bertkit embed --index NAME.lance`: the vectors, then their table, and a search of it."""
    texts = corpus(tmp_path / "docs.jsonl", 40)
    argv = ["embed", "--model", str(words_model), "--input", str(tmp_path / "docs.jsonl"),
            "--pooling", "mean", "--keep-columns", "text", "--out", str(tmp_path / "v"),
            "--index", str(tmp_path / "t.lance"), "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0
    assert "40 rows" in capsys.readouterr().err
    assert cli.main(["search", "--index", str(tmp_path / "t.lance"), texts[3], "--top", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == texts[3]


def beir_folder(root: Path, count: int = 60) -> Path:
    """A BEIR folder: documents of toy words, each query a few words of one document (judged
    2), with a second document judged 1 for some, and one judged 0."""
    rng = random.Random(1)
    docs = [" ".join(rng.choices(WORDS, k=rng.randint(5, 14))) for _ in range(count)]
    (root / "qrels").mkdir(parents=True)
    with open(root / "corpus.jsonl", "w") as handle:
        for i, text in enumerate(docs):
            handle.write(json.dumps({"_id": f"d{i}", "title": f"t{i % 3}", "text": text}) + "\n")
    lines, queries = ["query-id\tcorpus-id\tscore"], []
    for q in range(0, count, 3):
        words = docs[q].split()
        queries.append({"_id": f"q{q}", "text": " ".join(words[:4])})
        lines.append(f"q{q}\td{q}\t2")
        if q % 2 == 0:
            lines.append(f"q{q}\td{(q + 1) % count}\t1")
        if q % 5 == 0:
            lines.append(f"q{q}\td{(q + 2) % count}\t0")
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    return root


def test_retrieval_scored_in_beirs_layout_equals_trec_eval(words_model, tmp_path, capsys):
    """`bertkit evaluate --retrieval` on a BEIR folder: nDCG@10 (graded), MRR@10 and recall@k
    of the run it writes equal pytrec_eval's (trec_eval's own code) on that run."""
    pytest.importorskip("pytrec_eval")
    data = beir_folder(tmp_path / "beir")
    out = tmp_path / "scored"
    argv = ["evaluate", "--retrieval", "--model", str(words_model), "--data", str(data),
            "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)
    assert result["queries"] == 20 and result["documents"] == 60
    assert result == json.loads((out / "results.json").read_text())
    qrels = read_qrels(data / "qrels" / "test.tsv")
    theirs = trec_eval_scores(out / "run.tsv", qrels)
    assert {name: result[name] for name in theirs} == theirs
    assert 0.0 < result["ndcg@10"] < 1.0  # neither nothing nor everything found
    again = evaluate_retrieval(words_model, data, out=out)  # the corpus's vectors resumed
    assert again == result


def test_the_measures_by_hand():
    qrels = {"q1": {"a": 2, "b": 1, "c": 0}, "q2": {"x": 1}}
    ranking = {"q1": ["c", "b", "a"], "q2": ["y"] * 10 + ["x"]}
    scores = scores_of(ranking, qrels, cutoffs=(1, 10, 100))
    ideal = 2 + 1 / np.log2(3)
    assert scores["ndcg@10"] == round((1 / np.log2(3) + 2 / 2) / ideal / 2, 4)
    assert scores["mrr@10"] == round((1 / 2) / 2, 4)  # q2's hit is 11th: nothing within ten
    assert (scores["recall@1"], scores["recall@10"], scores["recall@100"]) == (0.0, 0.5, 1.0)


def test_queries_are_read_as_rows(tmp_path):
    """BEIR's queries.jsonl through the one reader of rows: the judged queries kept; a line
    without its text named with the keys it has; judged queries absent, counted."""
    from bertkit.errors import DataError
    from bertkit.retrieval.beir import read_queries

    path = tmp_path / "queries.jsonl"
    path.write_text('{"_id": 1, "text": "one"}\n\n{"_id": "2", "text": "two"}\n')
    assert read_queries(path, {"1", "2"}) == {"1": "one", "2": "two"}
    assert read_queries(path, {"2"}) == {"2": "two"}
    with pytest.raises(DataError, match=r"queries.jsonl: 1 judged queries are not here"):
        read_queries(path, {"1", "3"})
    path.write_text('{"_id": "1", "text": "one"}\n{"_id": "2", "query": "two"}\n')
    with pytest.raises(DataError, match=r"queries.jsonl:2: no column 'text'.*'_id', 'query'"):
        read_queries(path, {"1"})


def test_an_unfinished_job_is_refused_by_the_index_and_the_scorer_alike(words_model, tmp_path):
    """One check of a finished embedding job (`shards.finished_vectors`) behind `index` and
    retrieval scoring: an unfinished job is refused by both, naming --resume."""
    from bertkit.retrieval.beir import exact_top
    from bertkit.retrieval.index import build_index

    corpus(tmp_path / "docs.jsonl", 10)
    out = tmp_path / "v"
    embed(words_model, [tmp_path / "docs.jsonl"], out, pooling="mean", progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps(manifest | {"complete": False}))
    for read in (lambda: build_index(out, tmp_path / "t.lance"),
                 lambda: exact_top(out, np.ones((1, 32), np.float32), 3)):  # fmt: skip
        with pytest.raises(ValueError, match="not a finished `bertkit embed` job.*--resume"):
            read()
