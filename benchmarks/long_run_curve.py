"""Held-out NSP and MLM accuracy of a pre-training run against the tokens it has seen (the long
laptop run: does NSP rise above chance, and where does masked LM go?).

    python benchmarks/long_run_curve.py runs/long/laptop/log.jsonl \
        --out docs/results/findings/long_run.png --json docs/results/findings/long_run.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bertkit.viz import read_log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--json", type=Path, help="also write the evaluation entries here")
    parser.add_argument(
        "--baseline", type=float, default=0.749, help="NSP word-overlap baseline (dashed)"
    )
    args = parser.parse_args()
    evals = [e for e in read_log(args.log) if e.get("split") == "eval"]
    if not evals:
        raise SystemExit(f"{args.log}: no evaluation entries")
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
        100 * args.baseline, color="tab:blue", linestyle="--", linewidth=1,
        label=f"NSP word-overlap baseline ({100 * args.baseline:.1f}%)",
    )  # fmt: skip
    ax.axhline(70, color="tab:red", linestyle=":", linewidth=1, label="NSP target (70%)")
    ax.set(
        xlabel="tokens seen (millions)",
        ylabel="held-out accuracy, %",
        title=f"{args.log.parent.name}: held-out NSP and MLM accuracy",
        ylim=(0, 100),
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", ncols=2)
    fig.tight_layout()
    fig.savefig(args.out)
    plt.close(fig)
    if args.json:
        args.json.write_text(json.dumps(evals, indent=1) + "\n")
    last = evals[-1]
    print(
        f"wrote {args.out}: {len(evals)} evaluations; last at step {last['step']}, "
        f"{last['tokens'] / 1e6:.1f}M tokens, {last['seconds']:.0f} s: NSP "
        f"{100 * last['nsp_accuracy']:.1f}%, MLM {100 * last['mlm_accuracy']:.1f}% "
        f"(loss {last['mlm_loss']:.3f})"
    )


if __name__ == "__main__":
    main()
