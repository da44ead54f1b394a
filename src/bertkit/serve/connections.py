"""Connections a server survives: a deadline for each request's headers, and a cap on open
connections that makes room by closing the longest-idle one.

uvicorn closes a keep-alive connection 5 s after its last answer, but waits forever for the
first request of a new connection and for headers sent a byte at a time, so 1,000 clients that
connect and say nothing hold 1,000 sockets (and, past the process's descriptor limit, lock
everyone else out). `GuardedHTTP` is uvicorn's HTTP protocol (`uvicorn.Config(http=...)`),
limited with `GuardedHTTP.configure(header_timeout, max_connections)` in each server process:

- a deadline: a new connection's first request, and every later request once its first byte
  has come, must have its headers in within `header_timeout` seconds, or the connection closes;
- a cap: the connection that would be `max_connections + 1` closes the longest-idle connection
  (one with no request in flight) to make room; when every connection has a request in flight
  it is answered 503 and closed.

The body has its own deadline, in the app (it reads the body).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import resource

try:  # uvicorn[standard]'s parser; uvicorn's own otherwise
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base  # type: ignore[assignment]

log = logging.getLogger("bertkit.serve")

_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_ticks = itertools.count()  # orders connections by their last activity (uvloop's clock is
# read once per loop turn, so connections accepted together would tie on it)
_SPARE_DESCRIPTORS = 64  # for the model's files, logs, the listening socket


class GuardedHTTP(_Base):
    header_timeout: float = 10.0
    max_connections: int = 1000
    open = 0  # connections of this process open now

    @classmethod
    def configure(cls, header_timeout: float, max_connections: int) -> None:
        """This process's limits (class-wide: uvicorn builds the protocol itself, in each
        worker process, where the settings arrive through the app factory)."""
        cls.header_timeout, cls.max_connections = header_timeout, max_connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._timer: asyncio.TimerHandle | None = None
        self.last_active = next(_ticks)
        GuardedHTTP.open += 1
        super().connection_made(transport)
        if len(self.connections) > self.max_connections and not self._make_room():
            body = (b'{"error": "every connection of this server has a request in flight",'
                    b' "error_type": "overloaded"}')  # fmt: skip
            transport.write(_REFUSED % (len(body), body))
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        self.last_active = next(_ticks)
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # a request's headers are in: its body has the app's deadline
            self._disarm()
        elif self._timer is None and not self.busy:  # the first bytes of a next request
            self._arm()

    def on_response_complete(self) -> None:
        self.last_active = next(_ticks)
        super().on_response_complete()  # uvicorn's keep-alive timeout takes over

    def connection_lost(self, exc: Exception | None) -> None:
        GuardedHTTP.open -= 1
        self._disarm()
        super().connection_lost(exc)

    @property
    def busy(self) -> bool:
        """A request's headers are in and its answer is not yet sent."""
        return self.cycle is not None and not self.cycle.response_complete

    def _make_room(self) -> bool:
        idle = [c for c in self.connections if isinstance(c, GuardedHTTP) and c is not self
                and not c.busy and not c.transport.is_closing()]  # fmt: skip
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.last_active)
        oldest._disarm()
        oldest.transport.close()
        return True

    def _arm(self) -> None:
        self._disarm()
        self._timer = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if not self.busy and not self.transport.is_closing():
            self.transport.close()


def descriptors_for(connections: int) -> int:
    """Raise this process's open-file limit towards what `connections` sockets need (up to the
    hard limit); the most connections it then allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + _SPARE_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return connections
    return max(1, min(connections, soft - _SPARE_DESCRIPTORS))
