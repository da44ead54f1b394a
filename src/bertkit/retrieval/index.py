"""The vectors of `bertkit embed` in a LanceDB table (embedded, on disk, larger than memory),
and search over it.

    build_index("vectors/", "my.lance")              # the shards, one at a time; ANN if large
    Searcher("my.lance")("how do magnets work?", top=10)

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
from bertkit.retrieval.beir import unit_rows

ANN_FROM = 10_000  # rows: below this, exact search is fast and exact
PLAN_KEY = b"bertkit.plan"


def _lancedb():
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
    return _lancedb().connect(str(path.parent)), path.stem


def build_index(
    vectors: str | os.PathLike,
    table: str | os.PathLike,
    *,
    overwrite: bool = False,
    ann: str = "auto",
    partitions: int | None = None,
) -> int:
    """A LanceDB table at `table` (NAME.lance) of the finished job in `vectors`, shard by shard;
    `ann` auto|yes|no. Returns the rows indexed."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    folder = Path(vectors)
    manifest = shards.finished_vectors(folder)
    plan = manifest["plan"]
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
        data = data.filter(pc.is_valid(data.column("vector")))
        if data.num_rows == 0:
            continue
        data = data.replace_schema_metadata(metadata)
        if created is None:
            created = db.create_table(name, data=data)
        else:
            created.add(data.cast(created.schema) if data.schema != created.schema else data)
        rows += data.num_rows
    if created is None:
        raise ValueError(f"{folder}: no row has a vector: nothing to index")
    if ann == "yes" or (ann == "auto" and rows >= ANN_FROM):
        from lancedb.index import IvfPq

        # about √rows partitions, no fewer than 256 rows each (what LanceDB trains one on)
        count = partitions or max(1, min(rows // 256, round(math.sqrt(rows))))
        config = IvfPq(distance_type="cosine", num_partitions=count,
                       num_sub_vectors=_sub_vectors(plan["dimension"]))  # fmt: skip
        created.create_index("vector", config=config)
    return rows


def _sub_vectors(dimension: int) -> int:
    """PQ sub-vectors: 8 dimensions each where the width divides so (384 -> 48)."""
    for width in (8, 4, 16, 2, 1):
        if dimension % width == 0:
            return dimension // width
    return 1


class Searcher:
    """A table's nearest rows to a query, its query embedded as the corpus was; `rerank`: a
    cross-encoder (`bertkit finetune` on text pairs) that reorders the hits by their kept
    `text` column."""

    def __init__(self, table: str | os.PathLike, model: str | os.PathLike | None = None, *,
                 rerank: str | os.PathLike | None = None, device: str | None = None) -> None:  # fmt: skip
        from bertkit.jobs.embed import query_embedder

        db, name = _open(table)
        self.table = db.open_table(name)
        raw = (self.table.schema.metadata or {}).get(PLAN_KEY)
        if raw is None:
            raise ValueError(f"{table}: not a table `bertkit index` wrote (no job plan)")
        self.plan = json.loads(raw)
        self.encoder = query_embedder(self.plan, model, device=device)
        self.indexed = bool(self.table.list_indices())
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
                 candidates: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
        """The `top` rows nearest `query`, best first: {"id", "score", kept columns}."""
        vector = self.embed_queries([query])[0]
        wanted = max(top, candidates or (100 if self.reranker else top))
        search = self.table.search(vector, vector_column_name="vector").metric("cosine")
        search = search.limit(wanted)
        if self.indexed and not exact:
            search = search.nprobes(32).refine_factor(10)
        elif self.indexed:
            search = search.bypass_vector_index()
        found = search.to_arrow()
        matrix = np.asarray(found.column("vector").to_pylist(), np.float32).reshape(-1, len(vector))
        scores = unit_rows(matrix) @ unit_rows(vector[None])[0]
        order = np.argsort(-scores, kind="stable")
        kept = [c for c in found.column_names if c not in ("vector", "_distance", "id")]
        hits = [{"id": found.column("id")[int(i)].as_py(), "score": float(scores[i]),
                 **{c: found.column(c)[int(i)].as_py() for c in kept}} for i in order]  # fmt: skip
        if self.reranker is not None:
            relevance = self.reranker.relevance([(query, h["text"]) for h in hits])
            for hit, score in zip(hits, relevance, strict=True):
                hit["retrieval_score"], hit["score"] = hit["score"], score
            hits.sort(key=lambda h: -h["score"])
        return hits[:top]
