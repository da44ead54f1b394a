"""One shard's work, wherever it runs (this process, N local processes, a Ray actor): its rows
read from their position, run through the job's mapper, written atomically as its shard."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bertkit.jobs import shards
from bertkit.jobs.inputs import CorpusRow, Position, corpus_rows


class Mapper(Protocol):
    def describe(self) -> dict[str, Any]: ...

    def __call__(self, rows: Sequence[CorpusRow]) -> tuple[dict[str, Any], list[str | None]]: ...


@dataclass
class Job:
    """A corpus job as handed to each process that runs part of it (picklable): what it is
    (`kind`: embed, predict; its progress bar's name), the model, its settings, and the class
    (`EmbeddingMapper`, `PredictionMapper`) whose instance loads the model in that process and
    turns a shard's rows into the shard's columns."""

    kind: str
    model: str
    config: Any
    mapper_class: Callable[[str, Any], Mapper]

    def mapper(self) -> Mapper:
        return self.mapper_class(self.model, self.config)


def process_shard(mapper: Mapper, out: Path, number: int, rows: Sequence[CorpusRow]) -> int:
    """Run `rows` through `mapper` and write them as shard `number`."""
    import pyarrow as pa

    columns, issues = mapper(rows)
    table: dict[str, Any] = {"id": pa.array([r.key for r in rows], pa.string())}
    table.update(columns)
    for name in rows[0].kept if rows else {}:
        table[name] = pa.array([r.kept[name] for r in rows])
    table["issue"] = pa.array(issues, pa.string())
    table["source"] = pa.array([r.name for r in rows], pa.string())
    table["line"] = pa.array([r.line for r in rows], pa.int64())
    shards.write_shard(out, number, pa.table(table))
    release_memory()
    return len(rows)


@functools.cache
def _libc() -> Any:
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:  # pragma: no cover
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_memory() -> None:
    """Hand what a shard freed back to the system. glibc keeps freed heap for reuse, and a
    shard's texts, ids and tables, freed each time in another order, left the resident size
    drifting up by tens of MB over a corpus (MiniLM's first layer, 10,000 rows a shard: peak
    785 MB at 10k rows, 851 at 100k; trimmed after each shard: 812 and 821)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def shard_rows(sources, config, start: Position) -> list[CorpusRow]:
    """The rows of the shard starting at `start`."""
    rows = corpus_rows(sources, config.columns, config.reading, start=start)
    return list(itertools.islice(rows, config.rows_per_shard))
