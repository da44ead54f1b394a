"""Dynamic batching: the inputs of concurrent requests gathered into one model call.

A request's inputs join a queue; a loop per endpoint takes the queued requests, whole, up to
`max_batch_size` inputs (a larger request runs alone), and hands them to the model in one call
on the inference thread, so the event loop keeps reading requests meanwhile. When the model is
free and fewer than `max_batch_size` inputs wait, the loop waits until the oldest has waited
`max_wait_ms` (0: never waits; the requests that arrive while a batch runs make the next one).
Every request gets its own results, in order; an input that breaks a batch does not take the
others with it (the requests of a failed batch run again one by one, so only the faulty one
fails). A request cancelled while it waits (its client went away) leaves the queue uncomputed;
one cancelled while its batch runs has its results dropped.

>>> import asyncio
>>> from concurrent.futures import ThreadPoolExecutor
>>> calls = []
>>> def double(items):
...     calls.append(len(items))
...     return [2 * x for x in items]
>>> async def main():
...     batcher = DynamicBatcher(double, ThreadPoolExecutor(1), max_batch_size=8, max_wait_ms=50)
...     batcher.start()
...     answers = await asyncio.gather(*(batcher.submit([n]) for n in range(5)))
...     await batcher.stop()
...     return answers
>>> asyncio.run(main()), calls
([[0], [2], [4], [6], [8]], [5])
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from bertkit.serve.config import ServeConfig
from bertkit.settings import replaced

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """More inputs wait than `max_queue` allows; `retry_after`: seconds to wait (an estimate)."""

    def __init__(self, waiting: int, limit: int, retry_after: int) -> None:
        super().__init__(f"{waiting} inputs are waiting (the queue holds {limit}); retry later")
        self.retry_after = retry_after


class Stopped(Exception):
    """The batcher stopped (the server is shutting down) before the request ran."""


@dataclass(eq=False)  # a request is itself (the queue removes it by identity)
class _Request:
    items: Sequence[Any]
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)


@dataclass
class BatchStats:
    """What `on_batch` is told after each model call."""

    requests: int
    inputs: int
    seconds: float
    waited: float  # the oldest request's time in the queue before the batch started


class DynamicBatcher:
    def __init__(
        self,
        run: Callable[[list[Any]], list[Any]],
        executor: Executor,
        config: ServeConfig | None = None,
        *,
        on_batch: Callable[[BatchStats], None] | None = None,
        **settings: Any,
    ) -> None:
        """`run`: inputs -> one result per input, called on `executor` (one thread: model calls
        never overlap; several batchers may share it); batched as `config` (or ServeConfig's
        fields by name: `max_batch_size`, `max_wait_ms`, `max_queue`) says."""
        config = replaced(config or ServeConfig(), **settings)  # (checks each value)
        self.run, self.executor = run, executor
        self.max_batch_size, self.max_wait = config.max_batch_size, config.max_wait_ms / 1000
        self.max_queue, self.on_batch = config.max_queue, on_batch
        self.queue: deque[_Request] = deque()
        self.waiting = 0  # inputs in the queue
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._flush = False  # shutting down: run what waits without waiting for more
        self._batch_seconds = 0.05  # a running estimate, for Retry-After
        self.cancelled = 0  # inputs taken out of the queue because their request was cancelled

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def submit(self, items: Sequence[Any]) -> list[Any]:
        """The results of `items`, run in some batch. Raises QueueFull (nothing queued),
        Stopped, or what `run` raised on these items alone."""
        if self._task is None or self._task.done() or self._wake is None:
            raise Stopped("the server is not running")
        if self.waiting and self.waiting + len(items) > self.max_queue:
            batches = -(-(self.waiting + len(items)) // self.max_batch_size)
            raise QueueFull(
                self.waiting, self.max_queue, max(1, round(batches * self._batch_seconds))
            )
        request = _Request(items, asyncio.get_running_loop().create_future())
        self.queue.append(request)
        self.waiting += len(items)
        self._wake.set()
        try:
            return await request.future
        except asyncio.CancelledError:  # the client went away: if still queued, never computed
            if request in self.queue:
                self.queue.remove(request)
                self.waiting -= len(items)
                self.cancelled += len(items)
            raise

    async def stop(self) -> None:
        """Run what is queued (without waiting for more), then stop."""
        self._flush = True
        if self._task is None or self._wake is None:
            return
        self._wake.set()
        while self.queue:
            await asyncio.sleep(0.01)
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    def flush(self) -> None:
        """From now on run what waits at once (shutting down: nothing more will come)."""
        self._flush = True
        if self._wake is not None:
            self._wake.set()

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            if not self.queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            deadline = self.queue[0].arrived + self.max_wait
            while self.waiting < self.max_batch_size and not self._flush:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), left)
                except asyncio.TimeoutError:
                    break
            if not self.queue:  # what waited was cancelled
                continue
            batch = [self.queue.popleft()]
            size = len(batch[0].items)
            while self.queue and size + len(self.queue[0].items) <= self.max_batch_size:
                size += len(self.queue[0].items)
                batch.append(self.queue.popleft())
            self.waiting -= size
            await self._run(batch, size)

    async def _run(self, batch: list[_Request], size: int) -> None:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        items = [item for request in batch for item in request.items]
        try:
            results = await loop.run_in_executor(self.executor, self.run, items)
            if len(results) != len(items):
                raise RuntimeError(f"{len(results)} results for {len(items)} inputs")
        except Exception as error:
            if len(batch) == 1:
                _settle(batch[0].future, error=error)
            else:  # find the request at fault: each runs alone; the others get their results
                for request in batch:
                    await self._run([request], len(request.items))
                return
        else:
            first = 0
            for request in batch:
                _settle(request.future, results[first : first + len(request.items)])
                first += len(request.items)
        seconds = time.perf_counter() - started
        self._batch_seconds = 0.8 * self._batch_seconds + 0.2 * seconds
        if self.on_batch is not None:
            self.on_batch(BatchStats(len(batch), size, seconds, started - batch[0].arrived))


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # the client went away and its handler was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
