"""A corpus job on Ray Data (`--ray [ADDRESS]`, extra `bertkit[ray]`).

The shards still to write become a Ray dataset of their starting positions; `map_batches` hands
them, one at a time, to a pool of actors that each load the model once, read their shard's rows
from its position, and write it (atomically) into the output folder — a folder every node sees
(a shared file system). Ray restarts an actor whose process died and retries its shard, and a
job started again skips the shards already written, so a lost node loses no work. The driver
writes the manifest once every shard is in.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertkit.errors import JobFailed
from bertkit.jobs.inputs import Position


def _ray():
    try:
        import ray
        import ray.data
    except ImportError:
        raise ImportError("--ray needs Ray Data: pip install 'bertkit[ray]'") from None
    return ray


class ShardWorker:
    """One actor of the pool: the model loaded once, shards written as they come."""

    def __init__(self, job: Any, sources: list, out: str, threads: int) -> None:
        from bertkit._device import fit_threads

        fit_threads(threads)
        self.job, self.sources, self.out = job, sources, Path(out)
        self.mapper = job.mapper()

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from bertkit.jobs.work import process_shard, shard_rows

        written = []
        for number, source, index, line, offset in zip(
            batch["shard"], batch["source"], batch["index"], batch["line"], batch["offset"],
            strict=True,
        ):  # fmt: skip
            start = Position(int(source), int(index), int(line),
                             None if offset is None or offset < 0 else int(offset))  # fmt: skip
            rows = shard_rows(self.sources, self.job.config, start)
            written.append(process_shard(self.mapper, self.out, int(number), rows))
        return {"shard": list(batch["shard"]), "rows": written, "pid": [os.getpid()] * len(written)}


def run_on_ray(job: Any, sources: list, out: Path, starts: list[Position], todo: list[int],
               address: str, threads: int, bar: Any) -> list[int]:  # fmt: skip
    """Write the shards `todo` on the Ray cluster at `address` ("auto": the one this machine
    is in, else a new local one), each actor of `threads` torch threads (the job's `threads`
    unset: the CPUs of the cluster's narrowest node, one actor a node); the pids of the
    processes that wrote them."""
    with connected(address) as ray:
        if not todo:
            return []
        items = [{"shard": k, "source": starts[k].source, "index": starts[k].index,
                  "line": starts[k].line,
                  "offset": -1 if starts[k].offset is None else starts[k].offset}
                 for k in todo]  # fmt: skip
        cpus = ray.cluster_resources().get("CPU", 1)
        if job.config.threads is None:  # one actor a node, as wide as the narrowest node
            widths = [n["Resources"].get("CPU", 1) for n in ray.nodes() if n.get("Alive")]
            threads = max(1, int(min(widths or [1])))
        actors = max(1, min(len(todo), job.config.workers if job.config.workers > 1
                            else int(cpus // threads)))  # fmt: skip
        import logging

        logging.getLogger("ray.data").setLevel(logging.ERROR)
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # (the job's own bar counts rows)
        dataset = ray.data.from_items(items, override_num_blocks=len(items))
        results = dataset.map_batches(
            ShardWorker,
            fn_constructor_args=(job, list(sources), str(out.resolve()), threads),
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=threads,
        )  # fmt: skip  (Ray Data's actors restart and retry their task without end by default)
        pids = []
        try:
            for row in results.iter_rows():
                pids.append(int(row["pid"]))
                if bar is not None:
                    bar.update(int(row["rows"]))
        except ray.exceptions.RayError as err:  # a worker's own error, past Ray's retries
            said = [line for line in str(err).splitlines() if line.strip()]
            raise JobFailed(f"{out}: a Ray worker failed: {said[-1] if said else err} (what "
                               "was written is kept: run again with --resume)") from None  # fmt: skip
        return pids


@contextlib.contextmanager
def connected(address: str) -> Iterator[Any]:
    """Ray, joined to the cluster at `address` for the block — the one way every Ray run of
    bertkit (corpus jobs, `prepare --ray`) connects: "auto" (or "local") is the cluster this
    machine is in, else a new one here; a connection made here is closed after it (one
    already made is kept)."""
    ray = _ray()
    started_here = not ray.is_initialized()
    if started_here:
        at = None if address in ("auto", "local") and not _cluster_here() else address
        ray.init(address=at, log_to_driver=False, include_dashboard=False,
                 **_loopback(address))  # fmt: skip
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


def _loopback(address: str) -> dict[str, str]:
    """A cluster on this machine's loopback addresses (127.0.0.2:PORT, a test's): the driver
    joins it there too. Ray would otherwise take this machine's outward address for its own,
    and talk to the cluster through it."""
    import ipaddress

    host = address.rsplit(":", 1)[0].strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        return {}
    return {"_node_ip_address": host} if loopback else {}


def _cluster_here() -> bool:
    """Whether this machine is in a Ray cluster (`ray start` was run here)."""
    return Path("/tmp/ray/ray_current_cluster").exists() or bool(os.environ.get("RAY_ADDRESS"))
