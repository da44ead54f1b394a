"""Fine-tuning all-MiniLM-L6-v2 on the paper's tasks: bertkit against Hugging Face transformers.

    BERTKIT_DATA=../shared/data python benchmarks/finetune_vs_hf.py --tasks mrpc rte stsb cola \\
        sst2 conll2003 squad1 --seeds 3 --out runs/finetune_bench [--resume] [--parallel]

Both sides run `bertkit.finetuning.runs.finetune_seeds` with the paper's default hyperparameters on the
same features, batches, seeds, optimiser, schedule and (parity mode) dropout masks; only the
model differs: bertkit's head class, or transformers' class of the same name started from the same initial weights
(the encoder from the checkpoint, the head from bertkit's seeded initialisation). So the dev
figures compare the two implementations' numerics, and the wall-clock ratio their speed.
SQuAD 1.1 trains and evaluates on the two article halves of the shared dev-v1.1.json (only the
dev file is available here). OUT/results.json and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from _args import DATA, arguments, minilm
from _harness import TransformersHead
from task_data import task_data

from bertkit.finetuning.runs import finetune_seeds
from bertkit.finetuning.train import FinetuneConfig, build_model
from bertkit.tasks.squad import split_by_article


def build_transformers(task, model, seed):
    return TransformersHead(build_model(task, model, seed))


def main() -> None:
    parser = arguments(__doc__, model=True)
    parser.add_argument("--tasks", nargs="+", default=["mrpc", "rte", "stsb", "cola"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default="runs/finetune_bench")
    parser.add_argument("--max-train-examples", type=int)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--implementations", nargs="+", default=["bertkit", "transformers"])
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the seeds already finished in OUT, continue a killed one",
    )
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="run the implementations side by side, one process each with an equal share of the "
        "cores: the same conditions for both, and more throughput than one after the other",
    )
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    root = DATA
    model = args.model
    if model is None:
        model = minilm()
    out = Path(args.out)
    results_file = out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    threads = args.threads or torch.get_num_threads()
    for task in args.tasks:
        if args.parallel:
            threads = side_by_side(task, args)
        else:
            for name in args.implementations:
                run(task, name, model, root, out, args)
        if args.child:
            continue
        for name in args.implementations:
            result = json.loads((out / task / name / "results.json").read_text())
            results.setdefault(task, {})[name] = {
                k: result[k] for k in ("dev", "dev_std", "dev_min", "dev_max", "seconds", "runs")
            }
        if {"bertkit", "transformers"} <= set(results[task]):
            ours, theirs = results[task]["bertkit"], results[task]["transformers"]
            results[task]["time_ratio"] = round(theirs["seconds"] / ours["seconds"], 3)
        results[task]["threads"] = threads
        results[task]["parallel"] = args.parallel
        out.mkdir(parents=True, exist_ok=True)
        results_file.write_text(json.dumps(results, indent=2) + "\n")
    if not args.child:
        print(table(results))


def run(task: str, name: str, model, root: Path, out: Path, args) -> None:
    """K seeds of one implementation; OUT/TASK/NAME/results.json."""
    if task == "squad1":
        data = Path(tempfile.mkdtemp(prefix="squad_split_"))
        split_by_article(root / "squad" / "dev-v1.1.json", data)
    else:
        data = task_data(root, task)
    config = FinetuneConfig(
        max_train_examples=args.max_train_examples,
        epochs=args.epochs,
        progress=False,
        resume=args.resume,
        parity=True,  # transformers' dropout masks: the two runs compare run for run
    )
    build = build_transformers if name == "transformers" else None
    result = finetune_seeds(task, model, data, out / task / name, config, args.seeds, build)
    print(task, name, json.dumps(result["dev"]), f"{result['seconds']:.0f} s", flush=True)


def side_by_side(task: str, args) -> int:
    """One child process per implementation, started together, each with its share of cores
    (returned: the threads each child had)."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // len(args.implementations))
    common = [sys.executable, __file__, "--child", "--tasks", task, "--seeds", str(args.seeds)]
    common += ["--out", args.out, "--threads", str(threads)]
    for flag in ("model", "max_train_examples", "epochs"):
        if getattr(args, flag) is not None:
            common += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    if args.resume:
        common.append("--resume")
    children = [
        subprocess.Popen([*common, "--implementations", name]) for name in args.implementations
    ]
    failed = [c.args[-1] for c in children if c.wait() != 0]
    if failed:
        raise SystemExit(f"{task}: {', '.join(failed)} failed")
    return threads


def table(results: dict) -> str:
    lines = [
        "| task | metric | bertkit mean ± std | transformers mean ± std | Δ | time ratio |",
        "|---|---|---|---|---|---|",
    ]
    for task, sides in results.items():
        ours = sides.get("bertkit")
        if ours is None:
            continue
        theirs = sides.get("transformers", {})
        for metric, value in ours["dev"].items():
            if metric.endswith(("total", "thresh")) or "_" in metric and metric != "exact_match":
                continue
            scale = 1 if task.startswith("squad") else 100
            cell = f"{scale * value:.2f} ± {scale * ours['dev_std'][metric]:.2f}"
            other = delta = ""
            if theirs:
                other = (
                    f"{scale * theirs['dev'][metric]:.2f} ± {scale * theirs['dev_std'][metric]:.2f}"
                )
                delta = f"{scale * (value - theirs['dev'][metric]):+.2f}"
            ratio = sides.get("time_ratio", "")
            lines.append(f"| {task} | {metric} | {cell} | {other} | {delta} | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
