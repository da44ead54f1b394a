"""The device a run or a model uses when none is named (decided here alone), and moving tensors
to it without making the host wait."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch


def default_device(device: str | torch.device | None = None) -> torch.device:
    """`device` as given; where none is: a GPU when one is available, else the CPU (what
    `--device` means when it is left out, for every command)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`. To a GPU through pinned memory (a batch the data workers made is
    pinned already): a copy from pageable memory would make the host wait for every kernel
    queued before it, so the host could not run ahead of the card."""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def as_float64(value: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """`value` as a 0-dim float64 tensor on `like`'s device. A number is written there by a
    fill, not copied from the host (a copy of a host number to a GPU waits as any pageable copy
    does)."""
    if isinstance(value, torch.Tensor) and value.device == like.device:
        return value.to(torch.float64)
    return torch.full((), float(value), dtype=torch.float64, device=like.device)


@dataclass(frozen=True)
class Cpus:
    """The CPUs this process may keep busy: `count`, what limits it (`source`: "affinity" —
    `taskset`, a container's cpuset —, "quota" — a cgroup's CPU quota —, or "machine"), and
    that in words (`why`)."""

    count: int
    source: str
    why: str


@dataclass(frozen=True)
class Threads:
    """torch's thread count for a process (`count`), the CPUs it may use (`cpus`), and what set
    the count (`source`: "flag" — a `--threads` —, "OMP_NUM_THREADS", "workers" — the CPUs
    shared among local processes —, or "cpus"), in words (`why`)."""

    count: int
    cpus: Cpus
    source: str
    why: str


def usable_cpus(cgroup: str | None = "/sys/fs/cgroup") -> Cpus:
    """How many CPUs this process may keep busy, and why: its affinity (`taskset`, a
    container's cpuset), capped by the CPU quota of its cgroup (a container's `--cpus`: v2's
    `cpu.max`, "200000 100000" = 2 CPUs; v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`), never
    the host's count, which a container on a large host would otherwise take for its own.

    >>> usable_cpus(None).count >= 1
    True
    """
    try:
        cpus = Cpus(len(os.sched_getaffinity(0)), "affinity", "the CPUs of this process's affinity")
    except AttributeError:  # pragma: no cover - not Linux
        cpus = Cpus(os.cpu_count() or 1, "machine", "the machine's CPUs")
    if cgroup is None:
        return cpus
    root = Path(cgroup)
    quota = period = None
    try:
        if (root / "cpu.max").exists():  # cgroup v2
            limit, _, each = (root / "cpu.max").read_text().strip().partition(" ")
            if limit != "max":
                quota, period = float(limit), float(each or 100_000)
        elif (root / "cpu" / "cpu.cfs_quota_us").exists():  # cgroup v1
            value = float((root / "cpu" / "cpu.cfs_quota_us").read_text())
            if value > 0:
                quota = value
                period = float((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return cpus
    if quota and period and math.ceil(quota / period) < cpus.count:
        return Cpus(max(1, math.ceil(quota / period)), "quota",
                    f"the cgroup's CPU quota ({quota:.0f} us each {period:.0f} us)")  # fmt: skip
    return cpus


def thread_policy(given: int | None = None, *, workers: int = 1,
                  cgroup: str | None = "/sys/fs/cgroup") -> Threads:  # fmt: skip
    """How many threads torch computes with, and what set the count — the one thread policy
    of every command, the Python API, training, the corpus jobs and `serve`: `given` (a
    `--threads`); else the user's OMP_NUM_THREADS (torch has read it); else the usable CPUs
    (`usable_cpus`) shared among `workers` local processes; else torch's own count, lowered to
    the usable CPUs where it would run more: torch's default follows the affinity (`taskset
    -c 0`: one thread) but reads no container CPU quota, so a 2-CPU quota on a large host
    would leave it one thread per host core on 2 CPUs' worth of time, each operation waiting
    for its slowest.

    >>> thread_policy(3).count, thread_policy(3).source
    (3, 'flag')
    """
    import torch

    cpus = usable_cpus(cgroup)
    if given is not None:
        return Threads(given, cpus, "flag", "--threads")
    if os.environ.get("OMP_NUM_THREADS"):
        return Threads(torch.get_num_threads(), cpus, "OMP_NUM_THREADS", "OMP_NUM_THREADS")
    if workers > 1:
        return Threads(max(1, cpus.count // workers), cpus, "workers", f"{workers} workers")
    return Threads(min(torch.get_num_threads(), cpus.count), cpus, "cpus", cpus.why)


def fit_threads(given: int | None = None, *, workers: int = 1) -> Threads:
    """torch's threads set as `thread_policy` chooses them; the choice. The default of every
    command and of the Python API (`predict`, `embed`, training, `serve`)."""
    import torch

    threads = thread_policy(given, workers=workers)
    if torch.get_num_threads() != threads.count:
        torch.set_num_threads(threads.count)
    return threads
