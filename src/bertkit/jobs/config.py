"""The corpus jobs' settings, declared once: what every job takes (`JobConfig`: its inputs'
columns and reading, its shards, resuming, who runs it and with how many threads) and what each
job adds (`EmbedConfig`, `PredictJobConfig`). The commands' flags are these fields
(`settings.add_flags`): `bertkit embed`'s all of them, `bertkit predict --out FOLDER`'s the
job's beside its own."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from bertkit.jobs.inputs import Columns, Source
from bertkit.rows import FileConfig
from bertkit.settings import (
    Settings,
    device_setting,
    nested,
    precision_setting,
    setting,
)
from bertkit.tasks.saved import HeadConfig

DTYPES = ("float32", "float16")
NORMALIZE = ("auto", "yes", "no")


@dataclass
class JobConfig(Settings):
    """What every corpus job takes: its inputs' columns, its shards, resuming, who runs it."""

    text_column: str = setting(
        "text",
        "the column (JSON key) holding each row's text; several (title,text): joined by a space",
    )
    id_column: str | None = setting(
        None, "a column of unique row ids to write (default: FILE:LINE, the row's place)"
    )
    keep_columns: str | None = setting(None, "columns to copy into the output: a,b,c")
    rows_per_shard: int = setting(10_000, "rows in each output shard", check="positive")
    batch_size: int = setting(64, "texts in a model call", check="positive")
    resume: bool = setting(False, "continue the job OUT holds (its shards are kept)")
    overwrite: bool = setting(False, "delete the job OUT holds and start again")
    workers: int = setting(
        1, "local processes sharing the cores (each loads the model once)", check="positive"
    )
    threads: int | None = setting(
        None,
        "torch threads of each process (default: the usable cores / workers)",
        check="positive",
    )
    progress: bool = setting(True, "a progress bar (rows/s, time left)")
    device: str | None = device_setting()
    precision: str = precision_setting()
    reading: FileConfig = nested(
        FileConfig,
        helps={"format": "of the inputs (auto: by extension)"},
    )

    @property
    def columns(self) -> Columns:
        keep = tuple(c.strip() for c in (self.keep_columns or "").split(",") if c.strip())
        return Columns(self.text_column, self.id_column, keep)


@dataclass
class EmbedConfig(JobConfig):
    """The settings of `bertkit embed` (its flags are these fields)."""

    max_seq_length: int | None = setting(
        None,
        "pieces a text is cut to (default: the model's declared length, else what its "
        "tokenizer and positions allow)",
        check="positive",
    )
    pooling: str | None = setting(
        None,
        "mean or cls (default: the folder's declared pooling, else mean)",
        choices=("mean", "cls"),
    )
    normalize: str = setting(
        "auto",
        "unit-length vectors: auto (as the folder declares: sentence-transformers' "
        "Normalize module; a plain BERT: no), yes, no",
        choices=NORMALIZE,
    )
    dtype: str = setting("float32", "the vectors' type in the shards", choices=DTYPES)
    prompt_name: str | None = setting(
        None,
        "a prompt the folder declares (config_sentence_transformers.json), put before each "
        "text (default: its document prompt — document, passage or corpus — else its default "
        "prompt, else none); search then gives queries the folder's query prompt",
    )
    sparse: bool = setting(
        False,
        "sparse (SPLADE) vectors from the masked-LM head: (index, value) pairs in the columns "
        "indices and values (a SparseEncoder folder: always)",
    )
    multi_vector: bool = setting(
        False,
        "per-token vectors for late interaction (ColBERT's MaxSim), a list per row in the "
        "column vectors (a MultiVectorEncoder folder: always)",
    )
    dimensions: int | None = setting(
        None,
        "keep each vector's first N coordinates (a Matryoshka model's smaller size), cut "
        "before normalising; search embeds its queries to match",
        check="positive",
    )


@dataclass
class PredictJobConfig(JobConfig):
    """A corpus job of `Predictor`: `JobConfig`, what the model reads and how a saved head
    answers (`HeadConfig`)."""

    text_pair_column: str | None = setting(None, "a second text column (pair tasks)")
    rerank: bool = setting(False, "rows of a query and its texts, ranked by a cross-encoder")
    raw_scores: bool = setting(False, "with rerank: a cross-encoder's raw logits")
    heads: HeadConfig = nested(HeadConfig)

    @property
    def columns(self) -> Columns:
        base = super().columns
        if self.rerank:
            return Columns("query", base.id, ("texts", *base.keep))
        pair = (self.text_pair_column,) if self.text_pair_column else ()
        return Columns(base.text, base.id, (*pair, *base.keep))


# the job's fields that `bertkit predict` declares as its own (a model's reading defaults)
PREDICT_OWN = ("text_column", "batch_size", "device", "precision", "progress", "reading")


def sources(inputs: Sequence[str | os.PathLike] | None, dataset: str | None, split: str,
            format: str) -> list[Source]:  # fmt: skip
    """A job's inputs: files and globs (`inputs`, read as `format` says) or a cached `dataset`'s
    `split`, one of the two."""
    from bertkit.jobs.inputs import dataset_sources, expand

    if bool(inputs) == bool(dataset):
        raise ValueError("give the inputs (--input FILES) or --dataset NAME, one of the two")
    return dataset_sources(dataset, split) if dataset else expand(inputs or (), format)
