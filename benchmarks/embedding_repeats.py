"""Training sentence embeddings on a pair file whose anchors repeat: every row (batches that
never hold a text twice) against the same file with the repeats dropped (each anchor's first
row), for one epoch and for as many steps as every row takes, scored on held-out retrieval.

    BERTKIT_DATA=../shared/data python benchmarks/embedding_repeats.py --paragraphs 480 \\
        --seeds 3 --out runs/emb_repeats

The file: SQuAD v1.1 paragraphs -> the questions asked of them (dev-v1.1.json's first half of
articles; `--paragraphs` of them, each with all its questions: a paragraph repeats as the
anchor of about five rows, as a news title does beside its descriptions). The score: every
question of the other half's articles, its paragraph ranked among all 1,019 of them (recall@1,
MRR@10), computed here from `Embedder` vectors, before any training too; and the same over
each paragraph's first question alone (which the dropped file keeps, so it flatters it). all-MiniLM-L6-v2, batch 32, lr 2e-5, one epoch, max length 128, precision auto.
OUT/results.json (resumable: finished runs are kept) and a markdown table on stdout.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
from _args import arguments, minilm
from embeddings_vs_st import write_csv
from machine import line as machine_line

from bertkit.stats import compare_to_baseline

SIDES = ("every row", "repeats dropped", "repeats dropped, equal steps")


def pairs(path: Path, paragraphs: int) -> tuple[list[dict], dict, list[dict]]:
    """The training rows; the held-out set: the other half's paragraphs and every question
    asked of them (with its paragraph's number); and a small validation set for the runs' own
    epoch choice: a question of each of 100 paragraphs of the first half that no training row
    holds (never a held-out question)."""
    articles = json.loads(path.read_text())["data"]
    half = len(articles) // 2
    train: list[list[dict]] = []
    heldout: dict = {"paragraphs": [], "questions": [], "of": []}
    for number, article in enumerate(articles):
        for paragraph in article["paragraphs"]:
            questions = [q["question"].strip() for q in paragraph["qas"]]
            context = paragraph["context"].strip()
            if number < half:
                train.append([{"anchor": context, "positive": q} for q in questions])
            elif questions:
                heldout["questions"] += questions
                heldout["of"] += [len(heldout["paragraphs"])] * len(questions)
                heldout["paragraphs"].append(context)
    order = np.random.default_rng(0).permutation(len(train))
    picked, unused = order[:paragraphs], order[paragraphs:]
    rows = [row for i in sorted(picked) for row in train[i]]
    watch = [{"anchor": train[i][0]["positive"], "positive": train[i][0]["anchor"]}
             for i in sorted(unused)[:100] if train[i]]  # fmt: skip
    return rows, heldout, watch


def run(model, train_csv: Path, watch_csv: Path, dev: list[dict], out: Path, seed: int,
        epochs: int = 1) -> dict:  # fmt: skip
    from bertkit import Embedder
    from bertkit.finetuning.train import FinetuneConfig, finetune
    from bertkit.tasks.own import DataConfig

    data = DataConfig(train=str(train_csv), validation=str(watch_csv), text_column="anchor",
                      text_pair_column="positive")  # fmt: skip
    config = FinetuneConfig(epochs=epochs, batch_size=32, learning_rate=2e-5, max_seq_length=128,
                            seed=seed, progress=False, overwrite=True)  # fmt: skip
    finetune("sentence-embedding", model, data, out, config)
    return score(Embedder(out, max_seq_length=128, precision="fp32"), dev)


def score(embed, heldout: dict) -> dict:
    """Each held-out question's paragraph ranked among all held-out paragraphs by cosine
    (ties count against it): recall@1, recall@10, MRR@10 over every question; and the same
    over each paragraph's first question alone (`first_`)."""
    questions, paragraphs = embed(heldout["questions"]), embed(heldout["paragraphs"])
    similarity = questions @ paragraphs.T
    of = np.asarray(heldout["of"])
    own = similarity[np.arange(len(of)), of][:, None]
    ranks = (similarity >= own).sum(1) - 1
    first = np.r_[True, of[1:] != of[:-1]]

    def figures(r: np.ndarray) -> dict[str, float]:
        return {"recall@1": float(np.mean(r == 0)), "recall@10": float(np.mean(r < 10)),
                "mrr@10": float(np.mean(np.where(r < 10, 1.0 / (r + 1), 0.0)))}  # fmt: skip

    return figures(ranks) | {f"first_{k}": v for k, v in figures(ranks[first]).items()}


def main() -> None:
    parser = arguments(__doc__, data=True, out="runs/emb_repeats")
    parser.add_argument("--paragraphs", type=int, default=480)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()

    from bertkit import Embedder

    model = minilm()
    machine = machine_line()
    print(machine, flush=True)
    rows, dev, watched = pairs(Path(args.data) / "squad" / "dev-v1.1.json", args.paragraphs)
    firsts = list({r["anchor"]: r for r in reversed(rows)}.values())[::-1]  # each anchor's first
    args.out.mkdir(parents=True, exist_ok=True)
    files = {"every row": write_csv(args.out / "every_row.csv", rows),
             "repeats dropped": write_csv(args.out / "repeats_dropped.csv", firsts)}  # fmt: skip
    watch = write_csv(args.out / "watch.csv", watched)  # the runs' own validation
    print(
        f"{len(rows)} rows ({len(firsts)} anchors); held out: {len(dev['questions'])} "
        f"questions of {len(dev['paragraphs'])} paragraphs",
        flush=True,
    )
    results_file = args.out / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {"runs": []}
    if "first_mrr@10" not in results.get("before", {}):
        results["before"] = score(Embedder(model, max_seq_length=128, precision="fp32"), dev)
    for entry in results["runs"]:  # runs scored before every question was: their models
        if "first_mrr@10" not in entry["dev"]:
            folder = (
                args.out / f"{entry['side'].replace(',', '').replace(' ', '_')}_{entry['seed']}"
            )
            entry["dev"] = score(Embedder(folder, max_seq_length=128, precision="fp32"), dev)
    print(f"before training: {results['before']}", flush=True)
    done = {(r["seed"], r["side"]) for r in results["runs"]}
    for seed in range(42, 42 + args.seeds):
        for side in SIDES[seed % 3 :] + SIDES[: seed % 3]:  # rotate which goes first
            if (seed, side) in done:
                continue
            folder = args.out / f"{side.replace(',', '').replace(' ', '_')}_{seed}"
            dropped = side.startswith("repeats dropped")
            epochs = round(len(rows) / len(firsts)) if side.endswith("equal steps") else 1
            figures_ = run(model, files["repeats dropped" if dropped else side], watch, dev,
                           folder, seed, epochs)  # fmt: skip
            results["runs"].append({"seed": seed, "side": side, "dev": figures_,
                                    "rows": len(rows) if side == "every row" else len(firsts),
                                    "epochs": epochs,
                                    "machine": machine})  # fmt: skip
            print(f"seed {seed} {side}: {figures_}", flush=True)
            results_file.write_text(json.dumps(results, indent=1) + "\n")
    for prefix, what in (
        ("", "every held-out question"),
        ("first_", "each paragraph's first question"),
    ):
        table(results, prefix, what)


def table(results: dict, prefix: str, what: str) -> None:
    scores = {s: [100 * r["dev"][f"{prefix}mrr@10"] for r in results["runs"] if r["side"] == s]
              for s in SIDES}  # fmt: skip
    compared = compare_to_baseline(scores, "repeats dropped")
    print(f"\n{what}\n")
    print(
        "| training file | rows × epochs | MRR@10 | recall@1 | Δ MRR@10 vs repeats dropped (95%) |"
    )
    print("|---|---|---|---|---|")
    before = results["before"]
    print(f"| before training | — | {100 * before[f'{prefix}mrr@10']:.2f} | "
          f"{100 * before[f'{prefix}recall@1']:.2f} | — |")  # fmt: skip
    for side in SIDES:
        runs = [r for r in results["runs"] if r["side"] == side]
        recall = statistics.fmean(100 * r["dev"][f"{prefix}recall@1"] for r in runs)
        spread = np.std(scores[side], ddof=1) if len(runs) > 1 else 0.0
        delta = compared.get(side, {}).get("vs_baseline")
        interval = (f"{delta['difference']:+.2f} [{delta['low']:+.2f}, {delta['high']:+.2f}]"
                    if delta else "—")  # fmt: skip
        print(f"| {side} | {runs[0]['rows']:,} × {runs[0].get('epochs', 1)} | {statistics.fmean(scores[side]):.2f} ± "
              f"{spread:.2f} ({len(runs)}) | {recall:.2f} | {interval} |")  # fmt: skip


if __name__ == "__main__":
    main()
