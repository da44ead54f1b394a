"""`bertkit embed`: a vector for every row of a corpus, in Parquet shards with a manifest.

    embed("sentence-transformers/all-MiniLM-L6-v2", ["docs/*.jsonl"], "vectors/")
    embed("runs/bert", ["news.csv"], "vectors/", EmbedConfig(pooling="cls", text_column="body"))

The model is any that yields sentence vectors: a sentence-transformers folder or Hub name (its
pooling and normalisation, read from its module files), a bertkit embedding folder, or any BERT
with `pooling` cls or mean. Each shard's texts are sorted longest first before they are cut
into batches (as sentence-transformers and the `Embedder` sort), so like lengths run together;
the window is the shard, so memory stays bounded and a batch never mixes shards (a resumed run
makes the same batches). Texts over the model's length are cut to it and said so per row.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.jobs.config import EmbedConfig, sources
from bertkit.jobs.inputs import CorpusRow


class EmbeddingMapper:
    """A loaded embedding model that turns a shard's rows into its columns: `vector` (None for
    a row with an issue) and the rows' issues (truncation added). Its texts take the prompt
    `config.prompt_name`, else the folder's prompt for their `role` (document: the corpus;
    query: search's queries)."""

    def __init__(self, model: str | os.PathLike, config: EmbedConfig,
                 role: str = "document") -> None:  # fmt: skip
        from bertkit.core.embedding import declared_normalize
        from bertkit.inference.embedder import Embedder

        embedder = Embedder(model, device=config.device, batch_size=config.batch_size,
                            precision=config.precision, pooling=config.pooling,
                            max_seq_length=config.max_seq_length,
                            truncate_dim=config.dimensions, sparse=config.sparse)  # fmt: skip
        embedder.use_prompt(config.prompt_name or embedder.prompt_for(role))
        self.embedder, self.loaded = embedder, embedder.loaded
        # sparse (SPLADE) or per-token vectors where asked or where the folder declares them
        self.sparse = config.sparse or embedder.declares_sparse
        self.multi_vector = (config.multi_vector or embedder.declares_multi_vector) and not (
            self.sparse)  # fmt: skip
        self.role = role
        if config.sparse and config.multi_vector:
            raise ValueError("--sparse or --multi-vector: a job writes one kind of vectors")
        if self.sparse and config.dimensions is not None:
            raise ValueError("--dimensions cuts dense vectors; sparse vectors span the "
                             "vocabulary")  # fmt: skip
        embedder.normalize = (declared_normalize(embedder.loaded.path)
                              if config.normalize == "auto" else config.normalize == "yes")  # fmt: skip
        self.normalize, self.max_seq_length = embedder.normalize, embedder.max_seq_length
        self.dtype = config.dtype
        self.dimension = embedder.token_dimension if self.multi_vector else embedder.dimension

    def describe(self) -> dict[str, Any]:
        """What the vectors depend on, for the manifest."""
        kind: dict[str, Any] = {}
        if self.sparse:
            kind = {"vectors": "sparse", "splade": vars(self.embedder.splade),
                    "vocabulary": self.loaded.config.vocab_size}  # fmt: skip
        elif self.multi_vector:
            # as JSON reads it back (lists, not tuples), so a resumed job's plan compares equal
            settings = json.loads(json.dumps(vars(self.embedder.multi)))
            kind = {"vectors": "multi-vector", "multi_vector": settings}
        return {
            "kind": "embed",
            **kind,
            "pooling": self.embedder.pooling,
            "normalize": self.normalize,
            "dimension": self.dimension,
            "dtype": self.dtype,
            "max_seq_length": self.max_seq_length,
            "precision": self.loaded.precision.name,
            "prompt_name": self.embedder.prompt_name,
            "prompt": self.embedder.prompt,
            "dimensions": self.embedder.truncate_dim,
        }

    def __call__(self, rows: Sequence[CorpusRow]) -> tuple[dict[str, Any], list[str | None]]:
        import pyarrow as pa

        issues = [row.issue for row in rows]
        todo = [i for i, row in enumerate(rows) if row.text is not None]
        inputs, lengths = self.embedder.inputs([str(rows[i].text) for i in todo])
        for i, length in zip(todo, lengths, strict=True):
            if length > self.max_seq_length:
                issues[i] = f"truncated: {length} tokens to {self.max_seq_length}"
        if self.sparse:
            return self._sparse_columns(len(rows), todo, inputs), issues
        if self.multi_vector:
            texts = [str(rows[i].text) for i in todo]
            inputs = self.embedder.multi_inputs(texts, self.role)
            return self._multi_columns(len(rows), todo, inputs), issues
        vectors = self.embedder.encode(inputs)[0]
        dtype = np.float16 if self.dtype == "float16" else np.float32
        values = np.zeros((len(rows), self.dimension), dtype)
        values[todo] = vectors.astype(dtype)
        valid = np.zeros(len(rows), bool)
        valid[todo] = True
        flat = pa.array(values.reshape(-1))
        column = pa.FixedSizeListArray.from_arrays(flat, self.dimension, mask=pa.array(~valid))
        return {"vector": column}, issues

    def _sparse_columns(self, count: int, todo: list[int], inputs: list[Any]) -> dict[str, Any]:
        """`indices` (int32) and `values` (float32) of each row's sparse vector: lists, by
        index; null for a row with an issue."""
        import pyarrow as pa

        found = dict(zip(todo, self.embedder.encode_sparse(inputs)[0], strict=True))
        indices = [found[i][0] if i in found else None for i in range(count)]
        values = [found[i][1] if i in found else None for i in range(count)]
        return {"indices": pa.array(indices, pa.list_(pa.int32())),
                "values": pa.array(values, pa.list_(pa.float32()))}  # fmt: skip

    def _multi_columns(self, count: int, todo: list[int], inputs: list[Any]) -> dict[str, Any]:
        """`vectors`: each row's per-token vectors, a list of fixed-size lists (of the job's
        dtype); null for a row with an issue."""
        import pyarrow as pa

        dtype = np.float16 if self.dtype == "float16" else np.float32
        found = dict(zip(todo, self.embedder.encode_multi(inputs, self.role)[0], strict=True))
        kind = pa.list_(pa.list_(pa.from_numpy_dtype(dtype), self.dimension))
        tokens = [found[i].astype(dtype) if i in found else None for i in range(count)]
        counts = [len(t) if t is not None else 0 for t in tokens]
        flat = np.concatenate([t for t in tokens if t is not None] or
                              [np.zeros((0, self.dimension), dtype)]).reshape(-1)  # fmt: skip
        inner = pa.FixedSizeListArray.from_arrays(pa.array(flat), self.dimension)
        offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        valid = pa.array([t is None for t in tokens])
        column = pa.ListArray.from_arrays(offsets, inner, type=kind, mask=valid)
        return {"vectors": column}

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(N, H) float32 vectors of `texts` (queries, texts given on the command line)."""
        return self.embedder(texts)

    def answers(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        """Each text's vector as a JSON-ready record: {"vector"}, a sparse model's {"indices",
        "values"}, a multi-vector model's {"vectors"} (what `bertkit predict` prints)."""
        if self.sparse:
            return [{"indices": i.tolist(), "values": v.tolist()}
                    for i, v in self.embed_sparse_texts(texts)]  # fmt: skip
        if self.multi_vector:
            return [{"vectors": m.tolist()} for m in self.embed_multi_texts(texts)]
        return [{"vector": v.tolist()} for v in self.embed_texts(texts)]

    def embed_multi_texts(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The per-token vectors of `texts` (queries against a multi-vector job)."""
        return self.embedder.multi_vector(texts, role=self.role)

    def embed_sparse_texts(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The sparse vectors of `texts` (queries against a sparse job): (indices, values)."""
        return self.embedder.sparse(texts)


def query_embedder(plan: dict[str, Any], model: str | os.PathLike | None = None, *,
                   device: str | None = None, batch_size: int = 64) -> EmbeddingMapper:  # fmt: skip
    """The embedder of queries against vectors an embedding job wrote, read from its `plan`
    (the manifest's): its model (or `model`, which must make vectors as wide), pooling,
    normalisation, length, dimensions and precision — the queries embedded as the corpus was;
    their prompt the folder's query prompt, else the corpus's."""
    from bertkit.core.embedding import prompt_for

    config = EmbedConfig(
        pooling=plan["pooling"], normalize="yes" if plan["normalize"] else "no",
        max_seq_length=plan["max_seq_length"], precision=plan.get("precision", "auto"),
        dimensions=plan.get("dimensions"), sparse=plan.get("vectors") == "sparse",
        multi_vector=plan.get("vectors") == "multi-vector",
        batch_size=batch_size, device=device,
    )  # fmt: skip
    model = str(model or plan["model"]["name"])
    mapper = EmbeddingMapper(model, config, role="query")
    if prompt_for(mapper.embedder.prompts, "query") is None and plan.get("prompt_name"):
        mapper.embedder.use_prompt(plan["prompt_name"])  # a symmetric model: the corpus's
    if mapper.dimension != plan["dimension"]:
        raise ValueError(f"{model}: makes {mapper.dimension}-wide vectors, the corpus was "
                         f"embedded {plan['dimension']}-wide")  # fmt: skip
    return mapper


def embed(model: str | os.PathLike, inputs: Sequence[str | os.PathLike] | None,
          out: str | os.PathLike, config: EmbedConfig | None = None, *,
          dataset: str | None = None, split: str = "train", ray: str | None = None,
          **settings: Any) -> dict[str, Any]:  # fmt: skip
    """Embed every row of `inputs` (paths or globs) or of the cached `dataset` (NAME[:CONFIG],
    its `split`) into `out` (Parquet shards and manifest.json); `ray`: run on Ray Data ("auto"
    or a cluster address). Returns the manifest."""
    from bertkit.jobs.run import start_job

    return start_job("embed", EmbeddingMapper, model, inputs, out, config or EmbedConfig(),
                     settings, dataset=dataset, split=split, ray=ray)  # fmt: skip


def embed_to_file(
    model: str | os.PathLike,
    inputs: Sequence[str | os.PathLike],
    output: str | os.PathLike | None,
    config: EmbedConfig | None = None,
    *,
    chunk: int = 2048,
) -> int:
    """Each row of `inputs` with its vector, as JSON Lines in `output` (None or "-": stdout),
    `chunk` rows at a time: the small-file form of `embed` (what `bertkit predict` writes for
    an embedding model given a file): `vector`, or a sparse model's `indices` and `values`, or
    a multi-vector model's `vectors`. Rows with an issue get nulls and their `issue`. Returns
    the rows written."""
    import itertools

    from bertkit.inference.predict import RowWriter
    from bertkit.jobs.inputs import corpus_rows

    config = config or EmbedConfig()
    mapper = EmbeddingMapper(model, config)
    found = sources(inputs, None, "train", config.reading.format)
    rows = corpus_rows(found, config.columns, config.reading)
    target = None if output is None or str(output) == "-" else Path(output)
    written = 0
    with RowWriter(target, "jsonl") as writer:
        while batch := list(itertools.islice(rows, chunk)):
            columns, issues = mapper(batch)
            values = {name: column.to_pylist() for name, column in columns.items()}
            for n, (row, issue) in enumerate(zip(batch, issues, strict=True)):
                record = {"id": row.key, config.text_column: row.text, **row.kept,
                          **{name: value[n] for name, value in values.items()}}  # fmt: skip
                writer.write(record | ({"issue": issue} if issue else {}))
            written += len(batch)
    return written
