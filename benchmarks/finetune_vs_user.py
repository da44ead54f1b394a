"""Fine-tuning end to end against what a user would run instead: `bertkit finetune` and a plain
transformers loop as transformers' documentation teaches it, on the same task, model, epochs,
learning rate, batch size and seed; wall clock from the start (tokenizer and model loading
included) to the last dev score.

    BERTKIT_DATA=../shared/data python benchmarks/finetune_vs_user.py \\
        --tasks mrpc rte stsb cola sst2 conll2003 --seeds 1 --out runs/finetune_user

The transformers side: `BertTokenizerFast` and `BertForSequenceClassification` /
`BertForTokenClassification` from the model folder; AdamW over the paper's decay groups (no decay
on biases and LayerNorm weights, eps 1e-6); a linear warm-up over 10% of the steps, then linear
decay (`get_linear_schedule_with_warmup`); batches in random order padded to their longest
(`DataCollatorWithPadding`, `DataCollatorForTokenClassification`); gradients clipped at 1; the dev
set scored after every epoch. Both sides report their last epoch's dev figures (`finetune`'s
"dev" is its best epoch's). CoNLL-2003 labels each word's first piece (-100 elsewhere) and
truncates at 128 pieces, as the token-classification tutorial does. Both sides read the examples
with bertkit's task readers and are scored with the same official metrics; which side goes first
alternates by task and seed. OUT/results.json and a markdown table on stdout.

`--sides` adds mixed precision on either side: `bertkit-bf16` is `bertkit finetune --precision
bf16` (bf16 autocast, fp32 master weights), `transformers-bf16` the same loop under
`torch.autocast("cpu", torch.bfloat16)` (what `TrainingArguments(bf16=True)` does on a CPU). The
ratios are against the plain fp32 transformers loop; the sides' order rotates by task and seed.
`bertkit-bf16-random` is `bertkit-bf16` with random batches (`--bucket-batches 1`) instead of
length-bucketed ones: what bucketing does to the dev scores. `bertkit-parity` is `bertkit
finetune --parity`: dropout masks drawn as transformers draws them (slower on CPUs), against
the default's parallel draws: what the default's other random numbers do to the dev scores;
`bertkit-parity-random` both: masks drawn as transformers draws them and random batches (bertkit's
own batch order and head initialisation still, so not the user loop's numbers, run for run).
`bertkit-random-normal-head` and `bertkit-random-google-head`: random batches, and the new head
drawn as transformers draws it (a plain normal, std `initializer_range`: `--head-init normal`,
the default since 2026-11-27) or as Google's run_classifier.py does (truncated at 2 std: `--head-init
truncated-normal`, the default before); `transformers-google-head`: the user's loop with its new
head drawn again from Google's truncated normal. The dev score column is the mean ±
the standard deviation over seeds of the task's main score; Δ: Welch's 95% interval of the
difference of the means to the fp32 transformers loop, or to `--baseline` (with two seeds or more
on both sides).
"""

from __future__ import annotations

import json
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from _args import arguments, minilm
from machine import line as machine_line
from task_data import task_data

from bertkit.core.model import truncated_normal_
from bertkit.finetuning.train import FinetuneConfig, finetune, main_score
from bertkit.stats import compare_to_baseline, summary
from bertkit.tasks import get_task
from bertkit.tasks.ner import ConllTask, to_iob2

NO_DECAY = ("bias", "LayerNorm.weight")


SIDES = ("bertkit", "transformers", "bertkit-bf16", "transformers-bf16", "bertkit-bf16-random",
         "bertkit-random", "bertkit-parity", "bertkit-parity-random",
         "bertkit-random-normal-head", "bertkit-random-google-head",
         "transformers-google-head")  # fmt: skip


def transformers_user(
    task_name: str,
    model_dir: str,
    data: Path,
    sizes,
    seed: int,
    limit: int | None = None,
    bf16: bool = False,
    google_head: bool = False,
) -> dict:
    """The loop a transformers user writes; returns the last epoch's dev figures. `google_head`:
    the new head's weights drawn again as bertkit draws them (Google's truncated normal)."""
    import transformers

    task = get_task(task_name)
    torch.manual_seed(seed)
    tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
    train, dev = task.read(data, "train")[:limit], task.read(data, "dev")
    tagging = isinstance(task, ConllTask)
    labels = task.labels()
    if tagging:
        model = transformers.BertForTokenClassification.from_pretrained(
            model_dir, num_labels=len(labels)
        )
        collator = transformers.DataCollatorForTokenClassification(tokenizer)
        train_rows = _tagged(tokenizer, train, labels, sizes.max_seq_length)
        dev_rows = _tagged(tokenizer, dev, labels, sizes.max_seq_length)
    else:
        regression = task.regression
        model = transformers.BertForSequenceClassification.from_pretrained(
            model_dir, num_labels=1 if regression else len(labels)
        )
        collator = transformers.DataCollatorWithPadding(tokenizer)
        train_rows = _sentences(tokenizer, train, labels, regression, sizes.max_seq_length)
        dev_rows = _sentences(tokenizer, dev, labels, regression, sizes.max_seq_length)
    if google_head:
        truncated_normal_(model.classifier.weight, model.config.initializer_range)
    return user_training(
        model, collator, train_rows, sizes, seed, bf16,
        lambda: _score(task, model, collator, dev, dev_rows, labels, tagging),
    )  # fmt: skip


def user_training(
    model, collator, train_rows, sizes, seed: int, bf16: bool, evaluate, plan=None, reseed=None
) -> dict:
    """The training loop transformers' documentation teaches: AdamW over the decay groups,
    linear warm-up over 10% of the steps then decay, random batches padded to their longest,
    gradients clipped at 1; `evaluate()` after every epoch. Returns the last epoch's figures.
    `plan`: each step's row indices instead of a shuffling DataLoader (every epoch the same);
    `reseed`: torch's generator seeded with reseed + step before each step's forward
    (benchmarks/loops_run_for_run.py)."""
    import transformers

    autocast = partial(torch.autocast, "cpu", dtype=torch.bfloat16, enabled=bf16)
    groups = [
        {"params": [p for n, p in model.named_parameters() if not n.endswith(NO_DECAY)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if n.endswith(NO_DECAY)],
         "weight_decay": 0.0},
    ]  # fmt: skip
    optimizer = torch.optim.AdamW(groups, lr=sizes.learning_rate, eps=1e-6)
    if plan is None:
        loader = torch.utils.data.DataLoader(
            train_rows,
            batch_size=sizes.batch_size,
            shuffle=True,
            collate_fn=collator,
            generator=torch.Generator().manual_seed(seed),
        )
    else:
        loader = [collator([train_rows[i] for i in indices]) for indices in plan]
    steps = len(loader) * sizes.epochs
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, int(0.1 * steps), steps)
    figures: dict = {}
    step = 0
    for _ in range(sizes.epochs):
        model.train()
        for batch in loader:
            if reseed is not None:
                torch.manual_seed(reseed + step)
            step += 1
            with autocast():
                loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
        with autocast(), torch.no_grad():
            model.eval()
            figures = evaluate()
    return figures


def _sentences(tokenizer, examples, labels, regression, max_length) -> list[dict]:
    pairs = examples[0].text_b is not None
    encoded = tokenizer(
        [e.text_a for e in examples],
        [e.text_b for e in examples] if pairs else None,
        truncation=True,
        max_length=max_length,
    )
    ids = {name: i for i, name in enumerate(labels)}
    return [
        {**{k: v[i] for k, v in encoded.items()},
         "labels": float(e.label) if regression else ids[e.label]}
        for i, e in enumerate(examples)
    ]  # fmt: skip


def _tagged(tokenizer, sentences, labels, max_length) -> list[dict]:
    encoded = tokenizer(
        [list(s.words) for s in sentences],
        is_split_into_words=True,
        truncation=True,
        max_length=max_length,
    )
    ids = {name: i for i, name in enumerate(labels)}
    rows = []
    for i, sentence in enumerate(sentences):
        tags = to_iob2(sentence.tags)
        words, previous, row_labels = encoded.word_ids(i), None, []
        for word in words:
            first = word is not None and word != previous
            row_labels.append(ids[tags[word]] if first else -100)
            previous = word
        rows.append({**{k: v[i] for k, v in encoded.items()}, "labels": row_labels})
    return rows


@torch.no_grad()
def _score(task, model, collator, examples, rows, labels, tagging) -> dict:
    model.eval()
    outputs = []
    for start in range(0, len(rows), 64):
        batch = collator(rows[start : start + 64])
        batch.pop("labels")
        logits = model(**batch).logits
        if tagging:
            outputs += [row for row in logits.argmax(-1)]
        else:
            outputs += list(logits.float().numpy())
    if tagging:
        predictions = []
        for i, (sentence, best) in enumerate(zip(examples, outputs, strict=True)):
            row = rows[i]["labels"]
            firsts = [best[k].item() for k, label in enumerate(row) if label != -100]
            tags = [labels[t] for t in firsts] + ["O"] * (len(sentence.words) - len(firsts))
            predictions.append(tags)
    elif task.regression:
        predictions = [float(o[0]) for o in outputs]
    else:
        predictions = [labels[int(np.argmax(o))] for o in outputs]
    return task.score(examples, predictions)


def last_epoch(run: dict) -> dict:
    """The dev figures of a `finetune` run's last epoch (its "dev" is the best epoch's): the
    user's loop reports its last epoch, so both sides are scored alike."""
    return {k: run["epochs"][-1][k] for k in run["dev"]}


def main() -> None:
    parser = arguments(__doc__, data=True, model=True, out="runs/finetune_user")
    parser.add_argument("--tasks", nargs="+", default=["mrpc", "rte", "stsb", "cola"])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--epochs", type=int, help="default: the paper's (3)")
    parser.add_argument("--max-train-examples", type=int, help="the first N (quick checks)")
    parser.add_argument(
        "--sides", nargs="+", choices=SIDES, default=["bertkit", "transformers"],
        help="what runs (default: both in fp32; -bf16: bf16 autocast; -random: random batches)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", choices=SIDES, default="transformers",
        help="the side the Δ column compares with (speed-ups are always against transformers)",
    )  # fmt: skip
    args = parser.parse_args()
    model = args.model
    if model is None:
        model = minilm()
    machine = machine_line()  # beside every time: CPU, its vector extensions, threads
    print(machine, flush=True)
    results_file = args.out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    turn = 0
    for task_name in args.tasks:
        task = get_task(task_name)
        config = FinetuneConfig(
            epochs=args.epochs,
            progress=False,
            overwrite=True,
            max_train_examples=args.max_train_examples,
        ).resolved(task)
        data = task_data(Path(args.data), task_name)
        entry = results.setdefault(task_name, {"runs": []})
        done = {(r["seed"], r["side"]) for r in entry["runs"]}
        for seed in range(args.seed, args.seed + args.seeds):
            shift = turn % len(args.sides)
            sides = args.sides[shift:] + args.sides[:shift]
            turn += 1
            for side in sides:
                if (seed, side) in done:
                    continue
                started = time.perf_counter()
                bf16 = "-bf16" in side
                if side.startswith("bertkit"):
                    precision = "bf16" if bf16 else "fp32"
                    bucket = 1 if "-random" in side else config.bucket_batches
                    head = {"-normal-head": "normal", "-google-head": "truncated-normal"}
                    head_init = next((v for k, v in head.items() if k in side), config.head_init)
                    run = finetune(
                        task_name,
                        model,
                        data,
                        args.out / task_name / f"{side}_{seed}",
                        FinetuneConfig(
                            **{**vars(config), "seed": seed, "precision": precision,
                               "bucket_batches": bucket, "parity": "-parity" in side,
                               "head_init": head_init}
                        ),
                    )  # fmt: skip
                    figures = last_epoch(run)
                else:
                    figures = transformers_user(
                        task_name, model, data, config.sizes(), seed, args.max_train_examples,
                        bf16, google_head="-google-head" in side,
                    )  # fmt: skip
                seconds = time.perf_counter() - started
                entry["runs"].append(
                    {"seed": seed, "side": side, "seconds": round(seconds, 1),
                     "dev": figures, "score": main_score(task, figures), "machine": machine}
                )  # fmt: skip
                print(f"{task_name} seed {seed} {side}: {seconds:.0f} s, dev {figures}", flush=True)
                args.out.mkdir(parents=True, exist_ok=True)
                results_file.write_text(json.dumps(results, indent=1) + "\n")
    print_table(results, args.baseline)


def print_table(results: dict, baseline: str) -> None:
    """The markdown table: per task and side, median seconds, speed-up against the fp32
    transformers loop (— without one), mean ± std of the main score, and Welch's interval
    against `baseline` (— where it has no runs, or fewer than two seeds on a side)."""
    print(
        "| task | side | seconds (median) | speed-up vs transformers fp32 | dev score | "
        f"Δ vs {baseline} (95% interval) |"
    )
    print("|---|---|---|---|---|---|")
    for task_name, entry in results.items():
        by = {side: [r for r in entry["runs"] if r["side"] == side] for side in SIDES}
        reference = (
            statistics.median(r["seconds"] for r in by["transformers"])
            if by["transformers"]
            else None
        )
        scores = {side: [100 * r["score"] for r in runs] for side, runs in by.items() if runs}
        if not scores:
            continue
        compared = (
            compare_to_baseline(scores, baseline)
            if baseline in scores  # else no Δ column
            else {side: {"summary": summary(values)} for side, values in scores.items()}
        )
        for side, row in compared.items():
            seconds = statistics.median(r["seconds"] for r in by[side])
            speedup = f"{reference / seconds:.2f}×" if reference else "—"
            n, mean, std = row["summary"]["n"], row["summary"]["mean"], row["summary"]["std"]
            delta = row.get("vs_baseline")
            interval = (
                f"{delta['difference']:+.2f} [{delta['low']:+.2f}, {delta['high']:+.2f}]"
                if delta
                else "—"
            )
            spread = f" ± {std:.2f}" if n > 1 else ""
            print(
                f"| {task_name} | {side} | {seconds:.0f} | {speedup} | "
                f"{mean:.2f}{spread} ({n} seed{'s' if n > 1 else ''}) | {interval} |"
            )


if __name__ == "__main__":
    main()
