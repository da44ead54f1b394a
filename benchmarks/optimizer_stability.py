"""Fine-tuning stability, BertAdam vs AdamW (Mosbach et al., ICLR 2021): many
seeds of each setting on small GLUE tasks, with the spread and the count of failed runs (dev score
at or below the majority-class baseline).

    BERTKIT_DATA=../shared/data python benchmarks/optimizer_stability.py --model MODEL \
        --out runs/stability --tasks rte mrpc --seeds 10 \
        --settings bertadam:3 adamw:3 adamw:10

A setting is OPTIMIZER:EPOCHS (`bertkit finetune --optimizer … --epochs …`); everything else is
the paper's (lr 5e-5 unless --lr, batch 32, 10% warm-up). Resumable (finished seeds are kept);
OUT/stability.json after every run; OUT/stability.png: every seed's dev score as a strip per
task and setting, with the majority baseline as a line. The score is the task's main score (the
mean of its metrics: RTE accuracy, MRPC mean of accuracy and F1).
"""

from __future__ import annotations

import json
import os
import statistics
import textwrap
from collections import Counter
from pathlib import Path

from _args import arguments
from task_data import task_data

from bertkit.finetuning.runs import finetune_seeds
from bertkit.finetuning.train import FinetuneConfig, main_score
from bertkit.tasks import get_task


def majority_baseline(task_name: str, data: Path) -> float:
    """The main score of always predicting the most frequent training label on dev."""
    task = get_task(task_name)
    train = task.read(data, "train")
    dev = task.read(data, task.dev_splits()[0])
    common = Counter(e.label for e in train).most_common(1)[0][0]
    return main_score(task, task.score(dev, [common] * len(dev)))


def parse_setting(text: str) -> tuple[str, int]:
    optimizer, _, epochs = text.partition(":")
    if optimizer not in ("adamw", "bertadam") or not epochs.isdigit() or int(epochs) < 1:
        raise SystemExit(f"--settings {text!r}: expected adamw:EPOCHS or bertadam:EPOCHS")
    return optimizer, int(epochs)


def summary(scores: list[float], baseline: float) -> dict:
    return {
        "mean": statistics.fmean(scores),
        "std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
        "min": min(scores),
        "max": max(scores),
        "failed": sum(s <= baseline for s in scores),
        "runs": len(scores),
    }


def plot(table: dict, png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(table)
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        entry = table[task]
        names = list(entry["scores"])
        for x, name in enumerate(names):
            scores = [100 * s for s in entry["scores"][name]]
            jitter = [x + 0.08 * ((i % 5) - 2) for i in range(len(scores))]
            ax.scatter(jitter, scores, s=18, alpha=0.8)
            if scores:
                ax.hlines(statistics.fmean(scores), x - 0.25, x + 0.25, color="black", lw=1.5)
        ax.axhline(100 * entry["baseline"], color="red", ls="--", lw=1, label="majority class")
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_title(f"{task} (dev, one dot per seed; bar: mean)", fontsize=9)
        ax.set_ylabel("dev score, %")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--model", required=True, help="pre-trained checkpoint directory")
    parser.add_argument("--label", help="the model's name in the picture (default: its folder)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", default=os.environ.get("BERTKIT_DATA"))
    parser.add_argument(
        "--tasks", nargs="+", default=["rte", "mrpc"], choices=["rte", "mrpc", "cola", "stsb"]
    )
    parser.add_argument("--settings", nargs="+", default=["bertadam:3", "adamw:3", "adamw:10"])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--max-train-examples", type=int, help="the first N (quick checks)")
    parser.add_argument(
        "--precision", default="auto", choices=["auto", "fp32", "bf16"],
        help="bf16: autocast (about twice as fast on CPUs with native bf16)",
    )  # fmt: skip
    args = parser.parse_args()
    if not args.data:
        raise SystemExit("give --data or set BERTKIT_DATA (../shared/data)")
    settings = [parse_setting(s) for s in args.settings]
    table: dict = {}
    rates: set[float] = set()  # what the runs used (the task's default where --lr is not given)
    args.out.mkdir(parents=True, exist_ok=True)
    for task in args.tasks:
        data = task_data(Path(args.data), task)
        baseline = majority_baseline(task, data)
        table[task] = {"baseline": baseline, "scores": {}, "summary": {}}
        for optimizer, epochs in settings:
            name = f"{optimizer}:{epochs}"
            config = FinetuneConfig(
                epochs=epochs,
                learning_rate=args.lr,
                seed=args.seed,
                optimizer=optimizer,
                resume=True,
                progress=False,
                max_train_examples=args.max_train_examples,
                precision=args.precision,
            )
            results = finetune_seeds(
                task,
                args.model,
                data,
                args.out / task / f"{optimizer}_{epochs}",
                config,
                args.seeds,
            )
            rates.add(results["hyperparameters"]["learning_rate"])
            scores = [main_score(get_task(task), run["dev"]) for run in results["runs"]]
            table[task]["scores"][name] = scores
            table[task]["summary"][name] = summary(scores, baseline)
            (args.out / "stability.json").write_text(
                json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "tasks": table},
                           indent=1)
            )  # fmt: skip
    title = (
        f"BertAdam vs AdamW (OPTIMIZER:EPOCHS), {args.label or Path(args.model).name}, "
        f"lr {rates.pop() if len(rates) == 1 else sorted(rates)}; "
        "score: the mean of the task's dev metrics"
    )
    plot(
        table,
        args.out / "stability.png",
        textwrap.fill(title, 45 * len(args.tasks), break_on_hyphens=False),
    )
    print("| task | setting | mean | std | min | max | failed (≤ majority) |")
    print("|---|---|---|---|---|---|---|")
    for task, entry in table.items():
        for name, s in entry["summary"].items():
            print(
                f"| {task} | {name} | {100 * s['mean']:.1f} | {100 * s['std']:.1f} | "
                f"{100 * s['min']:.1f} | {100 * s['max']:.1f} | {s['failed']}/{s['runs']} "
                f"(majority {100 * entry['baseline']:.1f}) |"
            )
    print(f"wrote {args.out / 'stability.json'} and {args.out / 'stability.png'}")


if __name__ == "__main__":
    main()
