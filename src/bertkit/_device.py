"""The device a run or a model uses when none is named (decided here alone), and moving tensors
to it without making the host wait."""

from __future__ import annotations

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


def usable_cpus(cgroup: str | None = "/sys/fs/cgroup") -> tuple[int, str]:
    """How many CPUs this process may keep busy, and why: its affinity (`taskset`, a
    container's cpuset), capped by the CPU quota of its cgroup (a container's `--cpus`: v2's
    `cpu.max`, "200000 100000" = 2 CPUs; v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`), never
    the host's count, which a container on a large host would otherwise take for its own.

    >>> usable_cpus(None)[0] >= 1
    True
    """
    import math
    import os
    from pathlib import Path

    try:
        count, why = len(os.sched_getaffinity(0)), "the CPUs of this process's affinity"
    except AttributeError:  # pragma: no cover - not Linux
        count, why = os.cpu_count() or 1, "the machine's CPUs"
    if cgroup is None:
        return count, why
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
        return count, why
    if quota and period and math.ceil(quota / period) < count:
        count = max(1, math.ceil(quota / period))
        why = f"the cgroup's CPU quota ({quota:.0f} us each {period:.0f} us)"
    return count, why


def fit_threads() -> int:
    """torch's threads, lowered to the CPUs this process may use (`usable_cpus`) where torch
    would run more: torch's default follows the affinity (`taskset -c 0`: one thread) but
    reads no container CPU quota, so a 2-CPU quota on a large host would leave it one thread
    per host core on 2 CPUs' worth of time, each operation waiting for its slowest. The user's own count (OMP_NUM_THREADS) is kept. The
    default of every command and of the Python API (`predict`, `embed`, training, `serve`)."""
    import os

    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    usable = usable_cpus()[0]
    if torch.get_num_threads() > usable:
        torch.set_num_threads(usable)
    return torch.get_num_threads()
