"""`bertkit serve` under load: MiniLM fine-tuned on SST-2, behind bertkit's server
(torch fp32, torch bf16 autocast, ONNX fp32, ONNX int8) and behind the server a user writes
(one transformers `pipeline(...)` call per request in a FastAPI endpoint, as a `def` and as an
`async def`), each driven by 1, 8 and 64 concurrent clients sending one short SST-2 sentence
per request.

    BERTKIT_DATA=../shared/data python benchmarks/serve_load.py [--seconds 8] [--rounds 3]
    BERTKIT_DATA=../shared/data python benchmarks/serve_load.py --soak 100000

Every server runs in its own process with the same torch thread count on the same port range;
the load generator (a minimal keep-alive HTTP/1.1 client on asyncio) runs in this process, so
it shares the CPU with the server as a co-located client would. Servers are measured one at a
time, alternating round by round; each figure is the median over rounds. Printed per server and
concurrency: requests/s, p50/p95/p99 latency, mean batch size (bertkit's /metrics), and the
ratio of requests/s to the faster naive server at the same concurrency. At 1 client, p50 is
also set against a bare forward pass (bertkit's model on one tokenised sentence, in-process) and
a `Predictor` call. `--soak N`: N requests at 64 clients to the torch server, RSS before/after.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
from _args import DATA, arguments, minilm
from machine import line as machine_line

NAIVE = """
import torch
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import pipeline

torch.set_num_threads({threads})
pipe = pipeline("text-classification", model={model!r}, device=-1)
app = FastAPI()


class Request(BaseModel):
    inputs: str


@app.post("/predict")
{kind} predict(request: Request):
    return pipe(request.inputs)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    def __init__(self, name: str, command: list[str], port: int, env=None) -> None:
        self.name, self.port = name, port
        self.thread_changes = 0  # bertkit's, as /info last said
        self.log = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                        env=env)  # fmt: skip

    def wait_ready(self, path: str = "/predict", body: dict | None = None) -> None:
        import httpx

        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"{self.name} exited:\n{self.log.read()}")
            try:
                response = httpx.post(f"http://127.0.0.1:{self.port}{path}",
                                      json=body or {"inputs": "warm up"}, timeout=30)  # fmt: skip
                if response.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"{self.name} did not start")

    def rss_mb(self) -> float:
        for row in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if row.startswith("VmRSS:"):
                return int(row.split()[1]) / 1024
        return float("nan")

    def metrics(self, path: str = "/predict") -> dict[str, float]:
        import httpx

        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        found = {}
        for name in (
            "bertkit_batch_size_sum",
            "bertkit_batch_size_count",
            "bertkit_batch_wait_seconds_sum",
            "bertkit_batch_wait_seconds_count",
        ):
            match = re.search(rf'^{name}{{endpoint="{path}"}} (\S+)$', text, re.MULTILINE)
            found[name] = float(match.group(1)) if match else 0.0
        return found

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


# --------------------------------------------------------------------------- load generator
async def _client(port: int, bodies: list[bytes], until: float, latencies: list[float],
                  errors: list[int], offset: int, limit: list[int] | None = None,
                  path: str = "/predict") -> None:  # fmt: skip
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    n = offset
    try:
        while time.perf_counter() < until:
            if limit is not None:
                if limit[0] <= 0:
                    break
                limit[0] -= 1
            body = bodies[n % len(bodies)]
            n += 1
            request = (
                b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n" % (path.encode(), len(body))
            ) + body
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            if not head.startswith(b"HTTP/1.1 200"):
                errors.append(int(head[9:12]))
            if re.search(rb"(?i)\r\nconnection: *close", head):  # the server closes it
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
    finally:
        writer.close()


def load(port: int, clients: int, seconds: float, bodies: list[bytes],
         requests: int | None = None, path: str = "/predict") -> dict[str, float]:  # fmt: skip
    latencies: list[float] = []
    errors: list[int] = []

    async def run() -> float:
        started = time.perf_counter()
        until = started + (seconds if requests is None else 1e9)
        limit = None if requests is None else [requests]
        await asyncio.gather(*(
            _client(port, bodies, until, latencies, errors, i * 97, limit, path)
            for i in range(clients)
        ))  # fmt: skip
        return time.perf_counter() - started

    gc.collect()  # this process's imports (torch, numpy) out of the collector's sight: a
    gc.freeze()  # full collection would pause every client at once and count as latency
    cpu = time.process_time()
    try:
        import uvloop

        elapsed = uvloop.run(run())
    except ImportError:
        elapsed = asyncio.run(run())
    cpu = time.process_time() - cpu
    ms = np.array(latencies) * 1000
    return {
        "requests": len(latencies),
        "rps": len(latencies) / elapsed,
        "client_cpu": cpu / elapsed,  # the load generator's share of one core
        "p50": float(np.percentile(ms, 50)),
        "p95": float(np.percentile(ms, 95)),
        "p99": float(np.percentile(ms, 99)),
        "errors": len(errors),
    }


# --------------------------------------------------------------------------- set-up
def fine_tuned(work: Path, data: Path, train_rows: int) -> Path:
    """MiniLM fine-tuned on the first `train_rows` of SST-2 (one epoch), made once."""
    out = work / f"sst2-minilm-{train_rows}"
    if (out / "bertkit_task.json").exists():
        return out

    from bertkit.finetuning.train import FinetuneConfig, finetune

    config = FinetuneConfig(epochs=1, batch_size=32, learning_rate=5e-5, max_seq_length=64,
                            max_train_examples=train_rows, progress=False)  # fmt: skip
    results = finetune("sst2", minilm(), data / "glue" / "SST-2",
                       out, config)  # fmt: skip
    print(f"fine-tuned {out}: dev {results['dev']}", flush=True)
    return out


def sentences(data: Path, count: int = 512) -> list[str]:
    rows = (data / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:]
    texts = [r.split("\t")[0].strip() for r in rows]
    return [t for t in texts if 4 <= len(t.split()) <= 16][:count]  # short texts


def bare_forward(model: Path, texts: list[str], repeats: int = 300) -> dict[str, float]:
    """p50 of bertkit's model on one tokenised sentence, and of a Predictor call (tokenise,
    forward, answer), in this process."""
    import torch

    from bertkit import Predictor

    predictor = Predictor(model, precision="fp32")  # as bertkit-torch (the bare forward: fp32)
    net = predictor.model
    encoded = [predictor.tokenizer(t, return_tensors="pt") for t in texts[:repeats]]
    forward, whole = [], []
    with torch.inference_mode():
        for _ in range(2):  # warm
            net(**encoded[0])
            predictor([texts[0]])
        for i, batch in enumerate(encoded):
            started = time.perf_counter()
            net(**batch)
            forward.append(time.perf_counter() - started)
            started = time.perf_counter()
            predictor([texts[i]])
            whole.append(time.perf_counter() - started)
    return {"forward": statistics.median(forward) * 1000,
            "predictor": statistics.median(whole) * 1000}  # fmt: skip


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--work", default=os.path.expanduser("~/.cache/bertkit-bench/serve"))
    parser.add_argument("--train-rows", type=int, default=4000)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--servers", nargs="+",
                        default=["bertkit-torch", "bertkit-bf16", "bertkit-onnx", "bertkit-int8",
                                 "naive-def", "naive-async"])  # fmt: skip
    parser.add_argument("--serve-args", default="", help="extra flags for bertkit serve")
    parser.add_argument("--soak", type=int, help="this many requests at 64 clients (torch)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--from-json", help="print the report of a run --json wrote, and stop")
    args = parser.parse_args()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        figures = {n: {int(c): runs for c, runs in by.items()} for n, by in saved["runs"].items()}
        args.rounds, args.seconds, args.json = saved["rounds"], saved["seconds"], None
        args.clients = sorted({c for by in figures.values() for c in by})
        print(saved["command"])
        report(figures, saved["bare_ms"], args, saved["machine"])
        return
    import torch

    torch.set_num_threads(args.threads)  # the bare forward pass's, and what machine_line says
    data = DATA
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = fine_tuned(work, data, args.train_rows)
    texts = sentences(data)
    bodies = [json.dumps({"inputs": t}).encode() for t in texts]
    print(machine_line(), flush=True)
    print(f"{len(texts)} SST-2 dev sentences of 4-16 words, one per request", flush=True)

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    servers: dict[str, Server] = {}
    if args.soak:
        args.servers = ["bertkit-torch"]
    for name in args.servers:
        port = free_port()
        if name.startswith("bertkit"):
            command = [sys.executable, "-m", "bertkit.cli", "serve", str(model), "--port",
                       str(port), "--threads", str(args.threads), *args.serve_args.split()]  # fmt: skip
            command += {
                "bertkit-torch": ["--precision", "fp32"],  # the naive servers' numerics
                "bertkit-bf16": ["--precision", "bf16"],  # auto's choice on AMX/AVX512-BF16
                "bertkit-onnx": ["--backend", "onnx"],
                "bertkit-int8": ["--backend", "onnx", "--quantize", "int8"],
            }[name]
        else:
            app = work / f"{name.replace('-', '_')}.py"
            kind = "def" if name == "naive-def" else "async def"
            app.write_text(textwrap.dedent(NAIVE).format(threads=args.threads, model=str(model),
                                                         kind=kind))  # fmt: skip
            command = [sys.executable, "-m", "uvicorn", f"{app.stem}:app", "--app-dir",
                       str(work), "--port", str(port), "--log-level", "warning", "--no-access-log"]  # fmt: skip
        servers[name] = Server(name, command, port, env)
    try:
        for server in servers.values():
            server.wait_ready("/predict")
        if args.soak:
            soak(servers["bertkit-torch"], bodies, args.soak)
            return
        bare = bare_forward(model, texts)
        print(f"bare forward pass p50 {bare['forward']:.2f} ms; Predictor call p50 "
              f"{bare['predictor']:.2f} ms (in-process, 1 sentence)", flush=True)  # fmt: skip
        for server in servers.values():  # warm every server at every concurrency
            for clients in args.clients:
                load(server.port, clients, 1.0, bodies)
        figures: dict[str, dict[int, list[dict]]] = {n: {c: [] for c in args.clients}
                                                     for n in servers}  # fmt: skip
        for round_ in range(args.rounds):
            for clients in args.clients:
                for name, server in servers.items():
                    before = server.metrics() if name.startswith("bertkit") else None
                    result = load(server.port, clients, args.seconds, bodies)
                    result["batch"] = batch_size(server, "/predict", before)
                    figures[name][clients].append(result)
                    print(f"round {round_ + 1} {name:12s} {clients:3d} clients: "
                          f"{result['rps']:7.1f} req/s p50 {result['p50']:6.1f} p99 "
                          f"{result['p99']:7.1f} ms batch {result['batch']:5.1f} errors "
                          f"{result['errors']}", flush=True)  # fmt: skip
        report(figures, bare, args, machine_line())
    finally:
        for server in servers.values():
            server.stop()


def batch_size(server: Server, path: str, before: dict[str, float] | None) -> float:
    """bertkit's mean inputs per model call on `path` since `before` (its /metrics then); 1 for
    a server without batching (before None)."""
    if before is None:
        return 1.0
    after = server.metrics(path)
    batches = after["bertkit_batch_size_count"] - before["bertkit_batch_size_count"]
    inputs = after["bertkit_batch_size_sum"] - before["bertkit_batch_size_sum"]
    return inputs / batches if batches else float("nan")


def batch_wait(server: Server, path: str, before: dict[str, float]) -> float:
    """bertkit's mean seconds a batch's oldest request waited in the queue on `path` since
    `before` (its /metrics then)."""
    after = server.metrics(path)
    batches = after["bertkit_batch_wait_seconds_count"] - before["bertkit_batch_wait_seconds_count"]
    waited = after["bertkit_batch_wait_seconds_sum"] - before["bertkit_batch_wait_seconds_sum"]
    return waited / batches if batches else float("nan")


def report(figures, bare, args, machine: str) -> None:
    med = {
        name: {c: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
               for c, runs in by_clients.items()}
        for name, by_clients in figures.items()
    }  # fmt: skip
    naive = [n for n in med if n.startswith("naive")]
    print(f"\nmedians over {args.rounds} rounds of {args.seconds:g} s ({machine}); x naive: "
          "the median over rounds of req/s / the faster naive server's")  # fmt: skip
    print(f"{'server':14s} {'clients':>7s} {'req/s':>8s} {'p50 ms':>8s} {'p95 ms':>8s} "
          f"{'p99 ms':>8s} {'batch':>6s} {'x naive':>8s}")  # fmt: skip
    for name, by_clients in med.items():
        for clients, m in by_clients.items():
            # per round, against the faster naive server of that round (measured seconds
            # apart), then the median: the machine's speed swings between rounds
            ratios = [
                run["rps"] / max(figures[n][clients][r]["rps"] for n in naive)
                for r, run in enumerate(figures[name][clients])
            ] if naive else [float("nan")]  # fmt: skip
            print(f"{name:14s} {clients:7d} {m['rps']:8.1f} {m['p50']:8.2f} {m['p95']:8.2f} "
                  f"{m['p99']:8.2f} {m['batch']:6.1f} {statistics.median(ratios):8.2f}")  # fmt: skip
    if bare is not None and 1 in args.clients and "bertkit-torch" in med:
        p50 = med["bertkit-torch"][1]["p50"]
        print(f"1 client, bertkit torch p50 {p50:.2f} ms = {p50 / bare['forward']:.2f}x a bare "
              f"forward pass ({bare['forward']:.2f} ms), {p50 / bare['predictor']:.2f}x a "
              f"Predictor call ({bare['predictor']:.2f} ms)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine, "bare_ms": bare,
            "seconds": args.seconds, "rounds": args.rounds, "medians": med, "runs": figures,
            "command": " ".join(sys.argv),
        }, indent=1))  # fmt: skip


def soak(server: Server, bodies: list[bytes], requests: int, every: int = 10_000) -> None:
    """`requests` at 64 clients, the server's RSS after the warm-up and every `every`."""
    load(server.port, 64, 2.0, bodies)  # warm: pools, allocator, caches
    before = server.rss_mb()
    print(f"server RSS after warm-up: {before:.0f} MB", flush=True)
    started, done, errors = time.perf_counter(), 0, 0
    while done < requests:
        result = load(server.port, 64, 0, bodies, requests=min(every, requests - done))
        done += result["requests"]
        errors += result["errors"]
        print(f"{done:>9,} requests: RSS {server.rss_mb():.0f} MB ({result['rps']:.0f} req/s)",
              flush=True)  # fmt: skip
    after = server.rss_mb()
    print(f"{done:,} requests at 64 clients in {time.perf_counter() - started:.0f} s, {errors} "
          f"errors: server RSS {before:.0f} MB before, {after:.0f} MB after "
          f"({after - before:+.0f} MB)")  # fmt: skip


if __name__ == "__main__":
    main()
