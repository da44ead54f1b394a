"""The paper's central claim on this machine: does pre-training help every task? Fine-tunes each
pre-trained checkpoint and a randomly initialised model of the same size and vocabulary on the
paper's small tasks with several seeds, and reports mean, std and the 95% confidence interval
(Welch) of each row's difference to random init.

    BERTKIT_DATA=../shared/data python benchmarks/paper_findings.py --out runs/findings \
        --checkpoint laptop10m=runs/target/laptop10m --random-init tiny \
        --tasks sst2 mrpc stsb rte cola conll2003 --seeds 5 --lr 1e-4

Rows: every `--checkpoint NAME=DIR` (a `bertkit pretrain` output) and `random` (`--random-init
SIZE` with the first checkpoint's vocabulary: `bertkit finetune --config SIZE --vocab DIR`, each
seed its own initialisation). Tasks read the official files under $BERTKIT_DATA (GLUE dev sets;
CoNLL-2003 valid). Resumable: every finished seed is kept (`--resume` of `finetune`), and
OUT/findings.json is rewritten after every task of every row. OUT/findings.png: bars of the
mean main score per task and row with 95% confidence intervals of the mean.

Several `--lr` values make a grid, as the paper's fine-tuning does: every row and task is
fine-tuned at each rate (OUT/NAME/TASK/lr_RATE) and reported at the rate whose mean score on the
selection set is best for that row and task (findings.json keeps every rate's scores under "grid"
and the choice under "lr"). With `--validation-split F` (the protocol's: 0.1) the
selection set is a fraction of each task's training examples carved out (the same examples for
every row, rate and seed), which also picks each run's epoch; the official dev set is then the
test, scored once per run by the chosen model and touched by no choice. Without it (the protocol
of the first findings) rates and epochs are chosen on the dev set that is reported.
Every row fine-tunes at `--dropout` (0.1, the paper's), whatever its checkpoint's config says.
Several `--dropout` values join the grid (OUT/NAME/TASK/lr_RATE_dropout_D): each row and task is
reported at its best (rate, dropout) pair on the selection set, kept under "lr" and "dropout". A
checkpoint pre-trained without dropout (the laptop recipe) may fine-tune best without it too, and
the protocol's study found the gap larger than the rate grid's, so the protocol chooses it like the rate.
The table adds Holm's correction over all the row-vs-random comparisons it reports. `--random-init`
also takes a checkpoint's config.json: random init of that architecture (pre-LN, GLU).
`--report A/findings.json B/findings.json --out DIR` redraws one table and picture from finished
studies, training nothing: tasks run apart, or rows run apart (a model pre-trained later joins
finished rows under the same protocol; a different grid is an error). OUT/report.json keeps the
merged table, its comparisons and Holm's correction.

`--baseline NAME` compares every row with that row instead of random init (Table 6: the sizes
against BERT-tiny). `--pool NAME=A,B,C` (with `--report`) makes one row of several rows, each at
its own chosen point: a model pre-trained with several seeds. The pooled row holds one value per
pre-training seed, the mean of its fine-tuning seeds: its fine-tuning runs are not independent
draws of the model (they share one pre-training), so the interval counts pre-training seeds:

    python benchmarks/paper_findings.py --out docs/results/findings/table6_protocol \
        --report runs/findings_10m_dgrid/findings.json runs/findings_10m_dgrid_sst2/findings.json \
        --pool tiny=p0,p1,p2 --baseline tiny

`--bilstm NAME…`: those rows are fine-tuned with Table 5's "+ BiLSTM" (a randomly initialised
BiLSTM between encoder and output) and run only on the tasks that head exists for (tagging and
span tasks); give the same folder twice to have a checkpoint with and without it:
`--checkpoint ltr=runs/table5/ltr --checkpoint ltr_bilstm=runs/table5/ltr --bilstm ltr_bilstm`.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import statistics
from pathlib import Path

from _args import arguments
from task_data import task_data

from bertkit.finetuning.runs import finetune_seeds
from bertkit.finetuning.train import FinetuneConfig, main_score, random_init_dir
from bertkit.stats import compare_to_baseline, holm, t_ppf
from bertkit.tasks import get_task


def grid_points(args) -> list[tuple[float, float]]:
    """Every (rate, dropout) pair of the grid, rates outermost."""
    return list(itertools.product(args.lr, args.dropout))


def point_dir(lr: float, dropout: float, args) -> str:
    """A grid point's folder under OUT/NAME/TASK ("" for a single point): the layout of studies
    without a dropout grid (lr_RATE) is kept, so they resume."""
    parts = [f"lr_{lr:g}"] if len(args.lr) > 1 or len(args.dropout) > 1 else []
    return "_".join(parts + ([f"dropout_{dropout:g}"] if len(args.dropout) > 1 else []))


def point_key(lr: float, dropout: float, args) -> str:
    """A grid point's key in findings.json's "grid": the rate (as before), and the dropout when
    it is part of the grid."""
    return f"{lr:g}" + (f", dropout {dropout:g}" if len(args.dropout) > 1 else "")


def run_row(
    name: str, model: Path, random: bool, task: str, point: tuple[float, float], args
) -> tuple[list[float], list[float]]:
    """(the seeds' scores on the selection set, their scores to report): the carved validation
    set and the dev set with --validation-split; the dev set twice without."""
    lr, dropout = point
    config = FinetuneConfig(
        dropout=dropout,
        validation_split=args.validation_split,
        bilstm=name in args.bilstm,
        epochs=args.epochs,
        learning_rate=lr,
        batch_size=args.batch_size,
        seed=args.seed,
        resume=True,
        progress=False,
        random_init=random,
        max_train_examples=args.max_train_examples,
    )
    out = args.out / name / task / point_dir(lr, dropout, args)
    if args.finished_only:
        results = finished_runs(out, lr, dropout, args)
    else:
        data = task_data(Path(args.data), task)
        results = finetune_seeds(task, model, data, out, config, args.seeds)
    task_obj = get_task(task)
    chosen_on = [main_score(task_obj, run["dev"]) for run in results["runs"]]
    reported = "test" if args.validation_split else "dev"
    return chosen_on, [main_score(task_obj, run[reported]) for run in results["runs"]]


def finished_runs(out: Path, lr: float, dropout: float, args) -> dict:
    """`--finished-only`: the runs of a grid point that finished (OUT/seed_S/results.json),
    training nothing: a study cut short (its model gone with the machine that trained it)
    reports what it has, each point over the seeds that finished."""
    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        file = out / f"seed_{seed}" / "results.json"
        if not file.exists():
            continue
        run = json.loads(file.read_text())
        settings = run["hyperparameters"]
        if (settings["learning_rate"], settings["dropout"]) != (lr, dropout):
            raise SystemExit(f"{file}: lr {settings['learning_rate']}, dropout "
                             f"{settings['dropout']}, not this point's {lr:g}, {dropout:g}")  # fmt: skip
        runs.append(run)
    print(f"{out}: {len(runs)} of {args.seeds} seeds finished")
    return {"runs": runs}


def has_bilstm(task: str) -> bool:
    try:
        get_task(task).head_class(bilstm=True)
    except ValueError:
        return False
    return True


def mean_interval(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    return t_ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5


def corrected(table: dict) -> dict[str, dict]:
    """Holm's correction over every row-vs-baseline interval of the table ("TASK/ROW" keys): how
    many would clear zero by chance is what it guards against (at 95%, one in twenty)."""
    p_values = {
        f"{task}/{name}": comparison["vs_baseline"]["p_value"]
        for task, entry in table.items()
        for name, comparison in entry.get("comparison", {}).items()
        if comparison.get("vs_baseline")
    }
    return holm(p_values) if p_values else {}


def plot(
    table: dict,
    png: Path,
    rates: list[float],
    carved: bool,
    labels: dict[str, str],
    dropout: float | list[float] | None = None,  # fine-tuning dropout(s); older files: not kept
    baseline: str = "random",
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(table)
    rows = list(dict.fromkeys(row for entry in table.values() for row in entry["scores"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(tasks)), 4.2))
    width = 0.8 / max(len(rows), 1)
    for number, row in enumerate(rows):
        scores = [table[t]["scores"].get(row) for t in tasks]  # None: the row skips that task
        means = [100 * statistics.fmean(s) if s else float("nan") for s in scores]
        errors = [100 * mean_interval(s) if s else 0.0 for s in scores]
        positions = [i + (number - (len(rows) - 1) / 2) * width for i in range(len(tasks))]
        ax.bar(positions, means, width, yerr=errors, capsize=3, label=labels.get(row, row))
    ax.set_xticks(range(len(tasks)), tasks)
    counts = sorted({len(s) for entry in table.values() for s in entry["scores"].values() if s})
    seeds = f"{counts[0]}–{counts[-1]}" if len(counts) > 1 else counts[0]  # a set: sorted, distinct
    versus = "pre-trained vs random init" if baseline == "random" else f"each row vs {baseline}"
    title = f"{versus}\n(bars: 95% interval of the mean over {seeds} seeds)"
    dropouts = dropout if isinstance(dropout, list) else [dropout]
    chosen = "a validation set carved from train" if carved else "the dev set shown"
    if len(rates) > 1 or len(dropouts) > 1:
        best = [f"rate of {', '.join(map(str, rates))}"] if len(rates) > 1 else []
        if len(dropouts) > 1:
            best.append(f"dropout of {', '.join(f'{d:g}' for d in dropouts)}")
        title += f"\neach row and task at its best {' and '.join(best)}"
        title += f"\nchosen on {chosen}"
    if len(dropouts) == 1 and dropouts[0] is not None:
        title += f"; fine-tuning dropout {dropouts[0]:g}, every row"
    ax.set_ylabel("official dev score, %\n(mean of the task's metrics)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    # below the axes: inside, a legend of long row names covers bars whatever the corner
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(len(rows), 2))
    fig.tight_layout()
    fig.savefig(png, dpi=100, bbox_inches="tight")
    plt.close(fig)


def _setting(value):
    """A list or number of findings.json's settings (older files kept them as Python text)."""
    return ast.literal_eval(value) if isinstance(value, str) else value


def row_labels(settings: dict) -> dict[str, str]:
    """Legend names that say what each row is: the checkpoint folder, or the random init's size."""
    labels = {}
    for item in _setting(settings.get("checkpoint") or []):
        name, _, directory = item.partition("=")
        labels[name] = f"{name}: pre-trained, {directory}"
    size = settings.get("random_init")
    if size not in (None, "None"):
        config = Path(str(size))  # a preset name, or a checkpoint's config.json
        what = f"{config.parent}'s architecture" if config.suffix == ".json" else size
        labels["random"] = f"random: no pre-training, {what}"
    return labels


def print_table(table: dict, rows: list[str], baseline: str = "random") -> None:
    print("| task | " + " | ".join(rows) + f" | Δ vs {baseline} (95% CI) |")
    print("|---|" + "---|" * (len(rows) + 1))
    for task, entry in table.items():
        cells = []
        for name in rows:
            s = entry["scores"].get(name)
            if s is None:
                cells.append("—")
                continue
            std = statistics.stdev(s) if len(s) > 1 else 0.0
            # a pooled row has no one choice: each of its rows chose its own
            chosen = [f"lr {entry['lr'][name]:g}"] if name in entry.get("lr", {}) else []
            if name in entry.get("dropout", {}):
                chosen.append(f"dropout {entry['dropout'][name]:g}")
            rate = f" ({', '.join(chosen)})" if chosen else ""
            cells.append(f"{100 * statistics.fmean(s):.1f} ± {100 * std:.1f}{rate}")
        deltas = []
        for name, comparison in entry.get("comparison", {}).items():
            interval = comparison.get("vs_baseline")
            if interval:
                deltas.append(
                    f"{name}: {100 * interval['difference']:+.1f} "
                    f"[{100 * interval['low']:+.1f}, {100 * interval['high']:+.1f}]"
                )
        print(f"| {task} | " + " | ".join(cells) + f" | {'; '.join(deltas)} |")
    holm_table = corrected(table)
    if holm_table:
        kept = [k for k, v in holm_table.items() if v["rejected"]]
        print(
            f"{len(holm_table)} comparisons (about {0.05 * len(holm_table):.1f} would clear zero at "
            f"95% by chance); after Holm's correction {len(kept)} still do: {', '.join(kept) or '—'}"
        )


def pool_rows(table: dict, labels: dict[str, str], name: str, members: list[str]) -> None:
    """Replace `members` by one row `name` holding each member's mean score, task by task (each
    member at its own chosen point); a task that lacks every member gets no pooled row."""
    for task, entry in table.items():
        scores = entry["scores"]
        missing = [m for m in members if m not in scores]
        if len(missing) < len(members) and missing:
            raise SystemExit(f"--pool {name}: {task} has no row {', '.join(missing)}")
        if not missing:
            pooled = [statistics.fmean(scores.pop(member)) for member in members]
            entry["scores"] = {name: pooled, **scores}
    # the legend names the members' folders: runs/recipe_seeds/seed0, seed1, seed2
    folders = [labels.pop(m, m).rpartition(", ")[2] for m in members]
    common = os.path.dirname(os.path.commonprefix(folders))
    short = [folders[0]] + [f[len(common) + 1 :] if common else f for f in folders[1:]]
    labels[name] = f"{name}: the means of {len(members)} pre-training seeds, {', '.join(short)}"


def merge_task(entry: dict, found: dict, task: str, file: Path) -> None:
    """Add one file's rows of `task` to the table's `entry` (studies of the same tasks with
    different rows: a row pre-trained later joins the finished ones); a row twice is an error."""
    twice = set(entry["scores"]) & set(found["scores"])
    if twice:
        raise SystemExit(
            f"--report: {file} has {task} rows already read: {', '.join(sorted(twice))}"
        )
    for key in ("scores", "grid", "lr", "dropout"):
        if key in found:
            entry.setdefault(key, {}).update(found[key])


def report(
    files: list[Path], out: Path, baseline: str = "random", pools: dict | None = None
) -> None:
    """One table and picture (OUT/findings.png) from finished studies' findings.json files with
    the same rows (e.g. the GLUE tasks and a CoNLL-2003 run done apart), without training; the
    comparisons are made again against `baseline`, after `pools` (NAME: member rows) join."""
    table: dict = {}
    labels: dict[str, str] = {}
    protocols: dict[tuple, list[str]] = {}
    for file in files:
        found = json.loads(file.read_text())
        for task, entry in found["tasks"].items():
            merge_task(table.setdefault(task, {"scores": {}}), entry, task, file)
        labels.update(row_labels(found["settings"]))
        rates = _setting(found["settings"]["lr"])
        carved = bool(_setting(found["settings"].get("validation_split")))
        dropout = _setting(found["settings"].get("dropout"))  # None: older files kept none
        key = (tuple(rates), carved, str(dropout), _setting(found["settings"].get("epochs")))
        protocols.setdefault(key, []).append(str(file))
    if len(protocols) > 1:  # rows chosen over different grids are not one table
        raise SystemExit(
            "--report: the files were fine-tuned under different protocols (rates, carved "
            "validation, dropout, epochs): "
            + "; ".join(f"{k} in {', '.join(v)}" for k, v in protocols.items())
        )
    for name, members in (pools or {}).items():
        pool_rows(table, labels, name, members)
    if not any(baseline in entry["scores"] for entry in table.values()) and baseline != "random":
        raise SystemExit(f"--baseline {baseline}: no such row in {', '.join(map(str, files))}")
    for entry in table.values():
        entry.pop("comparison", None)
        if baseline in entry["scores"]:
            entry["comparison"] = compare_to_baseline(entry["scores"], baseline)
    out.mkdir(parents=True, exist_ok=True)
    plot(table, out / "findings.png", rates, carved, labels, dropout, baseline)
    merged = {"sources": [str(f) for f in files], "baseline": baseline, "pools": pools or {}}
    merged.update(labels=labels, tasks=table, holm=corrected(table))
    (out / "report.json").write_text(json.dumps(merged, indent=1) + "\n")
    rows = list(dict.fromkeys(r for e in table.values() for r in e["scores"]))
    print_table(table, rows, baseline)
    print(f"wrote {out / 'findings.png'} and {out / 'report.json'}")


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", default=os.environ.get("BERTKIT_DATA"))
    parser.add_argument("--checkpoint", action="append", default=[], help="NAME=DIR (repeat)")
    parser.add_argument("--random-init", help="size of the random-init row (e.g. tiny)")
    parser.add_argument("--tasks", nargs="+", default=["sst2", "mrpc", "stsb", "rte", "cola"])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--lr", type=float, nargs="+", default=[1e-4], help="one rate, or a grid (the best per row)"
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--dropout",
        type=float,
        nargs="+",
        default=[0.1],
        help="fine-tuning dropout of every row; several join the grid (the best per row)",
    )
    parser.add_argument(
        "--validation-split",
        type=float,
        help="choose rates and epochs on this fraction of the training examples; report dev as test",
    )
    parser.add_argument("--max-train-examples", type=int, help="the first N of each task")
    parser.add_argument(
        "--bilstm", nargs="+", default=[], metavar="NAME", help="rows fine-tuned + BiLSTM"
    )
    parser.add_argument(
        "--report", nargs="+", type=Path, metavar="JSON", help="redraw from findings.json files"
    )
    parser.add_argument("--baseline", default="random", help="the row every other is compared to")
    parser.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="NAME=A,B,...",
        help="with --report: one row of several rows' scores (a model's pre-training seeds)",
    )
    parser.add_argument(
        "--finished-only",
        action="store_true",
        help="train nothing: each grid point over its seeds that finished (a study cut short)",
    )
    args = parser.parse_args()
    pools = {}
    for item in args.pool:
        name, _, members = item.partition("=")
        if not members or not args.report:
            raise SystemExit(f"--pool {item!r}: expected NAME=A,B,... with --report")
        pools[name] = members.split(",")
    if args.report:
        report(args.report, args.out, args.baseline, pools)
        return
    if not args.data:
        raise SystemExit("give --data or set BERTKIT_DATA (../shared/data)")
    checkpoints = {}
    for item in args.checkpoint:
        name, _, directory = item.partition("=")
        if not directory:
            raise SystemExit(f"--checkpoint {item!r}: expected NAME=DIR")
        checkpoints[name] = Path(directory)
    rows: dict[str, tuple[Path, bool]] = {n: (d, False) for n, d in checkpoints.items()}
    if set(args.bilstm) - set(checkpoints):
        raise SystemExit(f"--bilstm {sorted(set(args.bilstm) - set(checkpoints))}: no such row")
    if args.baseline not in {*checkpoints, "random"}:
        raise SystemExit(f"--baseline {args.baseline}: no such row (give it as a --checkpoint)")
    if args.random_init:
        if not checkpoints:
            raise SystemExit("--random-init takes its vocabulary from a --checkpoint")
        vocab = next(iter(checkpoints.values()))
        init = random_init_dir(args.random_init, vocab, args.out / "random" / "init")
        rows["random"] = (init, True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    table: dict = {}
    points = grid_points(args)
    for task in args.tasks:
        table[task] = {"scores": {}}
        if len(points) > 1:
            table[task].update(grid={}, lr={})
            if len(args.dropout) > 1:
                table[task]["dropout"] = {}
        for name, (model, random) in rows.items():
            if name in args.bilstm and not has_bilstm(task):
                continue
            grid = {point: run_row(name, model, random, task, point, args) for point in points}
            grid = {point: scores for point, scores in grid.items() if scores[0]}  # none finished
            if not grid:
                continue
            best = max(grid, key=lambda point: statistics.fmean(grid[point][0]))
            table[task]["scores"][name] = grid[best][1]
            if len(points) > 1:
                table[task]["grid"][name] = {
                    point_key(*point, args): {"selection": chosen_on, "reported": reported}
                    for point, (chosen_on, reported) in grid.items()
                }
                table[task]["lr"][name] = best[0]
                if len(args.dropout) > 1:
                    table[task]["dropout"][name] = best[1]
            if args.baseline in table[task]["scores"]:
                table[task]["comparison"] = compare_to_baseline(
                    table[task]["scores"], args.baseline
                )
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "findings.json").write_text(
                json.dumps(
                    {"settings": settings, "tasks": table, "holm": corrected(table)}, indent=1
                )
            )
    plot(
        table,
        args.out / "findings.png",
        args.lr,
        bool(args.validation_split),
        row_labels(settings),
        args.dropout,
        args.baseline,
    )
    print_table(table, list(rows), args.baseline)
    print(f"wrote {args.out / 'findings.json'} and {args.out / 'findings.png'}")


if __name__ == "__main__":
    main()
