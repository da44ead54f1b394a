"""Retrieval scored in BEIR's layout, as everyone reports it.

    folder/corpus.jsonl      {"_id": "d1", "title": "…", "text": "…"} a line
    folder/queries.jsonl     {"_id": "q1", "text": "…"}
    folder/qrels/test.tsv    query-id <tab> corpus-id <tab> score (a header line first)

    evaluate_retrieval("runs/emb", "scifact/", split="test")
    # {"ndcg@10": …, "mrr@10": …, "recall@1": …, "recall@10": …, "recall@100": …, …}

The corpus is embedded by the corpus job (`title text`, as BEIR's sentence-transformers models
read a document; resumable, in `out`/corpus when `out` is given), each query as the corpus was,
and every query's `top` nearest documents found by exact search over the shards (one shard in
memory at a time). The measures are trec_eval's: nDCG@10 with the qrels' graded gains and a
log2 discount, recall@k (relevant: score > 0), MRR@10 (1/rank of the first relevant document in
the top ten); each averaged over the queries that have judgements.
"""

from __future__ import annotations

import csv
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.errors import DataError
from bertkit.retrieval.ranking import fused, queries_matrix, rows_matrix, unit_rows
from bertkit.rows import read_rows

CUTOFFS = (1, 10, 100)


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """{query id: {document id: relevance}} of a BEIR qrels TSV (header line optional)."""
    if not path.exists():
        found = sorted(p.stem for p in path.parent.glob("*.tsv"))
        raise FileNotFoundError(f"{path}: no such qrels file" + (
            f" (the splits judged here: {', '.join(found)}; --split)" if found else ""))  # fmt: skip
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8", newline="") as handle:
        for line, fields in enumerate(csv.reader(handle, delimiter="\t"), start=1):
            if not fields or (line == 1 and not _integer(fields[-1])):
                continue  # the header line
            if len(fields) != 3 or not _integer(fields[2]):
                raise DataError(path, line, "expected query-id, corpus-id and an integer score, "
                                f"tab-separated; got {fields!r}")  # fmt: skip
            qrels.setdefault(fields[0], {})[fields[1]] = int(fields[2])
    return qrels


def _integer(text: str) -> bool:
    return text.strip().lstrip("-").isdigit()


def read_queries(path: Path, wanted: set[str]) -> dict[str, str]:
    queries = {}
    for row in read_rows(path, ("_id", "text"), format="jsonl"):  # (a missing key: named)
        if str(row.values["_id"]) in wanted:
            queries[str(row.values["_id"])] = str(row.values["text"])
    missing = sorted(wanted - set(queries))
    if missing:
        raise DataError(path, None, f"{len(missing)} judged queries are not here "
                        f"(first: {missing[0]!r})")  # fmt: skip
    return queries


def exact_top(vectors_dir: Path, queries: np.ndarray, top: int) -> tuple[list[list[str]],
                                                                         np.ndarray]:  # fmt: skip
    """Each query's `top` nearest rows of a finished embed job (cosine), best first: their ids
    and scores, over the shards one at a time (ties: the earlier row first)."""
    import pyarrow.parquet as pq

    from bertkit.jobs import shards

    manifest = shards.finished_vectors(vectors_dir)
    unit = unit_rows(queries)
    best_scores = np.full((len(queries), 0), -np.inf, np.float32)
    best_ids = np.empty((len(queries), 0), object)
    for shard in manifest["shards"]:
        table = pq.read_table(vectors_dir / shard["file"], columns=["id", "vector"])
        valid = np.asarray(table.column("vector").is_valid())
        if not valid.any():
            continue
        ids = np.asarray(table.column("id").to_pylist(), object)[valid]
        flat = table.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        matrix = unit_rows(flat.reshape(-1, unit.shape[1]).astype(np.float32)[valid])
        best_scores, best_ids = _kept(best_scores, best_ids, unit @ matrix.T, ids, top)
    return [list(row) for row in best_ids], best_scores


def _kept(best_scores: np.ndarray, best_ids: np.ndarray, scores: np.ndarray, ids: np.ndarray,
          top: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The `top` best of each query's rows so far and a shard's (`scores`: queries x rows),
    best first; ties: the earlier row first."""
    scores = np.concatenate([best_scores, scores], axis=1)
    names = np.concatenate([best_ids, np.broadcast_to(ids, (len(scores), len(ids)))], axis=1)
    keep = np.argsort(-scores, axis=1, kind="stable")[:, :top]
    return np.take_along_axis(scores, keep, axis=1), np.take_along_axis(names, keep, axis=1)


def sparse_top(vectors_dir: Path, queries: Sequence[tuple[np.ndarray, np.ndarray]],
               top: int) -> tuple[list[list[str]], np.ndarray]:  # fmt: skip
    """Each sparse query's `top` rows of a finished sparse embed job by dot product (as
    sentence-transformers scores SPLADE vectors), best first: their ids and scores, a shard at
    a time (each a sparse matrix times the queries; ties: the earlier row first)."""
    import pyarrow.parquet as pq

    from bertkit.jobs import shards

    manifest = shards.finished_vectors(vectors_dir)
    width = manifest["plan"].get("vocabulary")
    if manifest["plan"].get("vectors") != "sparse" or width is None:
        raise ValueError(f"{vectors_dir}: holds dense vectors, not sparse ones")
    dense_queries = queries_matrix(queries, width)
    best_scores = np.full((len(queries), 0), -np.inf, np.float32)
    best_ids = np.empty((len(queries), 0), object)
    for shard in manifest["shards"]:
        table = pq.read_table(vectors_dir / shard["file"], columns=["id", "indices", "values"])
        valid = np.asarray(table.column("indices").is_valid())
        if not valid.any():
            continue
        table = table.filter(valid)
        ids = np.asarray(table.column("id").to_pylist(), object)
        documents = rows_matrix(table, width)
        scores = (documents @ dense_queries).T.numpy()  # (queries, rows)
        best_scores, best_ids = _kept(best_scores, best_ids, scores, ids, top)
    return [list(row) for row in best_ids], best_scores


def bm25_top(corpus: Path, queries: Sequence[str], top: int,
             where: Path) -> tuple[list[list[str]], np.ndarray]:  # fmt: skip
    """Each query's `top` documents of a BEIR corpus by BM25 (LanceDB's full-text index of
    `title text`, made in `where` once), best first, with their scores."""
    import json

    import pyarrow as pa
    from lancedb.index import FTS

    from bertkit.retrieval.index import lancedb_module

    db = lancedb_module().connect(str(where))
    if "bm25" not in db.table_names():
        rows = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines()
                if line.strip()]  # fmt: skip
        text = [" ".join(str(r.get(k) or "") for k in ("title", "text")).strip() for r in rows]
        table = db.create_table("bm25", data=pa.table({"id": [str(r["_id"]) for r in rows],
                                                       "text": text}))  # fmt: skip
        table.create_index("text", config=FTS())
    table = db.open_table("bm25")
    ids, scores = [], []
    for query in queries:
        found = table.search(query, query_type="fts").limit(top).to_arrow()
        order = np.argsort(-found.column("_score").to_numpy(), kind="stable")
        ids.append([found.column("id")[int(i)].as_py() for i in order])
        scores.append(found.column("_score").to_numpy()[order].tolist() +
                      [0.0] * (top - len(order)))  # fmt: skip
    return ids, np.asarray(scores, np.float32)


def maxsim_rerank(vectors_dir: Path, queries: Sequence[np.ndarray],
                  candidates: Sequence[list[str]]) -> tuple[list[list[str]], np.ndarray]:  # fmt: skip
    """Each query's `candidates` reordered by late interaction (MaxSim of its per-token vectors
    over each candidate's, from a finished multi-vector embed job), best first with their
    scores; the job's rows read a shard at a time, only the candidates' vectors kept."""
    import pyarrow.parquet as pq
    import torch

    from bertkit.core.embedding import maxsim
    from bertkit.jobs import shards

    manifest = shards.finished_vectors(vectors_dir)
    plan = manifest["plan"]
    if plan.get("vectors") != "multi-vector":
        raise ValueError(f"{vectors_dir}: holds {plan.get('vectors', 'dense')} vectors, not "
                         "per-token ones (embed --multi-vector)")  # fmt: skip
    mean = plan.get("multi_vector", {}).get("similarity") == "meanmaxsim"
    asking: dict[str, list[int]] = {}
    for q, documents in enumerate(candidates):
        for document in documents:
            asking.setdefault(document, []).append(q)
    found: list[dict[str, float]] = [{} for _ in queries]
    asked = [torch.from_numpy(np.asarray(q, np.float32)) for q in queries]
    for shard in manifest["shards"]:
        table = pq.read_table(vectors_dir / shard["file"], columns=["id", "vectors"])
        for document, vectors in zip(table.column("id").to_pylist(),
                                     table.column("vectors").to_pylist(), strict=True):  # fmt: skip
            if document in asking and vectors is not None:
                tokens = torch.tensor(vectors, dtype=torch.float32).reshape(-1, plan["dimension"])
                for q in asking[document]:
                    found[q][document] = float(maxsim(asked[q], [tokens], mean)[0])
    ids, scores = [], []
    for q, documents in enumerate(candidates):
        order = sorted(documents, key=lambda d: -found[q].get(d, -np.inf))
        ids.append(order)
        scores.append([found[q].get(d, -np.inf) for d in order])
    width = max((len(row) for row in scores), default=0)
    return ids, np.asarray([row + [-np.inf] * (width - len(row)) for row in scores], np.float32)


def scores_of(ranking: dict[str, list[str]], qrels: dict[str, dict[str, int]],
              cutoffs: Sequence[int] = CUTOFFS) -> dict[str, float]:  # fmt: skip
    """trec_eval's nDCG@10, recall@k and MRR@10 of `ranking` ({query: documents, best first}),
    averaged over the judged queries.

    >>> scores_of({"q": ["a", "b"]}, {"q": {"b": 1}}, cutoffs=(1, 10))
    {'ndcg@10': 0.6309, 'mrr@10': 0.5, 'recall@1': 0.0, 'recall@10': 1.0}
    """
    totals = {"ndcg@10": 0.0, "mrr@10": 0.0, **{f"recall@{k}": 0.0 for k in cutoffs}}
    for query, judged in qrels.items():
        documents = ranking.get(query, [])
        relevant = {d for d, r in judged.items() if r > 0}
        gains = sorted((r for r in judged.values() if r > 0), reverse=True)[:10]
        ideal = sum(g / math.log2(i + 2) for i, g in enumerate(gains))
        found = sum(max(judged.get(d, 0), 0) / math.log2(i + 2)
                    for i, d in enumerate(documents[:10]))  # fmt: skip
        totals["ndcg@10"] += found / ideal if ideal else 0.0
        first = next((i for i, d in enumerate(documents[:10]) if d in relevant), None)
        totals["mrr@10"] += 1 / (first + 1) if first is not None else 0.0
        for k in cutoffs:
            hit = len(relevant & set(documents[:k]))
            totals[f"recall@{k}"] += hit / len(relevant) if relevant else 0.0
    count = max(len(qrels), 1)
    return {name: round(value / count, 4) for name, value in totals.items()}


def evaluate_retrieval(
    model: str | os.PathLike,
    data: str | os.PathLike,
    *,
    sparse_model: str | os.PathLike | None = None,
    maxsim_model: str | os.PathLike | None = None,
    full_text: bool = False,
    split: str = "test",
    top: int = 100,
    out: str | os.PathLike | None = None,
    batch_size: int = 64,
    device: str | None = None,
    progress: bool = False,
    fusion_k: int = 60,
) -> dict[str, Any]:
    """Score `model` on the BEIR folder `data`, qrels `split`: the measures (`scores_of`), with
    the queries' and documents' counts. `model` retrieves with dense vectors (sparse ones where
    it is a SparseEncoder folder); with `sparse_model` (a SPLADE folder), hybrid retrieval: each
    query's `top` of both, fused by reciprocal rank (`fused`, k = `fusion_k`), each part's own
    measures under "parts"; `full_text`: BM25's ranking (LanceDB's full-text index of
    `title text`) fused in too. `maxsim_model` (a multi-vector, ColBERT-style folder): each
    query's `top` reordered by late interaction (MaxSim), the ranking before it under "parts"
    too. With `out`: the corpus's vectors (resumable) in out/corpus (and out/corpus-sparse,
    out/corpus-multi-vector), the ranking as a TREC run file out/run.tsv and the scores in
    out/results.json."""
    from bertkit._io import write_json
    from bertkit.jobs import shards
    from bertkit.jobs.config import EmbedConfig
    from bertkit.jobs.embed import embed, query_embedder

    folder = Path(data)
    for name in ("corpus.jsonl", "queries.jsonl"):
        if not (folder / name).exists():
            raise FileNotFoundError(f"{folder / name}: no such file (a BEIR folder has "
                                    "corpus.jsonl, queries.jsonl and qrels/SPLIT.tsv)")  # fmt: skip
    qrels = read_qrels(folder / "qrels" / f"{split}.tsv")
    queries = read_queries(folder / "queries.jsonl", set(qrels))
    names = sorted(queries)
    texts = [queries[q] for q in names]
    parts: dict[str, tuple[list[list[str]], np.ndarray]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        place = Path(out) if out is not None else Path(scratch)

        def corpus(given: str | os.PathLike, where: str, sparse: bool = False,
                   multi_vector: bool = False) -> tuple[Any, Path]:  # fmt: skip
            """The corpus embedded by `given` into place/where (resumable), and the embedder
            of the queries against it."""
            config = EmbedConfig(text_column="title,text", id_column="_id", batch_size=batch_size,
                                 device=device, progress=progress, resume=True, sparse=sparse,
                                 multi_vector=multi_vector)  # fmt: skip
            found = embed(given, [folder / "corpus.jsonl"], place / where, config)
            encoder = query_embedder(found["plan"], given, device=device, batch_size=batch_size)
            return encoder, place / where

        encoder, where = corpus(model, "corpus")
        documents = shards.finished_vectors(where)["rows"]
        if encoder.sparse:
            parts["sparse"] = sparse_top(where, encoder.embed_sparse_texts(texts), top)
        else:
            parts["dense"] = exact_top(where, encoder.embed_texts(texts), top)
        if sparse_model is not None:
            encoder, where = corpus(sparse_model, "corpus-sparse", sparse=True)
            parts["sparse"] = sparse_top(where, encoder.embed_sparse_texts(texts), top)
        if full_text:
            parts["full_text"] = bm25_top(folder / "corpus.jsonl", texts, top, place / "bm25")
        retrieval = "hybrid" if len(parts) > 1 else next(iter(parts))
        ids, scores = (fused([found[0] for found in parts.values()], top, fusion_k)
                       if len(parts) > 1 else next(iter(parts.values())))  # fmt: skip
        if maxsim_model is not None:
            if len(parts) > 1:
                parts["hybrid"] = (ids, scores)
            encoder, where = corpus(maxsim_model, "corpus-multi-vector", multi_vector=True)
            ids, scores = maxsim_rerank(where, encoder.embed_multi_texts(texts), ids)
            retrieval += "+maxsim"
    ranking = dict(zip(names, ids, strict=True))
    result = {**scores_of(ranking, qrels), "queries": len(qrels), "documents": documents,
              "split": split, "model": str(model), "retrieval": retrieval}  # fmt: skip
    for name, given in (("sparse_model", sparse_model), ("maxsim_model", maxsim_model)):
        if given is not None:
            result[name] = str(given)
    if len(parts) > 1 or maxsim_model is not None:
        result["parts"] = {kind: scores_of(dict(zip(names, found[0], strict=True)), qrels)
                           for kind, found in parts.items()}  # fmt: skip
    if out is not None:
        write_run(Path(out) / "run.tsv", ranking, {q: s for q, s in zip(names, scores,
                                                                         strict=True)})  # fmt: skip
        write_json(Path(out) / "results.json", result)
    return result


def write_run(path: Path, ranking: dict[str, list[str]], scores: dict[str, Any]) -> None:
    """A TREC run file: `query Q0 document rank score bertkit` a line."""
    from bertkit._io import atomic_write_text

    lines = [f"{q} Q0 {d} {r} {float(scores[q][r - 1]):.6f} bertkit"
             for q, documents in ranking.items() for r, d in enumerate(documents, start=1)]  # fmt: skip
    atomic_write_text(path, "\n".join(lines) + "\n")
