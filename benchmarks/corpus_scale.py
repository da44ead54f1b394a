"""A corpus job beyond one process: its ANN index's recall against exact search, and the job on a
Ray cluster of two nodes against one process.

    BERTKIT_DATA=../shared/data python benchmarks/corpus_scale.py --passages 10000 \
        --queries 200 --ray-passages 2000 --out docs/results/corpus/scale.json

- `recall`: `bertkit embed` of the first N Wikipedia passages (embed_corpus.py's), then
  `bertkit index` (IVF-PQ, its defaults) and, for `--queries` held-out passages (the next ones
  after the corpus) as queries, the overlap of the index's top ten with exact search's
  (recall@10 against exact), and the seconds a query takes each way.
- `ray`: the same job on a Ray cluster of two nodes on loopback (`ray start --head` on
  127.0.0.2, a second `ray start --address` on 127.0.0.3, one CPU each: one actor of one thread per node), against one process
  of two threads (the usable cores), in alternating order; rows/s of each, and whether the
  shards are equal as (id, vector) pairs to a one-process run of one thread.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _args import arguments, minilm
from _harness import emit
from embed_corpus import passages
from machine import line as machine_line


def recall(model: str, scratch: Path, count: int, queries: int) -> dict:
    from bertkit.jobs.embed import embed
    from bertkit.jobs.shards import vectors
    from bertkit.retrieval.index import Searcher, build_index

    file = passages(count + queries, scratch)
    corpus, held_out = scratch / "corpus.jsonl", []
    with open(file, encoding="utf-8") as source, open(corpus, "w", encoding="utf-8") as target:
        for number, line in enumerate(source):
            if number < count:
                target.write(line)
            else:
                held_out.append(json.loads(line)["text"])
    out = scratch / "recall-vectors"
    started = time.perf_counter()
    manifest = embed(model, [corpus], out, resume=out.exists(), progress=False)
    embed_seconds = time.perf_counter() - started
    table = scratch / "recall.lance"
    shutil.rmtree(table, ignore_errors=True)
    started = time.perf_counter()
    build_index(out, table, ann="yes")
    index_seconds = time.perf_counter() - started
    searcher = Searcher(table, model)
    found = vectors(out)
    ids = np.array(found.column("id").to_pylist(), object)
    matrix = np.array(found.column("vector").to_pylist(), np.float32)
    asked = searcher.embed_queries(held_out)
    overlaps, ann_seconds, exact_seconds = [], [], []
    for text, vector in zip(held_out, asked, strict=True):
        started = time.perf_counter()
        hits = searcher(text, top=10)
        ann_seconds.append(time.perf_counter() - started)
        started = time.perf_counter()
        exact = set(ids[np.argsort(-(matrix @ vector), kind="stable")[:10]])
        exact_seconds.append(time.perf_counter() - started)
        overlaps.append(len(exact & {h["id"] for h in hits}) / 10)
    return {
        "rows": manifest["rows"],
        "queries": len(held_out),
        "recall@10_vs_exact": round(float(np.mean(overlaps)), 4),
        "queries_below_0.8": int(sum(o < 0.8 for o in overlaps)),
        "embed_rows_per_s": round(manifest["rows"] / embed_seconds, 1),
        "index_seconds": round(index_seconds, 1),
        "ann_query_ms_median": round(1000 * statistics.median(ann_seconds), 1),
        "numpy_exact_ms_median": round(1000 * statistics.median(exact_seconds), 2),
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def on_ray(model: str, scratch: Path, count: int, rounds: int) -> dict:
    from bertkit.jobs.embed import embed
    from bertkit.jobs.shards import vectors

    file = passages(count, scratch)
    ray = str(Path(sys.executable).parent / "ray")
    port = free_port()
    # each node on a loopback address of its own: Ray swaps 127.0.0.1 and localhost for this
    # machine's outward address, and would talk to itself through that
    address = f"127.0.0.2:{port}"
    common = ["--num-cpus", "1", "--disable-usage-stats"]
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a loopback cluster of this benchmark alone
    head = ["--head", "--port", str(port), "--include-dashboard", "false",
            "--node-ip-address", "127.0.0.2"]  # fmt: skip
    for node in (head, ["--address", address, "--node-ip-address", "127.0.0.3"]):
        subprocess.run([ray, "start", *node, *common], check=True, capture_output=True)
    seconds: dict[str, list[float]] = {"one process": [], "ray, two nodes": []}
    try:
        for _ in range(rounds):
            for side in seconds:
                out = scratch / ("ray-out" if side.startswith("ray") else "local-out")
                started = time.perf_counter()
                embed(model, [file], out, overwrite=True, progress=False, rows_per_shard=250,
                      ray=address if side.startswith("ray") else None,
                      threads=1 if side.startswith("ray") else None)  # fmt: skip
                seconds[side].append(time.perf_counter() - started)
                print(f"{side}: {count / seconds[side][-1]:.1f} rows/s", flush=True)
        embed(model, [file], scratch / "one-thread", overwrite=True, progress=False,
              rows_per_shard=250, threads=1)  # fmt: skip
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True)

    def pairs(folder):
        table = vectors(folder)
        return {(i, tuple(v)) for i, v in zip(table.column("id").to_pylist(),
                                              table.column("vector").to_pylist(), strict=True)}  # fmt: skip

    rates = {side: round(count / statistics.median(s), 1) for side, s in seconds.items()}
    return {
        "rows": count,
        "rows_per_s": rates,
        "ray_vs_one_process": round(rates["ray, two nodes"] / rates["one process"], 3),
        "ray_equals_one_process_of_one_thread": pairs(scratch / "ray-out")
        == pairs(scratch / "one-thread"),
    }  # fmt: skip


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--passages", type=int, default=10_000, help="the indexed corpus")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--ray-passages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--parts", default="recall,ray")
    parser.add_argument(
        "--scratch", type=Path, default=Path(tempfile.gettempdir()) / "embed_corpus"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    model = minilm()
    args.scratch.mkdir(parents=True, exist_ok=True)
    report: dict = {"machine": machine_line(), "usable_cores": len(os.sched_getaffinity(0))}
    print(report["machine"], flush=True)
    if "recall" in args.parts:
        report["recall"] = recall(model, args.scratch, args.passages, args.queries)
        print(json.dumps(report["recall"]), flush=True)
    if "ray" in args.parts:
        report["ray"] = on_ray(model, args.scratch, args.ray_passages, args.rounds)
    emit(report, args.out)


if __name__ == "__main__":
    main()
