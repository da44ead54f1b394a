"""A million short rows from a CSV through bertkit's reader and tokenizer: seconds and memory.

    BERTKIT_DATA=../shared/data python benchmarks/own_data_read.py --rows 1000000

The CSV (written once under --out, never into the repository) holds SST-2's training
sentences cycled to --rows rows with their labels as words, written by Python's csv module.
Two ways through it, each in its own process so that each peak RSS is its own:

- stream: `TextClassificationTask.stream` (the reader, row by row) and `featurize` in chunks of
  --chunk rows, each chunk's features dropped after it is counted: what `bertkit predict
  --input` does. The RSS is sampled every 100k rows; flat memory means the last sample is no
  higher than the first by more than a chunk's worth.
- finetune: `read` + `fitted` + `featurize` of the whole file, all features kept: what
  `bertkit finetune` holds for training (memory grows with the file: the peak over the RSS before the first row is
  printed, and per row).

Goal: the stream under 60 s on 2 cores with flat memory. The machine (CPU model, its
vector extensions, threads) is printed beside the figures.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from _args import arguments, minilm
from machine import line


def rss_mb() -> float:
    """This process's resident set now, in MB (Linux /proc)."""
    for text in Path("/proc/self/status").read_text().splitlines():
        if text.startswith("VmRSS:"):
            return int(text.split()[1]) / 1024
    return float("nan")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_csv(root: Path, path: Path, rows: int) -> None:
    if path.exists() and sum(1 for _ in open(path, "rb")) == rows + 1:
        return
    lines = (root / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    names = {"0": "negative", "1": "positive"}
    pairs = [row.rsplit("\t", 1) for row in lines]
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sentence", "label"])
        for sentence, label in itertools.islice(itertools.cycle(pairs), rows):
            writer.writerow([sentence.strip(), names[label]])
    temporary.replace(path)


def measure(mode: str, path: Path, model: str, chunk: int) -> dict:
    from bertkit.core.tokenizer import BertTokenizer
    from bertkit.tasks import get_task
    from bertkit.tasks.own import DataConfig

    tokenizer = BertTokenizer.from_pretrained(model)
    data = DataConfig(train=str(path), text_column="sentence", label_column="label")
    task = get_task("text-classification", data)
    baseline = rss_mb()  # torch, the tokenizer: what any run holds before the first row
    started, samples, rows, pieces = time.perf_counter(), [], 0, 0
    if mode == "stream":
        examples = task.stream(None, "train")
        first = list(itertools.islice(examples, chunk))
        task = task.fitted(first)  # the label set, from the first chunk
        batch = first
        while batch:
            features = task.featurize(batch, tokenizer, 128)
            pieces += sum(len(f["input_ids"]) for f in features)
            before = rows
            rows += len(batch)
            if rows // 100_000 > before // 100_000:
                samples.append([rows, round(time.perf_counter() - started, 1), round(rss_mb())])
            batch = list(itertools.islice(examples, chunk))
    else:
        examples = task.read(None, "train")
        task = task.fitted(examples)
        features = task.featurize(examples, tokenizer, 128)
        rows, pieces = len(examples), sum(len(f["input_ids"]) for f in features)
        samples.append([rows, round(time.perf_counter() - started, 1), round(rss_mb())])
    return {"mode": mode, "rows": rows, "pieces": pieces,
            "seconds": round(time.perf_counter() - started, 1), "rss_mb": samples,
            "baseline_rss_mb": round(baseline), "peak_rss_mb": round(peak_mb())}  # fmt: skip


def main() -> None:
    parser = arguments(__doc__, data=True, model=True, out="runs/own_data_read")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=20_000)
    parser.add_argument("--modes", nargs="+", default=["stream", "finetune"])
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # one mode, in a child process
    args = parser.parse_args()
    model = args.model
    if model is None:
        model = minilm()
    path = args.out / f"rows_{args.rows}.csv"
    if args.measure:
        print(json.dumps(measure(args.measure, path, model, args.chunk)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(Path(args.data), path, args.rows)
    print(f"{line()}; {path} ({path.stat().st_size / 1e6:.0f} MB)")
    results = []
    for mode in args.modes:
        child = subprocess.run(
            [sys.executable, __file__, "--measure", mode, "--rows", str(args.rows), "--chunk",
             str(args.chunk), "--model", model, "--out", str(args.out)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        result = json.loads(child.stdout.splitlines()[-1])
        results.append(result)
        grown = result["peak_rss_mb"] - result["baseline_rss_mb"]
        print(f"{mode}: {result['rows']:,} rows, {result['pieces']:,} pieces in "
              f"{result['seconds']} s ({result['rows'] / result['seconds']:,.0f} rows/s), "
              f"peak RSS {result['peak_rss_mb']} MB, {grown} MB over the "
              f"{result['baseline_rss_mb']} MB before the first row "
              f"({grown * 1e6 / result['rows']:.0f} bytes a row); "
              f"RSS [rows, s, MB]: {result['rss_mb']}")  # fmt: skip
    (args.out / "results.json").write_text(
        json.dumps({"machine": line(), "results": results}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
