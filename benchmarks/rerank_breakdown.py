"""Where a /rerank request's time goes, without the HTTP server: sentence-transformers'
`CrossEncoder.predict` on one request (a question and 8 paragraphs, fp32, its default), bertkit's
`ServedModel.run("rerank", ...)` on the pairs of four requests (what `serve` gathers into one
model call at its default `--max-batch-size 32`; bertkit's default precision), and the floor of
bertkit's part: only its linear layers (the Q, K, V, attention-output and two feed-forward
products of every layer), in bf16, on as many rows as the requests have real tokens, in batches
of 32 pairs. All in one process, alternated round by round, medians; per request.

    BERTKIT_DATA=../shared/data python benchmarks/rerank_breakdown.py [--rounds 8]
        [--batch-sizes 32 16 8]

The same requests and cross-encoder as benchmarks/serve_embeddings.py (made there once, in
--work). `--batch-sizes`: bertkit's inputs per forward inside the gathered call (the Predictor's
`batch_size`; serve passes its --max-batch-size): smaller batches of length-sorted pairs pad the
attention grid less. `--grid-attention`: bertkit once more with attention on the padded grid
(SDPA's flash kernel), as before attention went sequence by sequence on the rows in CPU
inference (`BertModel.attention_by_sequence`).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch
from _args import arguments
from machine import line as machine_line
from serve_embeddings import rerank_bodies, reranker

GATHERED = 4  # requests of 8 pairs in one model call: serve's default --max-batch-size 32


def main() -> None:
    parser = arguments(__doc__, data=True)
    parser.add_argument("--work", default=os.path.expanduser("~/.cache/bertkit-bench/serve"))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--grid-attention", action="store_true", help="bertkit on the grid too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from sentence_transformers import CrossEncoder

    from bertkit.serve.engine import ServedModel
    from bertkit.serve.routes import Pair

    data = Path(args.data)
    model = reranker(Path(args.work), data)
    bodies = [json.loads(b) for b in rerank_bodies(data)][:64]
    served = ServedModel(model)
    assert served.predictor is not None
    cross = CrossEncoder(str(model), device="cpu", max_length=256)
    print(machine_line(), flush=True)

    def pairs(first: int, count: int) -> list[tuple[str, str]]:
        chosen = [bodies[(first + k) % len(bodies)] for k in range(count)]
        return [(b["query"], t) for b in chosen for t in b["texts"]]

    def sentence_transformers(r: int) -> None:
        for k in range(GATHERED):
            cross.predict(pairs(r * GATHERED + k, 1), apply_softmax=True)

    encoder = served.predictor.model.bert

    def bertkit(r: int) -> None:
        served.run("rerank", [Pair(q, t) for q, t in pairs(r * GATHERED, GATHERED)])

    def bertkit_grid(r: int) -> None:
        encoder.attention_by_sequence = False
        try:
            bertkit(r)
        finally:
            encoder.attention_by_sequence = True

    # the floor: the linear layers alone on each 32-pair batch's real tokens
    config = served.predictor.model.config
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    shapes = [(hidden, hidden)] * 4 + [(hidden, inner), (inner, hidden)]
    weights = [(torch.randn(o, i).bfloat16(), torch.randn(o).bfloat16()) for i, o in shapes]
    tokens = []
    for r in range(len(bodies) // GATHERED):
        group = pairs(r * GATHERED, GATHERED)
        encoded = served.tokenizer([a for a, _ in group], [b for _, b in group], truncation=True,
                                   max_length=served.max_seq_length)  # fmt: skip
        tokens.append(sum(len(ids) for ids in encoded["input_ids"]))
    rows = round(statistics.mean(tokens))
    inputs = {n: torch.randn(rows, n).bfloat16() for n in (hidden, inner)}

    def linear_floor(r: int) -> None:
        for _ in range(layers):
            for (w, b), (i, _o) in zip(weights, shapes, strict=True):
                torch.nn.functional.linear(inputs[i], w, b)

    sides = {"sentence-transformers": sentence_transformers, "linear floor": linear_floor}
    batch_size = {}  # a bertkit side's inputs per forward
    for size in args.batch_sizes:
        sides[f"bertkit, batches of {size}"] = bertkit
        batch_size[f"bertkit, batches of {size}"] = size
        if args.grid_attention:
            sides[f"bertkit, batches of {size}, grid"] = bertkit_grid
            batch_size[f"bertkit, batches of {size}, grid"] = size
    print(f"{len(bodies)} requests (a SQuAD question, 8 paragraphs); {GATHERED} per bertkit call; "
          f"{rows / GATHERED / 8:.0f} real tokens a pair", flush=True)  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(args.rounds + 1):  # round 0 warms every side up, uncounted
        for name in names if r % 2 else names[::-1]:
            if name in batch_size:
                served.predictor.batch_size = batch_size[name]
            started = time.perf_counter()
            sides[name](r)
            if r:
                times[name].append((time.perf_counter() - started) / GATHERED * 1e3)
        if r:
            print(f"round {r}: " + ", ".join(f"{n} {t[-1]:.1f}" for n, t in times.items()),
                  flush=True)  # fmt: skip
    medians = {name: statistics.median(t) for name, t in times.items()}
    reference = medians["sentence-transformers"]
    print(f"\nms per request, medians of {args.rounds} rounds ({machine_line()})")
    for name, value in medians.items():
        print(f"{name:32s} {value:8.1f} ms   sentence-transformers / this: {reference / value:.2f}")


if __name__ == "__main__":
    main()
