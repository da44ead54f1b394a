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

from bertkit.tasks.base import DataError
from bertkit.tasks.files import json_lines

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
    for line, record in json_lines(path):
        if not isinstance(record, dict) or "_id" not in record or "text" not in record:
            raise DataError(path, line, 'expected {"_id": ..., "text": ...}')
        if str(record["_id"]) in wanted:
            queries[str(record["_id"])] = str(record["text"])
    missing = sorted(wanted - set(queries))
    if missing:
        raise DataError(path, None, f"{len(missing)} judged queries are not here "
                        f"(first: {missing[0]!r})")  # fmt: skip
    return queries


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """Each row at unit length (float32; a zero row stays zero): cosines are then dot products.

    >>> unit_rows(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
    [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]
    """
    matrix = np.asarray(matrix, np.float32)
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)


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
        scores = np.concatenate([best_scores, unit @ matrix.T], axis=1)
        names = np.concatenate([best_ids, np.broadcast_to(ids, (len(unit), len(ids)))], axis=1)
        keep = np.argsort(-scores, axis=1, kind="stable")[:, :top]
        best_scores = np.take_along_axis(scores, keep, axis=1)
        best_ids = np.take_along_axis(names, keep, axis=1)
    return [list(row) for row in best_ids], best_scores


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
    split: str = "test",
    top: int = 100,
    out: str | os.PathLike | None = None,
    batch_size: int = 64,
    device: str | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Score `model` (an embedding model) on the BEIR folder `data`, qrels `split`: the
    measures (`scores_of`), with the queries' and documents' counts. With `out`: the corpus's
    vectors (resumable) in out/corpus, the ranking as a TREC run file out/run.tsv and the
    scores in out/results.json."""
    from bertkit._io import write_json
    from bertkit.jobs.config import EmbedConfig
    from bertkit.jobs.embed import embed, query_embedder

    folder = Path(data)
    for name in ("corpus.jsonl", "queries.jsonl"):
        if not (folder / name).exists():
            raise FileNotFoundError(f"{folder / name}: no such file (a BEIR folder has "
                                    "corpus.jsonl, queries.jsonl and qrels/SPLIT.tsv)")  # fmt: skip
    qrels = read_qrels(folder / "qrels" / f"{split}.tsv")
    queries = read_queries(folder / "queries.jsonl", set(qrels))
    with tempfile.TemporaryDirectory() as scratch:
        vectors = Path(out) / "corpus" if out is not None else Path(scratch) / "corpus"
        config = EmbedConfig(text_column="title,text", id_column="_id", batch_size=batch_size,
                             device=device, progress=progress, resume=True)  # fmt: skip
        manifest = embed(model, [folder / "corpus.jsonl"], vectors, config)
        encoder = query_embedder(manifest["plan"], model, device=device, batch_size=batch_size)
        names = sorted(queries)
        vectors_q = encoder.embed_texts([queries[q] for q in names])
        ids, scores = exact_top(vectors, vectors_q, top)
    ranking = dict(zip(names, ids, strict=True))
    result = {**scores_of(ranking, qrels), "queries": len(qrels), "documents": manifest["rows"],
              "split": split, "model": str(model)}  # fmt: skip
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
