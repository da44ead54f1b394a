"""Running a corpus job: in this process, in N local processes, or on Ray Data (`jobs.ray`).

A job (`EmbedJob`, `PredictJob`) is picklable; `job.mapper()` loads its model and turns a
shard's rows into the shard's columns. Every runner writes shard k from rows k*R .. (k+1)*R-1
of the inputs and skips the shards already written, then writes the complete manifest.
"""

from __future__ import annotations

import functools
import itertools
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from bertkit._device import fit_threads
from bertkit.errors import JobFailed
from bertkit.jobs import shards
from bertkit.jobs.inputs import (
    CorpusRow,
    Position,
    Source,
    corpus_rows,
    estimated_rows,
    manifest_inputs,
    positions,
)


class Mapper(Protocol):
    def describe(self) -> dict[str, Any]: ...

    def __call__(self, rows: Sequence[CorpusRow]) -> tuple[dict[str, Any], list[str | None]]: ...


class Job(Protocol):
    model: str
    config: Any

    def mapper(self) -> Mapper: ...


def weights_digest(path: Path) -> str:
    """SHA-256 of a model folder's weights (safetensors, else pytorch_model.bin, else the ONNX
    export)."""
    from bertkit._io import sha256_of

    for name in ("model.safetensors", "pytorch_model.bin", "model.onnx"):
        if (path / name).exists():
            return sha256_of(path / name)
    raise FileNotFoundError(f"{path}: no weights (model.safetensors or pytorch_model.bin)")


def plan_of(job: Job, mapper: Mapper, sources: Sequence[Source]) -> dict[str, Any]:
    """Everything the shards depend on (what a resume must find unchanged)."""
    config = job.config
    loaded = mapper.loaded  # type: ignore[attr-defined]
    columns = config.columns
    return {
        **mapper.describe(),
        "model": {"name": job.model, "sha256": weights_digest(loaded.path)},
        "inputs": manifest_inputs(sources),
        "columns": {"text": columns.text, "id": columns.id, "keep": list(columns.keep)},
        "reading": {k: v for k, v in vars(config.reading).items() if v is not None},
        "rows_per_shard": config.rows_per_shard,
        "batch_size": config.batch_size,
    }


def run_job(job: Job, sources: Sequence[Source], out: Path, *, ray: str | None = None
            ) -> dict[str, Any]:  # fmt: skip
    """Run `job` over `sources` into `out`; the complete manifest."""

    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ImportError(
            "a corpus job writes Parquet shards: pip install 'bertkit[parquet]'"
        ) from None

    config = job.config
    workers = config.workers
    threads = fit_threads(config.threads, workers=workers).count
    mapper = job.mapper()
    plan = plan_of(job, mapper, sources)
    done = shards.start(out, plan, resume=config.resume, overwrite=config.overwrite)
    bar = _bar(config.progress, estimated_rows(sources, plan["inputs"]), job)
    try:
        if ray is None and workers == 1:
            count = _run_here(mapper, sources, config, out, done, bar)
        else:
            del mapper  # the workers load their own
            starts = list(positions(sources, config.columns, config.reading,
                                    config.rows_per_shard))  # fmt: skip
            todo = [k for k in range(len(starts)) if k not in done]
            if ray is not None:
                from bertkit.jobs.ray import run_on_ray

                run_on_ray(job, list(sources), out, starts, todo, ray, threads, bar)
            else:
                _run_processes(job, sources, out, starts, todo, threads, bar)
            count = len(starts)
    finally:
        if bar is not None:
            bar.close()
    manifest = shards.finish(out, plan, count)
    if manifest["rows"] == 0:
        print(f"warning: {', '.join(s.path for s in sources)}: no rows", file=sys.stderr)
    return manifest


def _bar(progress: bool, total: int | None, job: Job):
    if not progress:
        return None
    from tqdm import tqdm

    kind = type(job).__name__.removesuffix("Job").lower()
    return tqdm(total=total, desc=kind, unit=" rows", file=sys.stderr, smoothing=0.1)


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


def _run_here(mapper: Mapper, sources, config, out: Path, done: set[int], bar) -> int:
    """This process, streaming: the rows of each shard gathered, run, written; done shards
    skipped. Returns the number of shards."""
    rows = corpus_rows(sources, config.columns, config.reading)
    number = 0
    while chunk := list(itertools.islice(rows, config.rows_per_shard)):
        if number not in done:
            process_shard(mapper, out, number, chunk)
        if bar is not None:
            bar.update(len(chunk))
        number += 1
    return number


def shard_rows(sources, config, start: Position) -> list[CorpusRow]:
    """The rows of the shard starting at `start`."""
    rows = corpus_rows(sources, config.columns, config.reading, start=start)
    return list(itertools.islice(rows, config.rows_per_shard))


def _worker(job: Job, sources, out: str, starts: list[Position], todo: list[int],
            threads: int) -> None:  # fmt: skip
    fit_threads(threads)
    mapper = job.mapper()
    for number in todo:
        process_shard(mapper, Path(out), number, shard_rows(sources, job.config, starts[number]))


def _run_processes(job: Job, sources, out: Path, starts, todo: list[int], threads: int,
                   bar) -> None:  # fmt: skip
    """`workers` spawned processes, shard k to worker k mod N; progress from the shards
    written."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    workers = job.config.workers
    processes = [
        context.Process(target=_worker, args=(job, list(sources), str(out), starts,
                                              todo[w::workers], threads), daemon=True)
        for w in range(workers)
    ]  # fmt: skip
    for process in processes:
        process.start()
    reported = 0
    total = len(todo)
    try:
        while any(p.is_alive() for p in processes):
            time.sleep(0.5)
            written = len(shards.done_shards(out)) - (len(starts) - total)
            if bar is not None and written > reported:
                bar.update((written - reported) * job.config.rows_per_shard)
                reported = written
    finally:
        for process in processes:
            process.join(timeout=1 if process.is_alive() else None)
            if process.is_alive():
                process.kill()
    failed = [p.exitcode for p in processes if p.exitcode != 0]
    if failed:
        raise JobFailed(
            f"{out}: {len(failed)} of {workers} workers failed (exit {failed[0]}); what they "
            "wrote is kept: run again with --resume"
        )
