"""Pre-training batches made ahead of the steps, in worker processes.

Making a batch is host work: cutting the instances out of the shards, masking them, padding
them. It takes 17 to 29 ms for 256 x 128 on one core of a Xeon (`data_ms`,
docs/results/gpu). Made between steps, that time is idle time for a GPU; on an H200 the loop
ran BERT-base at 390k tokens/s against its step's 521k. Here `workers` processes make the
batches while the steps run, with at most `depth` batches ready each.

The batches are those the stream makes by itself, in the same order. Worker w makes batches
w, w + n, w + 2n, ... of the stream (n workers) and skips the others (`PretrainingData.skip`
moves the position without building instances). The position after each batch comes back with
it, so `state_dict()` is the position after the last batch handed out, as without workers, and
a resumed run continues with the same batches. The workers are forked, as torch's DataLoader
forks its own: they use numpy alone, never CUDA, and they send numpy arrays back.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import traceback
from typing import Any

import numpy as np
import torch

from bertkit._device import usable_cpus
from bertkit.pretraining.dataset import PretrainingData


def default_workers(device: torch.device, local_processes: int | None = None) -> int:
    """`--data-workers` when not given. With CUDA: up to 4 a process, within half the host's
    cores shared by the node's processes (`local_processes`, default torchrun's
    LOCAL_WORLD_SIZE). On CPUs: none, since the step already uses every core."""
    if device.type != "cuda":
        return 0
    if local_processes is None:
        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cores = usable_cpus().count
    return max(1, min(4, cores // (2 * max(1, local_processes))))


def _work(data: PretrainingData, state: dict, first: int, every: int, out) -> None:
    """A worker: from `state`, batches first, first + every, ... of the stream, each sent with
    the position after it (what the stream's state_dict() says then).

    A forked worker inherits the training process's signal handlers and open files, the run
    folder's lock among them: it takes the default SIGTERM (`close()` ends it), leaves Ctrl-C
    to the training process, and ends itself once that process is gone (killed, say), so no
    orphan keeps the lock from a resumed run."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    _die_with_parent()
    try:
        torch.set_num_threads(1)
        data.load_state_dict(state)
        for _ in range(first):
            data.skip()
        while True:
            batch = data.next_batch()
            item = ("batch", data.state_dict(), {k: v.numpy() for k, v in batch.items()})
            while True:
                try:
                    out.put(item, timeout=1)
                    break
                except queue.Full:
                    if os.getppid() != parent:
                        os._exit(0)
            for _ in range(every - 1):
                data.skip()
    except Exception as err:  # the main process raises it, with this traceback
        out.put(("error", f"{type(err).__name__}: {err}", traceback.format_exc()))


def _die_with_parent() -> None:
    """On Linux, have the kernel kill this process when the training process dies
    (PR_SET_PDEATHSIG); elsewhere the worker notices within a second (see `_work`)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class PrefetchedData:
    """`data`'s batches, made ahead by `workers` processes (see the module's doc). The same
    interface as `PretrainingData`: next_batch, state_dict, load_state_dict; and `close()`.
    With `pin`, batches come in page-locked memory, so a non-blocking copy to a GPU overlaps."""

    def __init__(self, data: PretrainingData, workers: int, depth: int = 2, pin: bool = False):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.data, self.workers, self.depth, self.pin = data, workers, depth, pin
        self._state = data.state_dict()
        self._processes: list[Any] = []
        self._queues: list[Any] = []
        self._turn = 0

    def _start(self) -> None:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        for first in range(self.workers):
            out = context.Queue(maxsize=self.depth)
            process = context.Process(  # type: ignore[attr-defined]
                target=_work,
                args=(self.data, self._state, first, self.workers, out),
                name=f"bertkit-data-{first}",
                daemon=True,  # gone with the main process, however it ends
            )
            process.start()
            self._processes.append(process)
            self._queues.append(out)
        self._turn = 0

    def next_batch(self) -> dict[str, torch.Tensor]:
        if not self._processes:
            self._start()
        worker = self._turn
        self._turn = (self._turn + 1) % self.workers
        while True:
            try:
                kind, state, payload = self._queues[worker].get(timeout=5)
                break
            except queue.Empty:
                process = self._processes[worker]
                if not process.is_alive():
                    code = process.exitcode
                    self.close()
                    raise RuntimeError(
                        f"data worker {worker} ended (exit code {code}) before sending its "
                        "batch: killed, perhaps for memory; --data-workers 0 makes the batches "
                        "in the training process"
                    ) from None
        if kind == "error":
            self.close()
            raise RuntimeError(f"data worker {worker} failed: {state}\n(in the worker:\n{payload})")
        self._state = state
        batch = {name: torch.from_numpy(np.asarray(array)) for name, array in payload.items()}
        if self.pin:
            batch = {name: tensor.pin_memory() for name, tensor in batch.items()}
        return batch

    def state_dict(self) -> dict[str, int]:
        return dict(self._state)

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from `state`: the workers start again from there at the next batch."""
        self.close()
        self.data.load_state_dict(state)
        self._state = self.data.state_dict()

    def close(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.terminate()
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
        for out in self._queues:
            out.close()
            out.cancel_join_thread()
        self._processes, self._queues = [], []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the daemons go with the process anyway
            pass
