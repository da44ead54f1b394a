"""Table and picture of pre-training runs against the held-out measure: how far each got past the
unigram plateau per token seen.

    python benchmarks/plateau_runs.py --runs runs/sweep --names t_lr1e3_d0 t_sink \
        --out docs/results/recipe --unigram-loss 7.292

For each run directory (a `bertkit pretrain` output with held-out evaluations in log.jsonl):
the last evaluation's all-[MASK] MLM accuracy and loss, 80/10/10 accuracy, NSP accuracy, steps and
tokens seen; the flags from the run folder's run.json when present. Writes OUT/runs.json, OUT/plateau.png
(accuracy and loss against tokens seen) and prints a Markdown table. Logs written before the loop
logged `tokens` get them by replaying the run's data stream (same shards, seed and batch size,
so the same batches).
"""

from __future__ import annotations

import json
from pathlib import Path

from _args import arguments

from bertkit.core.tokenizer import BertTokenizer
from bertkit.pretraining.dataset import PretrainingData
from bertkit.pretraining.shards import Shards
from bertkit.viz import read_log


def replayed_tokens(data: Path, batch_size: int, seq_len: int, steps: int, seed: int) -> list[int]:
    """Cumulative real tokens after each step of a run's stream."""
    stream = PretrainingData(
        Shards(data),
        BertTokenizer.from_pretrained(data),
        batch_size=batch_size,
        seq_len=seq_len,
        seed=seed,
    )
    total, out = 0, []
    for _ in range(steps):
        total += int(stream.next_batch()["attention_mask"].sum())
        out.append(total)
    return out


def summarise(directory: Path, data: Path) -> dict | None:
    entries = read_log(directory / "log.jsonl") if (directory / "log.jsonl").exists() else []
    evals = [e for e in entries if e.get("split") == "eval"]
    if not evals:
        return None
    state = (
        json.loads((directory / "run.json").read_text())
        if (directory / "run.json").exists()
        else {}
    )
    if any("tokens" not in e for e in evals):
        batch, seq_len = state["batch_size"], state.get("seq_len", 128)
        cumulative = replayed_tokens(data, batch, seq_len, evals[-1]["step"], state.get("seed", 0))
        for e in evals:
            e["tokens"] = cumulative[e["step"] - 1]
    last = evals[-1]
    return {
        "run": directory.name,
        "flags": state.get("flags", ""),
        "steps": last["step"],
        "tokens": last["tokens"],
        "mlm_accuracy": last["mlm_accuracy"],
        "mlm_loss": last["mlm_loss"],
        "mlm_accuracy_801010": last.get("mlm_accuracy_801010"),
        "nsp_accuracy": last.get("nsp_accuracy"),
        "curve": [
            {k: e.get(k) for k in ("step", "tokens", "mlm_accuracy", "mlm_loss", "nsp_accuracy")}
            for e in evals
        ],
    }


def plot(rows: list[dict], png: Path, unigram_loss: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    colours = plt.get_cmap("tab20")
    for number, row in enumerate(rows):
        style = {"color": colours(number % 20), "marker": "o", "ms": 3}
        millions = [p["tokens"] / 1e6 for p in row["curve"]]
        axes[0].plot(millions, [100 * p["mlm_accuracy"] for p in row["curve"]], **style)
        axes[1].plot(millions, [p["mlm_loss"] for p in row["curve"]], label=row["run"], **style)
        nsp = [p["nsp_accuracy"] for p in row["curve"]]
        if all(v is not None for v in nsp):
            axes[2].plot(millions, [100 * v for v in nsp], **style)
    if unigram_loss is not None:
        axes[1].axhline(
            unigram_loss, color="grey", linestyle=":", linewidth=1.5, label="unigram (counted)"
        )
    axes[2].axhline(50, color="grey", linestyle=":", linewidth=1)
    axes[0].set(title="held-out MLM accuracy, every chosen piece [MASK]", ylabel="%")
    lowest = min(p["mlm_loss"] for row in rows for p in row["curve"])
    # the plateau's band, widened downwards for runs that leave it (their first points stay off)
    axes[1].set(
        title="held-out MLM loss (all [MASK])", ylabel="nats", ylim=(min(7.1, lowest - 0.1), 7.8)
    )
    axes[2].set(title="held-out NSP accuracy", ylabel="%")
    for ax in axes:
        ax.set_xlabel("tokens seen (millions)")
        ax.grid(alpha=0.3)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(
        handles, labels, fontsize=7, loc="center right"
    )  # beside the panels: no curve hidden
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--runs", type=Path, required=True, help="folder holding the runs")
    parser.add_argument("--names", nargs="+", required=True)
    parser.add_argument("--data", type=Path, default=Path("runs/data/AA"), help="their shards")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--unigram-loss", type=float, help="drawn as a reference line")
    args = parser.parse_args()
    rows = [r for n in args.names if (r := summarise(args.runs / n, args.data)) is not None]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs.json").write_text(json.dumps(rows, indent=1))
    plot(rows, args.out / "plateau.png", args.unigram_loss)
    print("| run | flags | steps | tokens | MLM acc (all [MASK]) | MLM loss | 80/10/10 acc | NSP |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        nsp = f"{100 * r['nsp_accuracy']:.1f}%" if r["nsp_accuracy"] is not None else "-"
        print(
            f"| {r['run']} | `{r['flags']}` | {r['steps']} | {r['tokens'] / 1e6:.2f}M | "
            f"{100 * r['mlm_accuracy']:.2f}% | {r['mlm_loss']:.3f} | "
            f"{100 * (r['mlm_accuracy_801010'] or 0):.1f}% | {nsp} |"
        )
    print(f"wrote {args.out / 'runs.json'} and {args.out / 'plateau.png'}")


if __name__ == "__main__":
    main()
