"""What oneDNN's primitive cache capacity does to a served model (docs/results/serve): run once
per capacity, alternating, since the variable is read when oneDNN first runs.

    for r in 1 2 3; do for cap in 8 64 1024; do
      ONEDNN_PRIMITIVE_CACHE_CAPACITY=$cap python benchmarks/onednn_cache.py rerank bf16
    done; done
    for cap in 8 1024; do for p in bf16 fp32; do
      ONEDNN_PRIMITIVE_CACHE_CAPACITY=$cap python benchmarks/onednn_cache.py embeddings $p
    done; done

`embeddings`: 1,500 batches of 1-32 random SST-2 sentences through all-MiniLM-L6-v2's
`/v1/embeddings` (ServedModel, in-process): seconds, and the RSS after 100 batches and at the
end. `rerank`: 512 SQuAD (question, paragraph) pairs through the cross-encoder that
benchmarks/serve_embeddings.py makes (run it first), ms a pair. 2 torch threads.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import torch
from _args import DATA, minilm
from serve_embeddings import embedding_bodies, rerank_bodies

RERANKER = Path.home() / ".cache/bertkit-bench/serve/mrpc-minilm-256"


def rss_mb() -> float:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024


def main() -> None:
    what, precision = sys.argv[1], sys.argv[2]
    cap = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024 (default)")
    torch.set_num_threads(2)
    if what == "rerank":
        from bertkit import Predictor

        predictor = Predictor(str(RERANKER), batch_size=32, precision=precision)
        bodies = [json.loads(b) for b in rerank_bodies(DATA)[:64]]
        pairs = [(b["query"], t) for b in bodies for t in b["texts"]]
        predictor.relevance(pairs[:64])
        started = time.perf_counter()
        predictor.relevance(pairs)
        ms = (time.perf_counter() - started) / len(pairs) * 1e3
        print(f"cache {cap} {precision}: {len(pairs)} pairs, {ms:.2f} ms a pair")
        return

    from bertkit.serve.engine import ServedModel

    model = ServedModel(minilm(), precision=precision)
    texts = [json.loads(b)["input"] for b in embedding_bodies(DATA)]
    rng = random.Random(0)
    model.warm()
    started, after_100 = time.perf_counter(), 0.0
    for i in range(1500):
        batch = rng.sample(texts, rng.randint(1, 32))
        model.run("v1/embeddings", model.parse("v1/embeddings", {"input": batch}))
        if i == 100:
            after_100 = rss_mb()
    print(f"cache {cap} {precision}: RSS after 100 batches {after_100:.0f} MB, after 1500 "
          f"{rss_mb():.0f} MB; {time.perf_counter() - started:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
