"""Dynamic batching: the inputs of concurrent requests gathered into one model call.

A request's inputs join a queue in parts of at most `max_batch_size`; a loop per endpoint takes
the queued parts, up to `max_batch_size` inputs, and hands them to the model in one call on the
inference thread, so the event loop keeps reading requests meanwhile. Requests of one part
queue in the order they came; the parts of larger ones in fair-queueing order (self-clocked,
by inputs), so large requests share the model part for part rather than queue behind each
other. When both wait, batches take from the two in turn: a one-sentence request that comes
while forty requests of 200 inputs wait runs within two batches, not after their first parts,
and the large ones get every other batch however many small ones come (none starves). When the model is
free and fewer than `max_batch_size` inputs wait, the loop waits until the oldest part has
waited `max_wait_ms` (0: never waits; what arrives while a batch runs makes the next one).
Every request gets its own results, in order, once all its parts have run; an input that
breaks a batch does not take the others with it (the parts of a failed batch run again one by
one, so only the faulty request fails, its parts not yet run dropped). A request cancelled
(its client went away) leaves the queue at once, with every part of it not yet run: the model
computes at most the part already in flight for a client that has gone.

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
import heapq
import itertools
import logging
import time
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


@dataclass(eq=False)  # a request is itself
class _Request:
    items: Sequence[Any]
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)
    results: list[Any] = field(default_factory=list)
    parts_left: int = 0  # parts not yet run
    queued: int = 0  # inputs of its parts still in the queue
    done: bool = False  # answered, failed or cancelled: its queued parts are skipped


@dataclass(eq=False)
class _Part:
    request: _Request
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


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
        # Two queues, heaps of (key, request number, part). `small`: requests of one part (at
        # most max_batch_size inputs), in the order they came. `large`: the parts of larger
        # requests in self-clocked fair queueing by inputs (a part's tag: the clock when its
        # request came plus its inputs up to the part's end; the clock: the tag of the large
        # part last taken), so large requests share the model part for part. When both wait,
        # batches take from them in turn, each first every other batch: a small request waits
        # at most two batches however many large ones came before it, and large requests get at
        # least every other batch however many small ones come.
        self.small: list[tuple[int, int, _Part]] = []
        self.large: list[tuple[int, int, _Part]] = []
        self._clock = 0
        self._small_first = True
        self._numbered = itertools.count()
        self.waiting = 0  # inputs in the queue (of requests not done)
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
        if not items:
            return []
        request = _Request(items, asyncio.get_running_loop().create_future())
        number, step = next(self._numbered), self.max_batch_size
        request.results = [None] * len(items)
        if len(items) <= step:
            heapq.heappush(self.small, (number, number, _Part(request, 0, len(items))))
            request.parts_left = 1
        else:
            for first in range(0, len(items), step):
                part = _Part(request, first, min(first + step, len(items)))
                heapq.heappush(self.large, (self._clock + part.stop, number, part))
                request.parts_left += 1
        request.queued = len(items)
        self.waiting += len(items)
        self._wake.set()
        try:
            return await request.future
        except asyncio.CancelledError:  # the client went away: what is queued is never computed
            self.cancelled += request.queued
            self._drop(request)
            raise

    def _drop(self, request: _Request) -> None:
        """`request` is done: its parts still queued are skipped (and no longer waiting)."""
        request.done = True
        self.waiting -= request.queued
        request.queued = 0

    @staticmethod
    def _first(queue: list[tuple[int, int, _Part]]) -> _Part | None:
        """`queue`'s next part (parts of requests that are done thrown away), or None."""
        while queue and queue[0][2].request.done:
            heapq.heappop(queue)
        return queue[0][2] if queue else None

    def _head(self) -> _Part | None:
        """The part that has waited longest among the next of each queue, or None."""
        heads = [p for p in (self._first(self.small), self._first(self.large)) if p is not None]
        return min(heads, key=lambda p: p.request.arrived) if heads else None

    def _take(self) -> list[_Part]:
        """The next batch's parts: up to max_batch_size inputs, the two queues in turn."""
        order = [self.small, self.large] if self._small_first else [self.large, self.small]
        if self._first(self.small) is not None and self._first(self.large) is not None:
            self._small_first = not self._small_first
        batch: list[_Part] = []
        size = 0
        for queue in order:
            while (
                part := self._first(queue)
            ) is not None and size + part.size <= self.max_batch_size:
                key = heapq.heappop(queue)[0]
                if queue is self.large:
                    self._clock = key
                part.request.queued -= part.size
                size += part.size
                batch.append(part)
        return batch

    async def stop(self) -> None:
        """Run what is queued (without waiting for more), then stop."""
        self._flush = True
        if self._task is None or self._wake is None:
            return
        self._wake.set()
        while self._head() is not None:
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
            head = self._head()
            if head is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            deadline = head.request.arrived + self.max_wait
            while self.waiting < self.max_batch_size and not self._flush:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), left)
                except asyncio.TimeoutError:
                    break
            batch = self._take()
            size = sum(part.size for part in batch)
            if not batch:  # what waited was cancelled
                continue
            self.waiting -= size
            await self._run(batch, size)

    async def _run(self, batch: list[_Part], size: int) -> None:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        items = [item for part in batch for item in part.request.items[part.start : part.stop]]
        try:
            results = await loop.run_in_executor(self.executor, self.run, items)
            if len(results) != len(items):
                raise RuntimeError(f"{len(results)} results for {len(items)} inputs")
        except Exception as error:
            if len(batch) == 1:  # this request's fault: it fails, its other parts dropped
                request = batch[0].request
                if not request.done:
                    self._drop(request)
                    _settle(request.future, error=error)
            else:  # find the part at fault: each runs alone; the others get their results
                for part in batch:
                    if not part.request.done:
                        await self._run([part], part.size)
                return
        else:
            first = 0
            for part in batch:
                request = part.request
                request.results[part.start : part.stop] = results[first : first + part.size]
                first += part.size
                request.parts_left -= 1
                if request.parts_left == 0 and not request.done:
                    request.done = True
                    _settle(request.future, request.results)
        seconds = time.perf_counter() - started
        self._batch_seconds = 0.8 * self._batch_seconds + 0.2 * seconds
        if self.on_batch is not None:
            requests = {id(part.request): part.request.arrived for part in batch}
            self.on_batch(BatchStats(len(requests), size, seconds,
                                     started - min(requests.values())))  # fmt: skip


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # the client went away and its handler was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
