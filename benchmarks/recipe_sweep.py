"""The laptop-recipe sweep: which pre-training settings reach the best held-out masked LM per
CPU-minute on this machine.

    BERTKIT_DATA=../shared/data python benchmarks/recipe_sweep.py --minutes 10 --out runs/recipe
    python benchmarks/recipe_sweep.py --out runs/recipe --rows base sinusoidal --minutes 10

Every row is a `bertkit pretrain --budget` run on wikipedia_2015/AA prepared with the
bert-base-uncased vocabulary (held out: AB), the same data and seed for all rows. Rows run two at
a time, one thread each (two one-thread runs side by side do the same work per second as one
two-thread run here: 7.2k + 7.2k vs 13.5k tokens/s for BERT-tiny), so `--minutes` of budget is
`--minutes` CPU-minutes per row. A killed sweep resumes (`--resume` on every row); finished rows
are read, not re-run.

Ranked by the held-out MLM accuracy with *every* chosen piece replaced by [MASK] (nothing to
copy), also reported: its loss and perplexity, the 80/10/10 accuracy, NSP accuracy, tokens seen.
Writes OUT/sweep.json, OUT/sweep.png (accuracy against training minutes) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# Each row: its flags on top of the shared ones. Dropout, warm-up and masking defaults are the
# paper's unless the row says otherwise; `base` is the best setting known before this sweep.
ROWS: dict[str, list[str]] = {
    "base": ["--config", "tiny", "--batch-size", "64", "--lr", "1e-3", "--dropout", "0"],
    "dropout0.1": ["--config", "tiny", "--batch-size", "64", "--lr", "1e-3", "--dropout", "0.1"],
    "sinusoidal": [
        *["--config", "tiny", "--batch-size", "64", "--lr", "1e-3", "--dropout", "0"],
        *["--position-init", "sinusoidal"],
    ],
    "mini": ["--config", "mini", "--batch-size", "32", "--lr", "1e-3", "--dropout", "0"],
    "mini-sinusoidal": [
        *["--config", "mini", "--batch-size", "32", "--lr", "1e-3", "--dropout", "0"],
        *["--position-init", "sinusoidal"],
    ],
}


def prepare(data_root: Path, out: Path) -> tuple[Path, Path]:
    paths = []
    for split in ("AA", "AB"):
        target = out / "data" / split
        if not (target / "meta.json").exists():
            subprocess.run(
                [
                    *[sys.executable, "-m", "bertkit.cli", "prepare"],
                    str(data_root / "corpus" / "wikipedia_2015" / split),
                    *["--vocab", str(data_root / "vocab" / "bert-base-uncased")],
                    *["--out", str(target), "--overwrite"],
                ],
                check=True,
            )
        paths.append(target)
    return paths[0], paths[1]


def command(name: str, flags: list[str], args, train: Path, held_out: Path) -> list[str]:
    return [
        *[sys.executable, "-m", "bertkit.cli", "pretrain", "--data", str(train)],
        *["--eval-data", str(held_out), "--out", str(args.out / name)],
        *["--budget", f"{args.minutes}m", "--warmup-fraction", str(args.warmup_fraction)],
        *["--eval-every", str(args.eval_every), "--eval-batches", str(args.eval_batches)],
        *["--save-every", "100", "--log-every", "10", "--seed", str(args.seed), "--resume"],
        *flags,
    ]


def finished(directory: Path, minutes: float) -> bool:
    evals = read_evals(directory)
    return bool(evals) and evals[-1].get("seconds", 0.0) >= 60 * minutes


def read_evals(directory: Path) -> list[dict]:
    log = directory / "log.jsonl"
    if not log.exists():
        return []
    entries = []
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("split") == "eval":
            entries.append(entry)
    return entries


def run_rows(names: list[str], args, train: Path, held_out: Path) -> None:
    pending = [n for n in names if not finished(args.out / n, args.minutes)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for start in range(0, len(pending), args.parallel):
        group = pending[start : start + args.parallel]
        procs = []
        for name in group:
            (args.out / name).mkdir(parents=True, exist_ok=True)
            log = open(args.out / f"{name}.out", "a")
            cmd = command(name, ROWS[name], args, train, held_out)
            print("running", name, ":", " ".join(cmd[3:]), flush=True)
            procs.append((name, subprocess.Popen(cmd, stdout=log, stderr=log, env=env), log))
        for name, proc, log in procs:
            if proc.wait() != 0:
                raise SystemExit(f"row {name} failed: see {args.out / name}.out")
            log.close()


def summarise(names: list[str], args) -> list[dict]:
    rows = []
    for name in names:
        evals = read_evals(args.out / name)
        if not evals:
            continue
        last = evals[-1]
        rows.append(
            {
                "row": name,
                "flags": " ".join(ROWS[name]),
                "minutes": args.minutes,
                "mlm_accuracy": last["mlm_accuracy"],
                "mlm_loss": last["mlm_loss"],
                "mlm_perplexity": last["mlm_perplexity"],
                "mlm_accuracy_801010": last.get("mlm_accuracy_801010"),
                "nsp_accuracy": last.get("nsp_accuracy"),
                "tokens": last.get("tokens"),
                "steps": last["step"],
                "curve": [
                    {k: e.get(k) for k in ("step", "seconds", "tokens", "mlm_accuracy", "mlm_loss")}
                    for e in evals
                ],
            }
        )
    rows.sort(key=lambda r: -r["mlm_accuracy"])
    return rows


def plot(rows: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for row in rows:
        minutes = [p["seconds"] / 60 for p in row["curve"]]
        left.plot(minutes, [100 * p["mlm_accuracy"] for p in row["curve"]], "o-", label=row["row"])
        right.plot(minutes, [p["mlm_loss"] for p in row["curve"]], "o-", label=row["row"])
    left.axhline(4.9, color="grey", linestyle=":", linewidth=1)
    left.text(0, 5.2, 'always ","', color="grey", fontsize=8)
    left.set(
        title="held-out MLM accuracy (every chosen piece [MASK])",
        xlabel="training CPU-minutes (one core)",
        ylabel="%",
    )
    right.set(title="held-out MLM loss", xlabel="training CPU-minutes (one core)", ylabel="nats")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/recipe"))
    parser.add_argument("--data", type=Path, default=os.environ.get("BERTKIT_DATA"))
    parser.add_argument("--rows", nargs="+", choices=sorted(ROWS), default=list(ROWS))
    parser.add_argument("--minutes", type=float, default=10.0, help="budget per row (one core)")
    parser.add_argument("--parallel", type=int, default=2, help="rows side by side")
    parser.add_argument("--warmup-fraction", type=float, default=0.1)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-batches", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.data is None:
        raise SystemExit("give --data or set BERTKIT_DATA (../shared/data)")
    train, held_out = prepare(Path(args.data), args.out)
    run_rows(args.rows, args, train, held_out)
    rows = summarise(args.rows, args)
    (args.out / "sweep.json").write_text(json.dumps(rows, indent=1))
    plot(rows, args.out / "sweep.png")
    print("| row | flags | MLM acc (all [MASK]) | MLM loss | ppl | 80/10/10 acc | NSP | tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['row']} | `{r['flags']}` | {100 * r['mlm_accuracy']:.2f}% | {r['mlm_loss']:.3f}"
            f" | {r['mlm_perplexity']:.0f} | {100 * (r['mlm_accuracy_801010'] or 0):.2f}% |"
            f" {100 * (r['nsp_accuracy'] or 0):.1f}% | {r['tokens']:,} |"
        )
    print(f"wrote {args.out / 'sweep.json'} and {args.out / 'sweep.png'}")


if __name__ == "__main__":
    main()
