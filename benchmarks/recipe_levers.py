"""Levers for a BERT from one CPU-hour: each a flag of `bertkit pretrain`, each a row
trained for the same CPU time as the laptop recipe and scored on the same held-out sets.

    BERTKIT_DATA=../shared/data python benchmarks/recipe_levers.py --out runs/levers \
        --rows recipe mask40 --budget 20m --threads 1 --parallel 2

Every row is `bertkit pretrain --recipe laptop --objective mlm+nsp --precision fp32 --seed S
--budget B` plus its flags (the recipe as these rows measured it, with NSP; a row's own
--objective wins) (ROWS below), with `--threads` threads; `--parallel` rows run side by side (two one-thread
rows on the 2-core machine: equal CPU time, and whatever else runs slows both alike). Data as in
recipe_seeds.py: train on Wikipedia AA/wiki_00..94, tune on AB, report AA/wiki_95..99 (`final`,
no choice saw it); the corpus-vocabulary rows use a WordPiece vocabulary of that size trained
on the training files (`bertkit vocab --size N`) and shards prepared with it. Each finished model
is scored on both held-out sets by pre-training's own evaluation (20 batches of 32 × 128, 15% of
the pieces chosen and every chosen piece [MASK], whatever the row trained with), and beside it
the count table of ngram_baseline.py built from as many training tokens as the row saw, in the
row's vocabulary, on the final set (the reference a model of its neighbours should pass). Rows
resume (a killed row continues, a finished one is kept). OUT/levers.json holds every row;
OUT/levers.png draws held-out accuracy against CPU-minutes; `--report` redraws both from the
finished rows without training.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _args import arguments
from machine import line as machine_line
from ngram_baseline import neighbour_accuracy, tokens_of
from recipe_seeds import SPLITS, held_out
from recipe_seeds import shards as split_shards

from bertkit.pretraining.shards import Shards
from bertkit.pretraining.train import parse_budget
from bertkit.viz import read_log

# name: (corpus vocabulary size or None for bert-base-uncased's, extra pretrain flags, what it tests)
ROWS: dict[str, tuple[int | None, list[str], str]] = {
    "recipe": (None, [], "the laptop recipe as it is"),
    "mask40": (None, ["--mask-prob", "0.4", "--max-predictions", "52"], "40% masked"),
    "no_nsp": (None, ["--objective", "mlm"], "masked LM only (No NSP)"),
    "curriculum": (None, ["--phases", "64:0.5,128:0.5"], "half the time at length 64"),
    "vocab16k": (16384, [], "a 16,384-piece corpus vocabulary"),
    "vocab8k": (8192, [], "an 8,192-piece corpus vocabulary"),
    "pre_ln": (None, ["--layer-norm", "pre"], "pre-LN layers"),
    "glu": (None, ["--feed-forward", "glu"], "GEGLU feed-forward"),
    "combined": (
        None,
        ["--objective", "mlm", "--layer-norm", "pre", "--feed-forward", "glu"],
        "No NSP + pre-LN + GEGLU (the rows that won at 20 CPU-minutes)",
    ),
    "pre_ln_glu": (
        None,
        ["--layer-norm", "pre", "--feed-forward", "glu"],
        "pre-LN + GEGLU with NSP (the architecture levers on the recipe's objective)",
    ),
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
    return split_shards(data, out, vocab=vocab, folder=f"data{size}")


def tokens_seen(run: Path) -> tuple[int, int]:
    """(tokens, steps) over every phase of a finished run."""
    tokens = steps = 0
    for log in sorted(run.glob("phase*/log.jsonl")) + [run / "log.jsonl"]:
        train = [
            e for e in map(json.loads, log.read_text().splitlines()) if e.get("split") == "train"
        ]
        tokens, steps = tokens + train[-1]["tokens"], steps + train[-1]["step"]
    return tokens, steps


def curve(run: Path, threads: int) -> list[tuple[float, float]]:
    """(CPU-minutes, held-out MLM accuracy) at each evaluation, over every phase of a run."""
    points, offset = [], 0.0
    for log in sorted(run.glob("phase*/log.jsonl")) + [run / "log.jsonl"]:
        entries = read_log(log)
        points += [
            ((offset + e["seconds"]) * threads / 60, e["mlm_accuracy"])
            for e in entries
            if e.get("split") == "eval" and "seconds" in e
        ]
        offset += max((e.get("seconds", 0.0) for e in entries), default=0.0)
    return points


def plot(out: Path, rows: dict[str, dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.2))
    colours = plt.get_cmap("tab10")
    for number, (name, row) in enumerate(rows.items()):
        points = curve(out / name, row["threads"])
        style = {"color": colours(number % 10), "linewidth": 2.4 if name == "recipe" else 1.4}
        vocab = "" if row["vocab_size"] == 30522 else f" ({row['vocab_size']:,} pieces)"
        # a row that masks more is evaluated during training at its own rate: dashed, and only
        # its end point (scored at 15% like every row) is on the common measure
        own_rate = "--mask-prob" in row["flags"]
        text = "mlm" in row["flags"]  # a No NSP run evaluates itself on contiguous text
        note = " (curve at its own masking rate)" if own_rate else ""
        note += " (curve on contiguous text)" if text else ""
        note += f" (pre-training seed {row['seed']})" if row.get("seed") else ""
        ax.plot(*zip(*[(m, 100 * a) for m, a in points], strict=True), marker="o", ms=3,
                linestyle="--" if own_rate or text else "-", label=f"{name}{vocab}: {row['what']}{note}",
                **style)  # fmt: skip
        end = _seconds(row["budget"]) * row["threads"] / 60
        ax.plot([end], [100 * row["tuning"]["mlm_accuracy"]], marker="*", ms=12, **style)
    ax.set(
        xlabel="CPU-minutes of training (threads × wall-clock)",
        ylabel="held-out MLM accuracy, %\n(AB, every chosen piece [MASK])",
        title="Levers at equal CPU time: BERT-tiny, the laptop recipe and its changes\n"
        "(stars: each finished model scored alike, 15% of the pieces chosen)",
    )
    ax.grid(alpha=0.3)
    # below the axes: inside, it hid the curves that pass under it
    # (no tight_layout: it shrinks the axes to make room for a legend outside them)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.savefig(out / "levers.png", dpi=100, bbox_inches="tight")
    plt.close(fig)


def table(rows: dict[str, dict]) -> str:
    lines = [
        "| row | flags | pieces | tokens | tokens/s per thread | MLM, AB pairs (tuning) | "
        "MLM, final pairs | MLM, final text | count table, same tokens (final) | NSP (final) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        seconds = _seconds(r["budget"])
        nsp = r["final"].get("nsp_accuracy") if "mlm" not in r["flags"] else None
        text = r.get("final_text", {}).get("mlm_accuracy")
        lines.append(
            f"| {name} | `{' '.join(r['flags'])}` | {r['vocab_size']:,} | {r['tokens'] / 1e6:.2f}M "
            f"| {r['tokens'] / seconds / r['threads']:,.0f} | {100 * r['tuning']['mlm_accuracy']:.2f}% "
            f"| **{100 * r['final']['mlm_accuracy']:.2f}%** "
            f"| {'-' if text is None else f'{100 * text:.2f}%'} | {100 * r['count_table']:.2f}% "
            f"| {'-' if nsp is None else f'{100 * nsp:.1f}%'} |"
        )
    return "\n".join(lines)


def _seconds(budget: str) -> float:
    return parse_budget(budget)


def splits_for(data: Path, out: Path, size: int | None) -> dict[str, Path]:
    """The train/tuning/final shards of a vocabulary: bert-base-uncased's (None) or a corpus
    vocabulary of `size` pieces (made on first use)."""
    if size is None:
        return split_shards(data, out.parent / "recipe_seeds")
    return corpus_vocab_shards(data, out, size)


def scores(run: Path, paths: dict[str, Path], batches: int) -> dict[str, dict]:
    """Held-out MLM of a finished row: on pairs (tuning and final: the measure every recipe run
    logs) and on contiguous text (final_text: what a No NSP row trains on, and a BERT row can
    read too)."""
    return {
        "tuning": held_out(run, paths["tuning"], batches),
        "final": held_out(run, paths["final"], batches),
        "final_text": held_out(run, paths["final"], batches, instances="text"),
    }


def count_table(paths: dict[str, Path], vocab_size: int, tokens: int) -> float:
    every, final = tokens_of(Shards(paths["train"])), tokens_of(Shards(paths["final"]))
    return neighbour_accuracy(every, final, vocab_size, tokens)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", default=os.environ.get("BERTKIT_DATA"))
    parser.add_argument("--rows", nargs="+", choices=sorted(ROWS), default=list(ROWS))
    parser.add_argument("--budget", default="20m", help="training time of each row")
    parser.add_argument("--threads", type=int, default=1, help="threads of each row")
    parser.add_argument("--parallel", type=int, default=2, help="rows side by side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-batches", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--report", action="store_true", help="table and picture only")
    parser.add_argument("--rescore", action="store_true", help="with --report: score rows again")
    args = parser.parse_args()
    results_file = args.out / "levers.json"
    if not args.data:
        raise SystemExit("give --data or set BERTKIT_DATA (../shared/data)")
    data = Path(args.data)
    if args.report:
        results = json.loads(results_file.read_text())
        for name, row in results["rows"].items():
            size = None if row["vocab_size"] == 30522 else row["vocab_size"]
            paths = splits_for(data, args.out, size)
            if "count_table" not in row:  # rows scored before the count table was
                row["count_table"] = count_table(paths, row["vocab_size"], row["tokens"])
            if "final_text" not in row or args.rescore:
                row.update(scores(args.out / name, paths, args.eval_batches))
        results_file.write_text(json.dumps(results, indent=1) + "\n")
        plot(args.out, results["rows"])
        print(table(results["rows"]))
        return
    datasets: dict[int | None, dict[str, Path]] = {}
    for name in args.rows:
        size = ROWS[name][0]
        if size not in datasets:
            datasets[size] = splits_for(data, args.out, size)
    env = {**os.environ, **{k: str(args.threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
    results = json.loads(results_file.read_text()) if results_file.exists() else {"rows": {}}
    results["machine"] = machine_line()
    args.out.mkdir(parents=True, exist_ok=True)
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
                "--out", str(args.out / name), "--resume", "--objective", "mlm+nsp", *flags,
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
            paths = datasets[size]
            results["rows"][name] = {
                "what": what, "flags": flags, "vocab_size": size or 30522, "budget": args.budget,
                "threads": args.threads, "parallel": len(group), "seed": args.seed,
                "tokens": tokens, "steps": steps,
                "count_table": count_table(paths, size or 30522, tokens),
                **scores(run, paths, args.eval_batches),
            }  # fmt: skip
            print(json.dumps({name: results["rows"][name]}), flush=True)
            results_file.write_text(json.dumps(results, indent=1) + "\n")
    plot(args.out, results["rows"])
    print(table(results["rows"]))


if __name__ == "__main__":
    main()
