"""Data preparation, raw text to training-ready batches, on the Wikipedia corpus.

    BERTKIT_DATA=../shared/data python benchmarks/prepare_throughput.py [--corpus DIR] [--workers 1 2]

For each worker count, `bertkit prepare` runs as its own process; its wall time gives MB of text
per second, and the peak RSS is the largest sum over the whole process tree (main + workers),
sampled from /proc every 50 ms. Then the batch stream is timed from the shards: building an
epoch's NSP plan, and drawing masked batches of 32 x 128 (instances per second).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _args import DATA, arguments
from machine import line as machine_line


def tree_rss_mb(pid: int) -> float:
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as children:
                    stack.extend(int(c) for c in children.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total / 1024


def main() -> None:
    parser = arguments(__doc__)
    data = DATA
    parser.add_argument("--corpus", default=str(data / "corpus" / "wikipedia_2015" / "AA"))
    parser.add_argument("--vocab", default=str(data / "vocab" / "bert-base-uncased"))
    parser.add_argument("--out", default="runs/prepare_bench")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    corpus_mb = sum(f.stat().st_size for f in Path(args.corpus).rglob("*") if f.is_file()) / 1e6
    results = {"corpus": args.corpus, "corpus_mb": round(corpus_mb, 1), "prepare": []}
    for workers in args.workers:
        out = Path(args.out) / f"shards-{workers}"
        command = [
            sys.executable,
            "-m",
            "bertkit.cli",
            "prepare",
            args.corpus,
            "--vocab",
            args.vocab,
            "--out",
            str(out),
            "--workers",
            str(workers),
            "--overwrite",
        ]
        start = time.perf_counter()
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        peak = 0.0
        while process.poll() is None:
            peak = max(peak, tree_rss_mb(process.pid))
            time.sleep(0.05)
        seconds = time.perf_counter() - start
        if process.returncode:
            raise SystemExit(f"prepare failed: {process.stdout.read()}")
        meta = json.loads((out / "meta.json").read_text())
        row = {
            "workers": workers,
            "seconds": round(seconds, 1),
            "mb_per_s": round(corpus_mb / seconds, 2),
            "peak_rss_mb": round(peak),
            "tokens": meta["num_tokens"],
            "documents": meta["num_documents"],
        }
        results["prepare"].append(row)
        print(json.dumps(row), flush=True)

    from bertkit import BertTokenizer
    from bertkit.pretraining.dataset import PretrainingData
    from bertkit.pretraining.shards import Shards

    shards_dir = Path(args.out) / f"shards-{args.workers[-1]}"
    data_stream = PretrainingData(
        Shards(shards_dir), BertTokenizer.from_pretrained(shards_dir), batch_size=32
    )
    start = time.perf_counter()
    plan = data_stream.plan(0)
    plan_seconds = time.perf_counter() - start
    start = time.perf_counter()
    batches = 300
    for _ in range(batches):
        data_stream.next_batch()
    batch_seconds = time.perf_counter() - start
    results["plan"] = {
        "instances": len(plan),
        "seconds": round(plan_seconds, 2),
        "instances_per_s": round(len(plan) / plan_seconds),
    }
    results["batches"] = {
        "instances_per_s": round(batches * 32 / batch_seconds),
        "ms_per_batch_of_32": round(1000 * batch_seconds / batches, 2),
    }
    results["machine"] = machine_line()
    print(json.dumps({k: results[k] for k in ("plan", "batches", "machine")}))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
