"""Held-out figures of pre-training runs against the tokens they have seen: NSP and MLM accuracy
of one run (the long laptop run: does NSP rise above chance?), or a figure of several runs side
by side (Table 6: model sizes at equal tokens; a run trained again against its first time, whose
evaluations `--json` kept).

    python benchmarks/long_run_curve.py runs/long/laptop/log.jsonl \\
        --out docs/results/findings/long_run.png --json docs/results/findings/long_run.json
    python benchmarks/long_run_curve.py tiny=runs/target/local10m/log.jsonl \\
        mini=runs/table6/mini/log.jsonl --metric mlm_loss --out docs/results/findings/sizes.png
    python benchmarks/long_run_curve.py first=docs/results/findings/long_run.json \
        again=runs/long/laptop/log.jsonl --metric mlm_accuracy --out again.png
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
from _args import arguments

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bertkit.viz import read_log

LABELS = {
    "nsp_accuracy": "NSP accuracy, %",
    "mlm_accuracy": "MLM accuracy (every chosen piece [MASK]), %",
    "mlm_loss": "MLM loss (every chosen piece [MASK]), nats",
}


def evaluations(log: Path) -> list[dict]:
    """A run's held-out evaluations: from its log.jsonl, or from a `--json` file this script
    wrote (what stays of a run whose folder is gone)."""
    entries = json.loads(log.read_text()) if log.suffix == ".json" else read_log(log)
    evals = [e for e in entries if e.get("split") == "eval"]
    if not evals:
        raise SystemExit(f"{log}: no evaluation entries")
    return evals


def one_run(log: Path, out: Path, baseline: float) -> None:
    evals = evaluations(log)
    tokens = [e["tokens"] / 1e6 for e in evals]
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    ax.plot(tokens, [100 * e["nsp_accuracy"] for e in evals], "o-", ms=3, label="NSP accuracy")
    ax.plot(
        tokens,
        [100 * e["mlm_accuracy"] for e in evals],
        "s-",
        ms=3,
        label="MLM accuracy (every chosen piece [MASK])",
    )
    ax.axhline(50, color="grey", linestyle=":", linewidth=1, label="NSP chance (50%)")
    ax.axhline(
        100 * baseline, color="tab:blue", linestyle="--", linewidth=1,
        label=f"NSP word-overlap baseline ({100 * baseline:.1f}%)",
    )  # fmt: skip
    ax.axhline(70, color="tab:red", linestyle=":", linewidth=1, label="NSP target (70%)")
    ax.set(
        xlabel="tokens seen (millions)",
        ylabel="held-out accuracy, %",
        title=f"{log.parent.name}: held-out NSP and MLM accuracy",
        ylim=(0, 100),
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center right", ncols=2)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def several_runs(runs: dict[str, Path], metric: str, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    scale = 100 if metric.endswith("accuracy") else 1
    for name, log in runs.items():
        evals = evaluations(log)
        ax.plot(
            [e["tokens"] / 1e6 for e in evals],
            [scale * e[metric] for e in evals],
            "o-",
            ms=3,
            label=name,
        )
    label = LABELS.get(metric, metric)
    ax.set(  # the legend names the runs: the title and label stay short enough to fit
        xlabel="tokens seen (millions)",
        ylabel="held-out " + label.replace(" (", "\n(", 1),
        title=f"held-out {label.split(' (')[0].split(',')[0]} by tokens seen",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("logs", nargs="+", help="LOG, or NAME=LOG for several runs")
    parser.add_argument("--metric", default="mlm_loss", help="several runs: the figure to plot")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--json", type=Path, help="one run: also write its evaluations here")
    parser.add_argument(
        "--baseline", type=float, default=0.749, help="NSP word-overlap baseline (dashed)"
    )
    args = parser.parse_args()
    if len(args.logs) == 1 and "=" not in args.logs[0]:
        log = Path(args.logs[0])
        one_run(log, args.out, args.baseline)
        evals = evaluations(log)
        if args.json:
            args.json.write_text(json.dumps(evals, indent=1) + "\n")
        last = evals[-1]
        print(
            f"wrote {args.out}: {len(evals)} evaluations; last at step {last['step']}, "
            f"{last['tokens'] / 1e6:.1f}M tokens, {last['seconds']:.0f} s: NSP "
            f"{100 * last['nsp_accuracy']:.1f}%, MLM {100 * last['mlm_accuracy']:.1f}% "
            f"(loss {last['mlm_loss']:.3f})"
        )
        return
    runs = {}
    for item in args.logs:
        name, _, path = item.partition("=")
        runs[name if path else Path(name).parent.name] = Path(path or name)
    several_runs(runs, args.metric, args.out)
    for name, log in runs.items():
        last = evaluations(log)[-1]
        print(
            f"{name}: step {last['step']}, {last['tokens'] / 1e6:.1f}M tokens: "
            f"{args.metric} {last[args.metric]:.4f}"
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
