"""What the Python client costs itself: one `httpx.AsyncClient` (the openai client's
transport) against a server with no model, by concurrent connections and by how long the
server takes to answer, and where the client's time goes.

    BERTKIT_DATA=../shared/data python benchmarks/client_cost.py [--seconds 5] [--profile]

The server is serve_vs_infinity.py's model-less `ceiling` route (a fixed vector, one per input),
optionally sleeping `--delays` seconds before it answers; the client runs in this process, as in
serve_vs_infinity.py's `httpx` load. Printed per case: requests/s, the client's CPU share of one
core and its CPU milliseconds per request. `--profile`: cProfile of the 64-connection client,
its top functions by own time.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

from _args import DATA, arguments
from machine import line as machine_line
from serve_load import Server, free_port
from serve_vs_infinity import CEILING, bodies, httpx_load


def ceiling(delay: float) -> Server:
    code = CEILING.replace("import numpy", "import asyncio\nimport numpy").replace(
        '    texts = (await request.json())["input"]',
        f'    texts = (await request.json())["input"]\n    await asyncio.sleep({delay})',
    )
    app = Path(tempfile.mkdtemp()) / "ceiling_app.py"
    app.write_text(code)
    port = free_port()
    server = Server(f"ceiling+{delay}", [sys.executable, "-m", "uvicorn", "ceiling_app:app",
                                         "--app-dir", str(app.parent), "--port", str(port),
                                         "--log-level", "warning", "--no-access-log"], port)  # fmt: skip
    server.wait_ready("/v1/embeddings", {"input": ["warm up"], "model": "m"})
    return server


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 0.2])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    sent = bodies(DATA, 1)
    print(machine_line(), flush=True)
    for delay in args.delays:
        server = ceiling(delay)
        try:
            for clients in args.connections:
                result = httpx_load(server.port, clients, args.seconds, sent, "/v1/embeddings")
                cost = result["client_cpu"] / result["rps"] * 1000
                print(f"server waits {delay:4.2f} s, {clients:3d} connections: "
                      f"{result['rps']:7.1f} req/s, client CPU {result['client_cpu']:4.0%}, "
                      f"{cost:6.2f} ms a request", flush=True)  # fmt: skip
            if args.profile and delay == args.delays[0]:
                profile = cProfile.Profile()
                started = time.perf_counter()
                profile.enable()
                result = httpx_load(server.port, max(args.connections), args.seconds, sent,
                                    "/v1/embeddings")  # fmt: skip
                profile.disable()
                out = io.StringIO()
                stats = pstats.Stats(profile, stream=out).sort_stats("tottime")
                stats.print_stats(8)
                print(
                    f"profiled, {max(args.connections)} connections, "
                    f"{time.perf_counter() - started:.1f} s:\n{out.getvalue()}",
                    flush=True,
                )
                calls = {f"{Path(k[0]).name}:{k[2]}": v[1] for k, v in stats.stats.items()}  # type: ignore[attr-defined]
                print(json.dumps({k: v for k, v in calls.items() if "is_idle" in k}), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
