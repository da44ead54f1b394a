"""Training a sentence-embedding model: `bertkit finetune sentence-embedding` against
sentence-transformers' own trainer, on the same pairs, model, batch, learning rate, warm-up,
epochs and loss (MultipleNegativesRankingLoss, scale 20, mean pooling, max length 128).

    BERTKIT_DATA=../shared/data python benchmarks/embeddings_vs_st.py --train-pairs 2000 \\
        --seeds 3 --out runs/emb_vs_st

The pairs: SQuAD v1.1 questions -> the paragraph that answers them (dev-v1.1.json, the one file
at hand: the first half of its articles to train on; from the other half one question per
paragraph, so that every validation positive is a different paragraph). Each side trains at
its default precision (bertkit's `--precision auto`: bf16 where the CPU has it natively;
sentence-transformers: fp32) and, for bertkit, also in fp32. Both are scored the same way, by
`retrieval_ranks` on their own vectors: each question's paragraph among all validation
paragraphs (recall@1, recall@10, MRR@10). Pairs a second: training pairs over the seconds of
training alone (bertkit: its log's training seconds; sentence-transformers: `trainer.train()`).
OUT/results.json and a markdown table on stdout; finished runs are kept (resumable). The
sentence-transformers side needs `accelerate` (its trainer's dependency: `pip install accelerate`).
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from _args import arguments, minilm
from machine import line as machine_line

from bertkit.stats import compare_to_baseline
from bertkit.tasks.sentence_embedding import retrieval_ranks

SIDES = ("bertkit", "bertkit-fp32", "sentence-transformers")


def squad_pairs(path: Path, train_pairs: int) -> tuple[list[dict], list[dict]]:
    articles = json.loads(path.read_text())["data"]
    half = len(articles) // 2
    train, dev = [], []
    for number, article in enumerate(articles):
        for paragraph in article["paragraphs"]:
            questions = [q["question"].strip() for q in paragraph["qas"]]
            context = paragraph["context"].strip()
            if number < half:
                train += [{"anchor": q, "positive": context} for q in questions]
            elif questions:
                dev.append({"anchor": questions[0], "positive": context})
    rng = np.random.default_rng(0)  # the same subset every run; anchors once each
    seen, unique = set(), []
    for i in rng.permutation(len(train)):
        if train[i]["anchor"] not in seen:
            seen.add(train[i]["anchor"])
            unique.append(train[i])
    return unique[:train_pairs], dev


def write_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["anchor", "positive"])
        writer.writeheader()
        writer.writerows(rows)
    return path


def figures(anchors: np.ndarray, positives: np.ndarray) -> dict[str, float]:
    ranks = retrieval_ranks(anchors, positives)
    return {"recall@1": float(np.mean(ranks == 0)), "recall@10": float(np.mean(ranks < 10)),
            "mrr@10": float(np.mean(np.where(ranks < 10, 1.0 / (ranks + 1), 0.0)))}  # fmt: skip


def run_bertkit(model, train_csv, dev_csv, dev, out: Path, seed: int, args, precision) -> dict:
    from bertkit import Embedder
    from bertkit.finetuning.train import FinetuneConfig, finetune
    from bertkit.tasks.own import DataConfig

    data = DataConfig(train=str(train_csv), validation=str(dev_csv), text_column="anchor",
                      text_pair_column="positive")  # fmt: skip
    config = FinetuneConfig(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
                            max_seq_length=128, seed=seed, precision=precision, progress=False,
                            overwrite=True)  # fmt: skip
    finetune("sentence-embedding", model, data, out, config)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    seconds = max(e["seconds"] for e in log if e.get("split") == "train")
    embed = Embedder(out, max_seq_length=128, precision="fp32")
    return {"seconds": seconds, "dev": figures(embed([r["anchor"] for r in dev]),
                                               embed([r["positive"] for r in dev]))}  # fmt: skip


def run_st(model, train, dev, out: Path, seed: int, args) -> dict:
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    torch.manual_seed(seed)
    st = SentenceTransformer(str(model), device="cpu")
    st.max_seq_length = 128
    training = SentenceTransformerTrainingArguments(
        output_dir=str(out), num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, warmup_ratio=0.1, seed=seed, save_strategy="no", report_to=[],
        logging_steps=10_000, use_cpu=True, dataloader_drop_last=False,
    )  # fmt: skip
    trainer = SentenceTransformerTrainer(
        model=st, args=training, train_dataset=Dataset.from_list(train),
        loss=MultipleNegativesRankingLoss(st, scale=20.0),
    )  # fmt: skip
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    vectors = [st.encode([r[k] for r in dev], batch_size=64, normalize_embeddings=True)
               for k in ("anchor", "positive")]  # fmt: skip
    return {"seconds": seconds, "dev": figures(*vectors)}


def main() -> None:
    parser = arguments(__doc__, data=True, model=True, out="runs/emb_vs_st")
    parser.add_argument("--train-pairs", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    args = parser.parse_args()
    model = args.model
    if model is None:
        model = minilm()
    machine = machine_line()
    print(machine, flush=True)
    train, dev = squad_pairs(Path(args.data) / "squad" / "dev-v1.1.json", args.train_pairs)
    args.out.mkdir(parents=True, exist_ok=True)
    train_csv, dev_csv = (
        write_csv(args.out / "train.csv", train),
        write_csv(args.out / "dev.csv", dev),
    )
    print(f"{len(train)} training pairs, {len(dev)} validation questions (distinct paragraphs)")
    results_file = args.out / "results.json"
    runs = json.loads(results_file.read_text()) if results_file.exists() else []
    done = {(r["seed"], r["side"]) for r in runs}
    for seed in range(42, 42 + args.seeds):
        order = args.sides[seed % len(args.sides) :] + args.sides[: seed % len(args.sides)]
        for side in order:
            if (seed, side) in done:
                continue
            folder = args.out / f"{side}_{seed}"
            if side == "sentence-transformers":
                run = run_st(model, train, dev, folder, seed, args)
            else:
                precision = "fp32" if side.endswith("fp32") else "auto"
                run = run_bertkit(model, train_csv, dev_csv, dev, folder, seed, args, precision)
            run |= {"seed": seed, "side": side, "pairs_per_s": round(len(train) / run["seconds"], 2),
                    "machine": machine}  # fmt: skip
            print(f"seed {seed} {side}: {run['seconds']:.0f} s, {run['pairs_per_s']} pairs/s, "
                  f"dev {run['dev']}", flush=True)  # fmt: skip
            runs.append(run)
            results_file.write_text(json.dumps(runs, indent=1) + "\n")
    print_table(runs)


def print_table(runs: list[dict]) -> None:
    sides = [s for s in SIDES if any(r["side"] == s for r in runs)]
    scores = {s: [100 * r["dev"]["mrr@10"] for r in runs if r["side"] == s] for s in sides}
    speed = {s: statistics.median(r["pairs_per_s"] for r in runs if r["side"] == s) for s in sides}
    reference = speed.get("sentence-transformers")
    compared = compare_to_baseline(scores, "sentence-transformers") if reference else {}
    print(
        "| side | pairs/s (median) | vs sentence-transformers | MRR@10 | recall@1 | Δ MRR@10 (95%) |"
    )
    print("|---|---|---|---|---|---|")
    for side in sides:
        recall = statistics.fmean(100 * r["dev"]["recall@1"] for r in runs if r["side"] == side)
        delta = compared.get(side, {}).get("vs_baseline")
        interval = (f"{delta['difference']:+.2f} [{delta['low']:+.2f}, {delta['high']:+.2f}]"
                    if delta else "—")  # fmt: skip
        ratio = f"{speed[side] / reference:.2f}×" if reference else "—"
        mean, std = (
            statistics.fmean(scores[side]),
            np.std(scores[side], ddof=1) if len(scores[side]) > 1 else 0.0,
        )
        print(f"| {side} | {speed[side]:.1f} | {ratio} | {mean:.2f} ± {std:.2f} ({len(scores[side])}) | "
              f"{recall:.2f} | {interval} |")  # fmt: skip


if __name__ == "__main__":
    main()
