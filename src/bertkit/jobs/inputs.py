"""The rows of a corpus: many files (globs; CSV, TSV, JSON Lines, JSON, Parquet, datasets
folders) or a dataset by name, read in order, each row with a stable key, streamed.

    sources = expand(["docs/*.jsonl"])
    for row in corpus_rows(sources, "text"):
        row.key, row.text, row.issue      # "docs/a.jsonl:7", "…", None

A row's key is its `--id-column` value where one is named, else `SOURCE:LINE` (the file as
found by the glob, the line the row starts on; a Parquet or arrow row's number). A row whose
text is absent or not a string (`missing`) or blank (`empty`) is still a row: it is written
with its issue, never dropped.

`Position` is where a row starts (the file, the row's index in it, its line and, in JSON Lines,
its byte offset): `corpus_rows(..., start=position)` reads from there without reading what
comes before in JSON Lines and Parquet (other formats are read up to it: `bertkit.rows`, the
one reader of rows), so a worker handed a shard opens the corpus where its shard begins.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from bertkit.errors import DataError
from bertkit.rows import (
    FileConfig,
    Row,
    Start,
    compression_of,
    expand_paths,
    file_format,
    read_rows,
    row_starts,
)

READABLE = ("csv", "tsv", "jsonl", "json", "parquet", "arrow")


@dataclass(frozen=True)
class Source:
    """One input file (or datasets folder): where it is, its format, the name its rows' keys
    carry."""

    path: str
    format: str
    name: str

    def record(self) -> dict[str, Any]:
        """What the manifest records of it: its name, format, bytes and SHA-256 (a folder: of
        its files', in order), and its newlines (a text file's upper bound on its rows), all
        from one read of the bytes."""
        digest, size, lines = hashlib.sha256(), 0, 0
        path = Path(self.path)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            with open(file, "rb") as handle:
                while chunk := handle.read(1 << 24):
                    digest.update(chunk)
                    size += len(chunk)
                    lines += chunk.count(b"\n")
        return {"path": self.name, "format": self.format, "bytes": size,
                "sha256": digest.hexdigest(), "lines": lines}  # fmt: skip


class CorpusRow(NamedTuple):
    key: str  # the id column's value, else SOURCE:LINE
    text: str | None  # None where the row has no text (its issue says why)
    # "missing", "empty", "not text: int", "truncated: N tokens to M"; None: a text to run
    issue: str | None
    kept: dict[str, Any]  # the columns asked to be kept
    source: int  # index of its source
    line: int
    name: str  # its source's name (the file as found)


@dataclass(frozen=True)
class Position:
    """Where a row starts: its source, its index among that source's rows, its line, and
    (JSON Lines) the byte offset of its line."""

    source: int = 0
    index: int = 0
    line: int = 1
    offset: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "index": self.index, "line": self.line,
                "offset": self.offset}  # fmt: skip


@dataclass(frozen=True)
class Columns:
    """Which columns a job reads: the text, an optional id, the ones it keeps."""

    text: str = "text"  # a column, or several joined by a space: "title,text"
    id: str | None = None
    keep: tuple[str, ...] = field(default_factory=tuple)

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(c.strip() for c in self.text.split(",") if c.strip())


def expand(patterns: Sequence[str | os.PathLike], format: str = "auto") -> list[Source]:
    """The files `patterns` name (paths or globs, each glob's matches sorted), in order, once
    each; a pattern matching nothing is a FileNotFoundError naming it."""
    found = [str(path) for path in expand_paths(patterns)]
    sources = []
    for path in found:
        kind = file_format(path, format, default="jsonl")
        if kind not in READABLE:
            raise DataError(path, None, f"a {kind} file holds no table of rows: give CSV, TSV, "
                            "JSON Lines, JSON, Parquet or a datasets folder")  # fmt: skip
        # the path absolute (a Ray worker runs elsewhere), the name as found (the rows' keys)
        sources.append(Source(os.path.abspath(path), kind, path))
    return sources


def dataset_sources(name: str, split: str = "train") -> list[Source]:
    """The cached split of a dataset by name (`NAME[:CONFIG]`), as one source named
    NAME/SPLIT."""
    from bertkit.tasks.named import split_file

    path = split_file(name, split)
    return [Source(str(path), "arrow", f"{name}/{split}")]


def corpus_rows(
    sources: Sequence[Source],
    columns: Columns,
    reading: FileConfig | None = None,
    start: Position | None = None,
) -> Iterator[CorpusRow]:
    """Every row of `sources` in order from `start` (default: the first), as `CorpusRow`s."""
    reading = reading or FileConfig()
    start = start or Position()
    for number, source in enumerate(sources):
        if number < start.source:
            continue
        at = start if number == start.source else Position(number)
        for row in _source_rows(source, columns, reading, at):
            yield _row(source, number, row.line, row.values, columns)


def positions(
    sources: Sequence[Source], columns: Columns, reading: FileConfig, every: int
) -> Iterator[Position]:
    """The position of rows 0, every, 2*every, ... of the corpus (the shards' starts): one
    streaming pass that keeps nothing but the count."""
    count = 0
    for number, source in enumerate(sources):
        needed = columns.texts[:1] if source.format not in ("json", "jsonl") else ()
        for start in row_starts(source.path, needed, reading, format=source.format):
            if count % every == 0:
                yield Position(number, start.row_index, start.line, start.offset)
            count += 1


def estimated_rows(sources: Sequence[Source], records: Sequence[dict[str, Any]]) -> int | None:
    """The corpus's row count where it is cheap to know: Parquet's metadata, a text file's
    newlines (`Source.record`'s: an upper bound); None where a file cannot say (a compressed
    one's newlines are not its rows')."""
    total = 0
    for source, record in zip(sources, records, strict=True):
        if source.format == "parquet":
            import pyarrow.parquet as pq

            total += pq.ParquetFile(source.path).metadata.num_rows
        elif source.format in ("jsonl", "csv", "tsv") and compression_of(source.path) is None:
            total += record["lines"]
        else:
            return None
    return total


# --------------------------------------------------------------------------- one source
def _row(source: Source, number: int, line: int, values: dict[str, Any], columns: Columns
         ) -> CorpusRow:  # fmt: skip
    text = _text_of(values, columns.texts)
    issue = None
    if text is None:
        issue = "missing"
    elif not isinstance(text, str):
        issue, text = f"not text: {type(text).__name__}", None
    elif not text.strip():
        issue, text = "empty", None
    if columns.id is not None:
        key = values.get(columns.id)
        if key is None or (isinstance(key, str) and not key.strip()):
            raise DataError(source.path, line, f"no id in column {columns.id!r} (--id-column)")
        key = str(key)
    else:
        key = f"{source.name}:{line}"
    kept = {name: values.get(name) for name in columns.keep}
    return CorpusRow(key, text, issue, kept, number, line, source.name)


def _text_of(values: dict[str, Any], names: tuple[str, ...]) -> Any:
    """The row's text: its one text column's value, or several columns' texts joined by a
    space (BEIR's title and text), the absent and blank ones left out."""
    if len(names) == 1:
        return values.get(names[0])
    found = [values.get(n) for n in names]
    if all(v is None for v in found):
        return None
    texts = [v for v in found if v is not None]
    if not all(isinstance(v, str) for v in texts):
        return next(v for v in texts if not isinstance(v, str))
    return " ".join(v.strip() for v in texts if v.strip())


def _needed(columns: Columns) -> tuple[str, ...]:
    return (*columns.texts, *([columns.id] if columns.id else []), *columns.keep)


def _source_rows(source: Source, columns: Columns, reading: FileConfig, at: Position
                 ) -> Iterator[Row]:  # fmt: skip
    """A source's rows from `at`. A table's columns are checked on its header or schema; a
    record (JSON, JSON Lines) without the text is a row whose issue says so, and a JSON line
    that is a bare value is that value as the text."""
    needed = columns.texts[:1] if source.format not in ("json", "jsonl") else ()
    optional = tuple(c for c in _needed(columns) if c not in needed)
    start = Start(at.line, at.index, at.offset)
    yield from read_rows(source.path, needed, reading, optional=optional, format=source.format,
                         start=start, bare=columns.texts[0])  # fmt: skip


def manifest_inputs(sources: Sequence[Source]) -> list[dict[str, Any]]:
    """What the manifest records of each input (path, format, bytes, SHA-256)."""
    return [source.record() for source in sources]
