"""Levers for a BERT from one CPU-hour (issue 28 §3): each a flag of `bertkit pretrain`, each a row
trained for the same CPU time as the laptop recipe and scored on the same held-out sets.

    BERTKIT_DATA=../shared/data python benchmarks/recipe_levers.py --out runs/levers \
        --rows recipe mask40 --budget 20m --threads 1 --parallel 2

Every row is `bertkit pretrain --recipe laptop --precision fp32 --seed S --budget B` plus its
flags (ROWS below), with `--threads` threads; `--parallel` rows run side by side (two one-thread
rows on the 2-core machine: equal CPU time, and whatever else runs slows both alike). Data as in
recipe_seeds.py: train on Wikipedia AA/wiki_00..94, tune on AB, report AA/wiki_95..99 (`final`,
no choice saw it); the corpus-vocabulary rows use a WordPiece vocabulary of that size trained
on the training files (`bertkit vocab --size N`) and shards prepared with it. Each finished model
is scored on both held-out sets by pre-training's own evaluation (20 batches of 32 × 128, 15% of
the pieces chosen and every chosen piece [MASK], whatever the row trained with). Rows resume
(a killed row continues, a finished one is kept). OUT/levers.json holds every row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from machine import line as machine_line
from recipe_seeds import SPLITS, held_out
from recipe_seeds import shards as bert_base_shards

from bertkit import BertTokenizer
from bertkit.pretraining.shards import prepare_shards

# name: (corpus vocabulary size or None for bert-base-uncased's, extra pretrain flags, what it tests)
ROWS: dict[str, tuple[int | None, list[str], str]] = {
    "recipe": (None, [], "the laptop recipe as it is"),
    "mask30": (None, ["--mask-prob", "0.3", "--max-predictions", "39"], "30% masked"),
    "mask40": (None, ["--mask-prob", "0.4", "--max-predictions", "52"], "40% masked"),
    "no_nsp": (None, ["--objective", "mlm"], "masked LM only (No NSP)"),
    "curriculum": (None, ["--phases", "64:0.5,128:0.5"], "half the time at length 64"),
    "vocab16k": (16384, [], "a 16,384-piece corpus vocabulary"),
    "vocab8k": (8192, [], "an 8,192-piece corpus vocabulary"),
    "pre_ln": (None, ["--layer-norm", "pre"], "pre-LN layers"),
    "glu": (None, ["--feed-forward", "glu"], "GEGLU feed-forward"),
}


def corpus_vocab_shards(data: Path, out: Path, size: int) -> dict[str, Path]:
    """A WordPiece vocabulary of `size` pieces trained on the training files, and the three
    splits prepared with it."""
    corpus = data / "corpus" / "wikipedia_2015"
    vocab = out / f"vocab{size}"
    train_files = [corpus / SPLITS["train"][0] / f"wiki_{n:02d}" for n in SPLITS["train"][1]]
    if not (vocab / "vocab.txt").exists():
        command = [sys.executable, "-m", "bertkit.cli", "vocab", *map(str, train_files)]
        subprocess.run([*command, "--size", str(size), "--out", str(vocab)], check=True)
    tokenizer = BertTokenizer.from_pretrained(vocab)
    paths = {}
    for name, (folder, numbers) in SPLITS.items():
        target = out / f"data{size}" / name
        if not (target / "meta.json").exists():
            files = [corpus / folder / f"wiki_{n:02d}" for n in numbers]
            prepare_shards(files, tokenizer, target, overwrite=True, progress=False)
        paths[name] = target
    return paths


def tokens_seen(run: Path) -> tuple[int, int]:
    """(tokens, steps) over every phase of a finished run."""
    tokens = steps = 0
    for log in sorted(run.glob("phase*/log.jsonl")) + [run / "log.jsonl"]:
        train = [
            e for e in map(json.loads, log.read_text().splitlines()) if e.get("split") == "train"
        ]
        tokens, steps = tokens + train[-1]["tokens"], steps + train[-1]["step"]
    return tokens, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", default=os.environ.get("BERTKIT_DATA"))
    parser.add_argument("--rows", nargs="+", choices=sorted(ROWS), default=list(ROWS))
    parser.add_argument("--budget", default="20m", help="training time of each row")
    parser.add_argument("--threads", type=int, default=1, help="threads of each row")
    parser.add_argument("--parallel", type=int, default=2, help="rows side by side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-batches", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=500)
    args = parser.parse_args()
    if not args.data:
        raise SystemExit("give --data or set BERTKIT_DATA (../shared/data)")
    data = Path(args.data)
    datasets: dict[int | None, dict[str, Path]] = {}
    for name in args.rows:
        size = ROWS[name][0]
        if size not in datasets:
            datasets[size] = (
                bert_base_shards(data, args.out.parent / "recipe_seeds")
                if size is None
                else corpus_vocab_shards(data, args.out, size)
            )
    env = {**os.environ, **{k: str(args.threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
    results_file = args.out / "levers.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {"rows": {}}
    results["machine"] = machine_line()
    pending = list(args.rows)
    while pending:
        group, pending = pending[: args.parallel], pending[args.parallel :]
        started = time.time()
        processes = []
        for name in group:
            size, flags, _ = ROWS[name]
            paths = datasets[size]
            command = [
                sys.executable, "-m", "bertkit.cli", "pretrain", "--recipe", "laptop",
                "--budget", args.budget, "--precision", "fp32", "--seed", str(args.seed),
                "--data", str(paths["train"]), "--eval-data", str(paths["tuning"]),
                "--eval-batches", str(args.eval_batches), "--eval-every", str(args.eval_every),
                "--out", str(args.out / name), "--resume", *flags,
            ]  # fmt: skip
            log = open(args.out / f"{name}.out", "a")
            processes.append(
                (name, subprocess.Popen(command, env=env, stdout=log, stderr=log), log)
            )
        for name, process, log in processes:
            if process.wait() != 0:
                raise SystemExit(f"row {name} failed: see {args.out / (name + '.out')}")
            log.close()
        print(f"rows {', '.join(group)}: {time.time() - started:.0f} s", flush=True)
        for name in group:
            size, flags, what = ROWS[name]
            run = args.out / name
            tokens, steps = tokens_seen(run)
            results["rows"][name] = {
                "what": what, "flags": flags, "vocab_size": size or 30522, "budget": args.budget,
                "threads": args.threads, "parallel": len(group), "seed": args.seed,
                "tokens": tokens, "steps": steps,
                **{split: held_out(run, datasets[size][split], args.eval_batches)
                   for split in ("tuning", "final")},
            }  # fmt: skip
            print(json.dumps({name: results["rows"][name]}), flush=True)
            args.out.mkdir(parents=True, exist_ok=True)
            results_file.write_text(json.dumps(results, indent=1) + "\n")
    for name, row in results["rows"].items():
        print(
            f"{name:12s} {row['tokens'] / 1e6:6.2f}M tokens  tuning {100 * row['tuning']['mlm_accuracy']:.2f}%"
            f"  final {100 * row['final']['mlm_accuracy']:.2f}%"
        )


if __name__ == "__main__":
    main()
