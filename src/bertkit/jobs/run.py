"""Running a corpus job: in this process, in N local processes, or on Ray Data (`jobs.ray`).

A job (`jobs.work.Job`: an embedding or a prediction job) is picklable; `job.mapper()` loads
its model and turns a shard's rows into the shard's columns. Every runner writes shard k from
rows k*R .. (k+1)*R-1 of the inputs and skips the shards already written, then writes the
complete manifest.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bertkit._device import fit_threads
from bertkit.errors import JobFailed
from bertkit.jobs import shards
from bertkit.jobs.inputs import (
    Position,
    Source,
    corpus_rows,
    estimated_rows,
    manifest_inputs,
    positions,
)
from bertkit.jobs.work import Job, Mapper, process_shard, shard_rows


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


def start_job(kind: str, mapper_class: Callable[[str, Any], Mapper], model: str | os.PathLike,
              inputs: Sequence[str | os.PathLike] | None, out: str | os.PathLike, config: Any,
              settings: dict[str, Any], *, dataset: str | None, split: str, ray: str | None
              ) -> dict[str, Any]:  # fmt: skip
    """The job `bertkit embed` or `predict --out` asks for (`config`, with `settings` by name on
    top) over `inputs` (paths or globs) or a cached `dataset`'s `split`, run into `out` (Parquet
    shards and manifest.json), on Ray Data where `ray` says ("auto" or a cluster address);
    the manifest."""
    from bertkit.jobs.config import sources
    from bertkit.settings import replaced

    config = replaced(config, **settings)
    found = sources(inputs, dataset, split, config.reading.format)
    return run_job(Job(kind, str(model), config, mapper_class), found, Path(out), ray=ray)


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

    return tqdm(total=total, desc=job.kind, unit=" rows", file=sys.stderr, smoothing=0.1)


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
