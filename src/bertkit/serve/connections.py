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
  it is answered 503 and closed;
- bounded heads, as nginx bounds them: a request line over 8 KiB is a 414, a header line over
  8 KiB, a head (request line and headers) over 32 KiB or more than 100 headers a 431, and
  the connection closes; the heads still arriving on all connections together hold at most
  8 MiB (beyond it the connection that would pass it gets a 503 and closes). Before, the parser
  buffered a header line however long until the header deadline: a 16 MB line was answered,
  and 200 connections each holding 1 MB of an unfinished head kept 200 MB of the server's
  memory after they closed.

The body has its own deadline, in the app (it reads the body).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import resource
import sys

try:  # uvicorn[standard]'s parser; uvicorn's own otherwise
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base  # type: ignore[assignment]

log = logging.getLogger("bertkit.serve")

_REFUSED = (
    b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_STATUS = {414: b"414 URI Too Long", 431: b"431 Request Header Fields Too Large",
           503: b"503 Service Unavailable"}  # fmt: skip
MAX_LINE = 8 << 10  # a request line or a header line, in bytes (nginx's 8k buffer)
MAX_HEAD = 32 << 10  # the request line and every header together (nginx: 4 such buffers)
MAX_HEADERS = 100  # headers in one request (Apache's LimitRequestFields)
MAX_HEADS_HELD = 8 << 20  # bytes of unfinished heads held across every connection


class _HeadRefused(ValueError):
    """A head over a limit (raised from a parser callback: uvicorn then answers the parser's
    error, which `send_400_response` turns into this refusal)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_ticks = itertools.count()  # orders connections by their last activity (uvloop's clock is
# read once per loop turn, so connections accepted together would tie on it)
_SPARE_DESCRIPTORS = 64  # for the model's files, logs, the listening socket


class GuardedHTTP(_Base):
    header_timeout: float = 10.0
    max_connections: int = 1000
    open = 0  # connections of this process open now
    heads_held = 0  # bytes of unfinished heads received on this process's connections

    @classmethod
    def configure(cls, header_timeout: float, max_connections: int) -> None:
        """This process's limits (class-wide: uvicorn builds the protocol itself, in each
        worker process, where the settings arrive through the app factory)."""
        cls.header_timeout, cls.max_connections = header_timeout, max_connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._timer: asyncio.TimerHandle | None = None
        self._head = 0  # bytes of the head being received (counted in heads_held)
        self.last_active = next(_ticks)
        GuardedHTTP.open += 1
        super().connection_made(transport)
        if len(self.connections) > self.max_connections and not self._make_room():
            self._refuse(_HeadRefused(503, "every connection of this server has a request "
                                             "in flight"))  # fmt: skip
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        self.last_active = next(_ticks)
        cycle, reading_head = self.cycle, not self.busy
        super().data_received(data)
        if self.transport.is_closing():
            self._release()
        elif self.cycle is not cycle:  # a request's headers are in: its body has the app's deadline
            self._disarm()
            self._release()
        elif reading_head and not self.busy:  # still a head: what the parser holds of it grows
            if self._timer is None:  # the first bytes of a next request
                self._arm()
            self._head += len(data)
            GuardedHTTP.heads_held += len(data)
            if self._head > MAX_HEAD:
                self._refuse(_HeadRefused(431, f"a request head over {MAX_HEAD:,} bytes"))
            elif GuardedHTTP.heads_held > MAX_HEADS_HELD:
                self._refuse(_HeadRefused(503, f"{GuardedHTTP.heads_held:,} bytes of unfinished "
                                               "request heads are held; retry later"))  # fmt: skip

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > MAX_LINE:
            raise _HeadRefused(414, f"a request line over {MAX_LINE:,} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) > MAX_LINE:
            raise _HeadRefused(431, f"a header of {len(name) + len(value):,} bytes (its name and "
                                    f"value); the most is {MAX_LINE:,}")  # fmt: skip
        if len(self.headers) >= MAX_HEADERS:
            raise _HeadRefused(431, f"more than {MAX_HEADERS} headers")
        super().on_header(name, value)

    def send_400_response(self, msg: str) -> None:
        """The parser's error (uvicorn calls this in its `except`): a head over a limit,
        raised in a callback above, answered with its own status; anything else as uvicorn
        answers it."""
        refusal = getattr(sys.exc_info()[1], "__context__", None)
        if isinstance(refusal, _HeadRefused):
            self._refuse(refusal)
        else:
            super().send_400_response(msg)

    def _refuse(self, refusal: _HeadRefused) -> None:
        """Answer `refusal` (JSON, as the app's errors) and close."""
        kind = "overloaded" if refusal.status == 503 else "too_large"
        body = json.dumps({"error": str(refusal), "error_type": kind}).encode()
        self.transport.write(_REFUSED % (_STATUS[refusal.status], len(body), body))
        self.transport.close()
        self._release()

    def _release(self) -> None:
        GuardedHTTP.heads_held -= self._head
        self._head = 0

    def on_response_complete(self) -> None:
        self.last_active = next(_ticks)
        super().on_response_complete()  # uvicorn's keep-alive timeout takes over

    def connection_lost(self, exc: Exception | None) -> None:
        GuardedHTTP.open -= 1
        self._release()
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


TRIM_OTHERS_BUSY = 0.2  # CPUs other processes keep busy on this server's CPUs, at least
TRIM_IDLE = 2  # connections with no request in flight, more than


def trims_idle_connections(open_connections: int, in_flight: int, others_busy: float) -> bool:
    """Whether an answer goes out with `Connection: close`: while other processes keep a fifth
    of a CPU or more busy on this server's CPUs (a client on the same machine, working) and
    more than two of the open connections have no request in flight (`in_flight`: the
    requests being answered, this one no longer counted).

    Why (docs/results/serve#python-client): httpx's pool (httpcore 1.0, the openai client's
    transport) re-plans on every request and every answer by walking its connections once per
    idle connection. Against a server that answers faster than the client turns answers into
    new requests, most of its 64 connections sit idle (48-63 at nine in ten re-plans,
    `benchmarks/client_pool.py`), each request costs it 11 ms of CPU instead of 2, and the
    client, on the server's cores, is what limits the rate (95% of a core, a p99 of 2 s).
    Closing the connection an answer went out on keeps its pool to what it uses: it opens one
    when it needs one (a connect on loopback costs far less than the walks) and stays out of
    that state. Measured against narrower rules: half a CPU as the bar let the pool fall back
    between the estimate's windows (p99 812 against 362 ms); closing only while on average
    fewer than half (or 65%) of the connections had a request in flight spared clients that
    keep theirs busy but let the pool regrow (208-244 against 309-321 requests/s). The rule
    costs such clients beside a busy process their connection now and then: 64 asyncio
    clients beside a busy process, 325 against 338 requests/s. A machine with nothing else
    working never closes one; `--keep-idle-connections` never does."""
    return others_busy >= TRIM_OTHERS_BUSY and open_connections - in_flight > TRIM_IDLE


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
