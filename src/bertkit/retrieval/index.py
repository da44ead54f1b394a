"""The vectors of `bertkit embed` in a LanceDB table (embedded, on disk, larger than memory),
and search over it.

    build_index("vectors/", "my.lance")              # the shards, one at a time; ANN if large
    Searcher("my.lance")("how do magnets work?", top=10)
    Searcher("my.lance", sparse="splade.lance", full_text=True)(...)   # hybrid, fused by rank

The table holds each row's `id`, `vector` and the columns the job kept; rows without a vector
(empty or missing texts) are left out. Its schema carries the job's plan, so a search embeds
its query as the corpus was embedded (the same model, pooling, normalisation, length). Tables
of 10,000 rows or more get an IVF-PQ index (about √rows partitions, refined with exact distances
of ten times the rows asked for); smaller ones are searched exactly. Scores are cosine
similarities (the dot product of unit vectors), recomputed exactly for the rows returned.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.jobs import shards
from bertkit.retrieval.ranking import unit_rows

ANN_FROM = 10_000  # rows: below this, exact search is fast and exact
PLAN_KEY = b"bertkit.plan"


def lancedb_module():
    try:
        import lancedb
    except ImportError:
        raise ImportError("an index needs LanceDB: pip install 'bertkit[index]'") from None
    return lancedb


def _open(table: str | os.PathLike, *, create: bool = False):
    path = Path(table)
    if path.suffix != ".lance":
        raise ValueError(f"{path}: a LanceDB table is a folder named NAME.lance")
    if not create and not path.is_dir():
        raise FileNotFoundError(f"{path}: no such table (make one: bertkit index VECTORS --out "
                                f"{path})")  # fmt: skip
    return lancedb_module().connect(str(path.parent)), path.stem


def build_index(
    vectors: str | os.PathLike,
    table: str | os.PathLike,
    *,
    overwrite: bool = False,
    ann: str = "auto",
    partitions: int | None = None,
    full_text: bool = False,
) -> int:
    """A LanceDB table at `table` (NAME.lance) of the finished job in `vectors`, shard by shard;
    `ann` auto|yes|no (dense vectors; sparse ones are searched exactly); `full_text`: a
    full-text (BM25) index of the kept `text` column too. Returns the rows indexed."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    folder = Path(vectors)
    manifest = shards.finished_vectors(folder)
    plan = manifest["plan"]
    key = {"sparse": "indices", "multi-vector": "vectors"}.get(plan.get("vectors", ""), "vector")
    target = Path(table)
    if target.exists():
        if not overwrite:
            raise FileExistsError(f"{target}: exists (--overwrite to replace it)")
        shutil.rmtree(target)
    db, name = _open(target, create=True)
    metadata = {PLAN_KEY: json.dumps(plan).encode()}
    created, rows = None, 0
    for shard in manifest["shards"]:
        data = pq.read_table(folder / shard["file"])
        data = data.drop_columns([c for c in ("issue", "source", "line") if c in data.column_names])
        data = data.filter(pc.is_valid(data.column(key)))
        if data.num_rows == 0:
            continue
        if full_text and "text" not in data.column_names:
            raise ValueError(f"{folder}: --full-text indexes each row's text, and the job kept "
                             "no text column (embed with --keep-columns text)")  # fmt: skip
        data = data.replace_schema_metadata(metadata)
        if created is None:
            created = db.create_table(name, data=data)
        else:
            created.add(data.cast(created.schema) if data.schema != created.schema else data)
        rows += data.num_rows
    if created is None:
        raise ValueError(f"{folder}: no row has a vector: nothing to index")
    if key == "vector" and (ann == "yes" or (ann == "auto" and rows >= ANN_FROM)):
        from lancedb.index import IvfPq

        # about √rows partitions, no fewer than 256 rows each (what LanceDB trains one on)
        count = partitions or max(1, min(rows // 256, round(math.sqrt(rows))))
        config = IvfPq(distance_type="cosine", num_partitions=count,
                       num_sub_vectors=_sub_vectors(plan["dimension"]))  # fmt: skip
        created.create_index("vector", config=config)
    if full_text:
        from lancedb.index import FTS

        created.create_index("text", config=FTS())
    return rows


def _sub_vectors(dimension: int) -> int:
    """PQ sub-vectors: 8 dimensions each where the width divides so (384 -> 48)."""
    for width in (8, 4, 16, 2, 1):
        if dimension % width == 0:
            return dimension // width
    return 1


Hit = dict[str, Any]


class Searcher:
    """A table's nearest rows to a query, its query embedded as the corpus was (dense vectors
    by cosine, through the ANN index where there is one; sparse (SPLADE) vectors by dot
    product, exactly, the table held in memory). Hybrid: `sparse` (a second table, of sparse
    vectors) and/or `full_text` (the table's BM25 index of its text) each rank the rows too,
    and the rankings are fused by reciprocal rank (k = `fusion_k`; each hit keeps each side's
    score under "scores"). `rerank`: a cross-encoder (`bertkit finetune` on text pairs) that
    reorders the hits by their kept `text` column."""

    def __init__(self, table: str | os.PathLike, model: str | os.PathLike | None = None, *,
                 rerank: str | os.PathLike | None = None, device: str | None = None,
                 sparse: str | os.PathLike | None = None, full_text: bool = False,
                 fusion_k: int = 60, maxsim: str | os.PathLike | None = None) -> None:  # fmt: skip
        self.main = _Side(table, model, device)
        self.table, self.plan, self.encoder = self.main.table, self.main.plan, self.main.encoder
        self.indexed = self.main.indexed
        self.sides = [self.main]
        if sparse is not None:
            second = _Side(sparse, None, device)
            if not second.sparse:
                raise ValueError(f"{sparse}: holds dense vectors; --sparse-index takes a table "
                                 "of sparse ones (bertkit embed --sparse, then index)")  # fmt: skip
            self.sides.append(second)
        self.full_text = full_text
        if full_text and not any(i.index_type == "FTS" for i in self.table.list_indices()):
            raise ValueError(f"{table}: no full-text index (bertkit index --full-text, with the "
                             "text kept: embed --keep-columns text)")  # fmt: skip
        self.fusion_k = fusion_k
        self.late: _Side | None = None
        if maxsim is not None:
            self.late = _Side(maxsim, None, device)
            if self.late.kind != "multi-vector":
                raise ValueError(f"{maxsim}: holds {self.late.kind} vectors; --maxsim takes a "
                                 "table of per-token ones (bertkit embed --multi-vector, then "
                                 "index)")  # fmt: skip
        self.reranker = None
        if rerank is not None:
            from bertkit.inference.predict import Predictor

            self.reranker = Predictor(rerank, device=device)
            if "text" not in self.table.schema.names:
                raise ValueError(f"{table}: --rerank reads each row's text, and the table has "
                                 "no text column (embed with --keep-columns text)")  # fmt: skip

    def embed_queries(self, queries: list[str]) -> np.ndarray:
        return self.encoder.embed_texts(queries)

    def __call__(self, query: str, top: int = 10, *, exact: bool = False,
                 candidates: int | None = None) -> list[Hit]:  # fmt: skip
        """The `top` rows nearest `query`, best first: {"id", "score", kept columns}."""
        hybrid = len(self.sides) > 1 or self.full_text
        reranked = self.reranker is not None or self.late is not None
        wanted = max(top, candidates or (100 if reranked or hybrid else top))
        ranked = {side.kind: side.search(query, wanted, exact) for side in self.sides}
        if self.full_text:
            ranked["full_text"] = self._full_text(query, wanted)
        hits = next(iter(ranked.values())) if not hybrid else self._fused(ranked, wanted)
        if self.late is not None:  # the hits reordered by late interaction
            scores = self.late.maxsim(query, [h["id"] for h in hits])
            for hit, score in zip(hits, scores, strict=True):
                hit["retrieval_score"], hit["score"] = hit["score"], score
            hits.sort(key=lambda h: -h["score"])
        if self.reranker is not None:
            relevance = self.reranker.relevance([(query, h["text"]) for h in hits])
            for hit, score in zip(hits, relevance, strict=True):
                hit["retrieval_score"], hit["score"] = hit["score"], score
            hits.sort(key=lambda h: -h["score"])
        return hits[:top]

    def _full_text(self, query: str, wanted: int) -> list[Hit]:
        found = self.table.search(query, query_type="fts").limit(wanted).to_arrow()
        return _hits(found, found.column("_score").to_numpy())

    def _fused(self, ranked: dict[str, list[Hit]], wanted: int) -> list[Hit]:
        from bertkit.retrieval.ranking import fused

        ids, scores = fused([[[h["id"] for h in hits]] for hits in ranked.values()], wanted,
                            self.fusion_k)  # fmt: skip
        known: dict[Any, Hit] = {}
        for kind, hits in ranked.items():
            for hit in hits:
                entry = known.setdefault(hit["id"], {k: v for k, v in hit.items() if k != "score"})
                entry.setdefault("scores", {})[kind] = hit["score"]
        return [known[i] | {"score": float(s)} for i, s in zip(ids[0], scores[0], strict=False)]


class _Side:
    """One table searched by its own vectors: dense through LanceDB, sparse exactly."""

    def __init__(self, table: str | os.PathLike, model: str | os.PathLike | None,
                 device: str | None) -> None:  # fmt: skip
        from bertkit.jobs.embed import query_embedder

        db, name = _open(table)
        self.table = db.open_table(name)
        raw = (self.table.schema.metadata or {}).get(PLAN_KEY)
        if raw is None:
            raise ValueError(f"{table}: not a table `bertkit index` wrote (no job plan)")
        self.plan = json.loads(raw)
        self.encoder = query_embedder(self.plan, model, device=device)
        self.kind = {"sparse": "sparse", "multi-vector": "multi-vector"}.get(
            self.plan.get("vectors", ""), "dense")  # fmt: skip
        self.sparse = self.kind == "sparse"
        self.indexed = any(i.index_type != "FTS" for i in self.table.list_indices())
        self._held: Any = None  # a sparse table, in memory once searched

    def search(self, query: str, wanted: int, exact: bool) -> list[Hit]:
        if self.kind == "multi-vector":
            return self._late(query, wanted)
        return self._sparse(query, wanted) if self.sparse else self._dense(query, wanted, exact)

    def _late(self, query: str, wanted: int) -> list[Hit]:
        """Every row scored by MaxSim with the query's vectors (LanceDB's multi-vector search,
        its scores recomputed here)."""
        vectors = self.encoder.embed_multi_texts([query])[0]
        found = (self.table.search(vectors.tolist(), vector_column_name="vectors")
                 .metric("cosine").limit(wanted).to_arrow())  # fmt: skip
        return _hits(found, self._scores(vectors, found))

    def maxsim(self, query: str, ids: list[Any]) -> list[float]:
        """The MaxSim of `query` with each of the rows `ids` (their stored vectors)."""
        if not ids:
            return []
        found = (self.table.search().where(f"id IN ({_sql_values(ids)})").select(["id", "vectors"])
                 .limit(len(ids)).to_arrow())  # fmt: skip
        scores = self._scores(self.encoder.embed_multi_texts([query])[0], found)
        by_id = dict(zip(found.column("id").to_pylist(), scores.tolist(), strict=True))
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise ValueError(f"rows {missing[:3]} are not in the multi-vector table: embed the "
                             "same rows for --maxsim")  # fmt: skip
        return [by_id[i] for i in ids]

    def _scores(self, query: np.ndarray, found: Any) -> np.ndarray:
        import torch

        from bertkit.core.embedding import maxsim

        width = query.shape[1]
        documents = [torch.from_numpy(np.asarray(v, np.float32).reshape(-1, width))
                     for v in found.column("vectors").to_pylist()]  # fmt: skip
        mean = self.plan.get("multi_vector", {}).get("similarity") == "meanmaxsim"
        return maxsim(torch.from_numpy(query), documents, mean).numpy()

    def _dense(self, query: str, wanted: int, exact: bool) -> list[Hit]:
        vector = self.encoder.embed_texts([query])[0]
        search = self.table.search(vector, vector_column_name="vector").metric("cosine")
        search = search.limit(wanted)
        if self.indexed and not exact:
            search = search.nprobes(32).refine_factor(10)
        elif self.indexed:
            search = search.bypass_vector_index()
        found = search.to_arrow()
        matrix = np.asarray(found.column("vector").to_pylist(), np.float32).reshape(-1, len(vector))
        return _hits(found, unit_rows(matrix) @ unit_rows(vector[None])[0])

    def _sparse(self, query: str, wanted: int) -> list[Hit]:
        from bertkit.retrieval.ranking import queries_matrix, rows_matrix

        width = self.plan["vocabulary"]
        if self._held is None:
            data = self.table.to_arrow()
            self._held = (data, rows_matrix(data, width))
        data, matrix = self._held
        scores = matrix @ queries_matrix(self.encoder.embed_sparse_texts([query]), width)
        scores = scores[:, 0].numpy()
        best = np.argsort(-scores, kind="stable")[:wanted]
        return _hits(data.take(best), scores[best])


def _sql_values(values: list[Any]) -> str:
    """Values as an SQL list: texts quoted (a quote doubled), whole numbers as they are.

    >>> _sql_values(["a", "it's", 3])
    "'a', 'it''s', 3"
    """
    return ", ".join("'" + v.replace("'", "''") + "'" if isinstance(v, str) else str(int(v))
                     for v in values)  # fmt: skip


def _hits(found: Any, scores: np.ndarray) -> list[Hit]:
    """Rows of an Arrow table with their scores, best first: {"id", "score", kept columns}."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    hidden = ("vector", "vectors", "indices", "values", "_distance", "_score", "id")
    kept = [c for c in found.column_names if c not in hidden]
    return [{"id": found.column("id")[int(i)].as_py(), "score": float(scores[i]),
             **{c: found.column(c)[int(i)].as_py() for c in kept}} for i in order]  # fmt: skip
