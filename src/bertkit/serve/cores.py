"""How many threads the model computes with while it shares the machine: the CPUs this process
may use (`_device.usable_cpus`) less what other processes keep busy on them, measured while
serving.

Why (docs/results/serve#shared-machine): torch's OpenMP team is one thread per usable CPU and
runs each operation as a team, so the team goes at the pace of its slowest member. When
another process (a batch job, or the application calling the server on the same cores) holds
one of those CPUs, the thread that shares it is descheduled for whole time slices while the
others spin at the barrier waiting for it: on 2 cores of a Zen 3, one busy process beside the
server cut `bertkit serve` from 280 requests/s alone to 98 with a fixed team of two (the
model's CPU per request 6.7 -> 12.9 ms at the same batches); with the count from here, 178.
Beside a Python client on the same cores (64 httpx connections) two threads left the client
66% of a core and served 47 requests/s; one, 75, the client then at 95% of a core and what
limits the rate.

So before each batch the inference thread asks `threads()`: every `window` seconds it reads
the time the CPUs of this process's affinity were busy (/proc/stat, per CPU) less this
process's own CPU time, an average of how many CPUs others kept busy, smoothed over the last
few windows, and answers `usable` less `others` rounded (at least 1). Under a CPU quota (a
container's `--cpus`) the busy time is the cgroup's own (its cpu.stat) against the quota:
other processes in the same container are what competes there. Linux only; elsewhere, or
when the files cannot be read, always `usable`.

>>> share = CoreShare(Cpus(2, "affinity", "test"), stat=None)
>>> share.threads()
2
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bertkit._device import Cpus, usable_cpus

PROC_STAT = "/proc/stat"


class CoreShare:
    """The thread count for the next batch (`threads()`), from the CPU time other processes
    take on this process's CPUs."""

    def __init__(self, cpus: Cpus | None = None, *, stat: str | None = PROC_STAT,
                 cgroup: str | None = "/sys/fs/cgroup", window: float = 0.25,
                 smoothing: float = 0.5, fixed: tuple[int, str] | None = None) -> None:  # fmt: skip
        """`cpus`: the CPUs this process may use (default: `usable_cpus`); `fixed`: (threads,
        what set them) — a count kept as given, never adapted."""
        self.cpus = cpus = usable_cpus(cgroup) if cpus is None else cpus
        self.usable, self.why = cpus.count, cpus.why
        self.window, self.smoothing = window, smoothing
        self.others = 0.0  # CPUs others keep busy (smoothed)
        self.set_by: str | None
        self.current, self.set_by = fixed if fixed is not None else (self.usable, None)
        self.changes = 0  # how often the count changed (for /info)
        self._read = self._reader(stat, cgroup) if fixed is None else None
        self._last = self._sample() if self._read is not None else None

    def threads(self) -> int:
        """The threads to compute the next batch with."""
        if self._read is None or self.usable == 1:
            return self.current
        now = time.monotonic()
        if self._last is None or now - self._last[0] < self.window:
            return self.current
        sample = self._sample()
        if sample is None:
            return self.current
        (then, busy_then, own_then), (_, busy, own) = self._last, sample
        self._last = sample
        seen = max(0.0, (busy - busy_then) - (own - own_then)) / (now - then)
        self.others += self.smoothing * (min(seen, self.usable) - self.others)
        threads = max(1, self.usable - int(self.others + 0.5))
        if threads != self.current:
            self.current, self.changes = threads, self.changes + 1
        return self.current

    def info(self) -> dict[str, Any]:
        """What /info says of the threads."""
        if self.set_by is not None:
            return {"usable": self.usable, "why": self.why, "now": self.current,
                    "adaptive": False, "set_by": self.set_by}  # fmt: skip
        return {"usable": self.usable, "why": self.why, "now": self.current,
                "others_busy_cpus": round(self.others, 2), "adaptive": self._read is not None,
                "changes": self.changes}  # fmt: skip

    # ------------------------------------------------------------------ measuring
    def _sample(self) -> tuple[float, float, float] | None:
        assert self._read is not None
        busy = self._read()
        if busy is None:
            return None
        return time.monotonic(), busy, time.process_time()

    def _reader(self, stat: str | None, cgroup: str | None):
        """A function giving the busy CPU-seconds so far of what this process competes with,
        or None where that cannot be read."""
        if stat is None:
            return None
        if (
            self.cpus.source == "quota"
            and cgroup is not None
            and (Path(cgroup) / "cpu.stat").exists()
        ):
            usage = Path(cgroup) / "cpu.stat"

            def cgroup_busy() -> float | None:
                try:
                    for row in usage.read_text().splitlines():
                        key, _, value = row.partition(" ")
                        if key == "usage_usec":
                            return int(value) / 1e6
                except (OSError, ValueError):
                    return None
                return None

            return cgroup_busy if cgroup_busy() is not None else None
        try:
            cpus = {f"cpu{n}" for n in os.sched_getaffinity(0)}
        except AttributeError:  # pragma: no cover - not Linux
            return None
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        path = Path(stat)

        def cpus_busy() -> float | None:
            try:
                total = 0
                for row in path.read_text().splitlines():
                    name, _, rest = row.partition(" ")
                    if name in cpus:
                        # user nice system idle iowait irq softirq steal ...: all but idle, iowait
                        values = [int(v) for v in rest.split()]
                        total += sum(values[:8]) - values[3] - values[4]
                return total / tick
            except (OSError, ValueError, IndexError):
                return None

        return cpus_busy if cpus_busy() is not None else None
